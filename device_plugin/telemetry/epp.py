"""The EPP feed: `DCGM_FI_DEV_GPU_UTIL{pod, namespace, gpu, UUID}` = each slice's saturation on 0-100.

llm-d's `dcgm-data-source` scrapes this endpoint (node address, our port) and its `dcgm-extractor` reads
only DCGM_FI_DEV_GPU_UTIL: it keeps the samples whose `pod` label equals the endpoint's pod name (and any
sample WITHOUT a pod label), takes the max, divides by 100 and stores `GPUUtilization`. Hence:
- every sample carries `pod` (a pod-less sample would count against every endpoint on the node),
- one sample per (pod, GPU): containers of one pod sharing a GPU are folded with max, like the extractor,
- it must be a gauge (the extractor rejects other types),
- it is served on its own port, never mixed with the node exporter or dcgm-exporter's 9400.
The extractor matches on the pod name only; two same-named pods of different namespaces on one node would
merge, which the `namespace` label lets a human see.

Every slice-holding pod the daemon knows is reported, 0 when idle: the router's endpoint-attribute scorer
gives an endpoint WITHOUT a value score 0 -- the same as a fully saturated one -- and the extractor never
clears a value that drops out of the feed (it errors and keeps the old one). A slice whose GPU could not be
read this cycle keeps the value it was last served with (0 if it never had one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from device_plugin.watchdog.slices import Slice
from device_plugin.watchdog.watchdog import Snapshot

METRIC = "DCGM_FI_DEV_GPU_UTIL"
FEED_LABELS = ("pod", "namespace", "gpu", "UUID")
SampleKey = tuple[str, str, str, str]


def _key(s: Slice) -> SampleKey:
    return (s.id.pod, s.id.namespace, str(s.gpu_index), s.id.uuid)


def epp_samples(snap: Snapshot, last: Mapping[SampleKey, float] | None = None) -> dict[SampleKey, float]:
    """(pod, namespace, gpu index, UUID) -> saturation 0-100, for every held slice: observed this cycle, else
    `last` (what was served before), else 0."""
    observed: dict[SampleKey, float] = {}
    for st in snap.slices:
        key = _key(st.slice)
        observed[key] = max(observed.get(key, 0.0), st.saturation)
    out: dict[SampleKey, float] = {}
    for s in snap.held:
        key = _key(s)
        out[key] = observed.get(key, (last or {}).get(key, 0.0))
    for key, value in observed.items():  # a snapshot built without `held` (tests, older callers)
        out.setdefault(key, value)
    return out


class EppCollector(Collector):
    def __init__(self, source: Callable[[], Snapshot]) -> None:
        self.source = source
        self.last: dict[SampleKey, float] = {}

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            METRIC,
            "Slice saturation 0-100 (kube-vgpu EPP feed; not the whole GPU)",
            labels=list(FEED_LABELS),
        )
        samples = epp_samples(self.source(), self.last)
        self.last = samples
        for labels, value in sorted(samples.items()):
            fam.add_metric(list(labels), value)
        yield fam


def epp_registry(source: Callable[[], Snapshot], registry: CollectorRegistry | None = None) -> CollectorRegistry:
    registry = registry or CollectorRegistry()
    registry.register(EppCollector(source))
    return registry
