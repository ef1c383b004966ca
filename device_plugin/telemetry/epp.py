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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from device_plugin.watchdog.watchdog import Snapshot

METRIC = "DCGM_FI_DEV_GPU_UTIL"


def epp_samples(snap: Snapshot) -> dict[tuple[str, str, str, str], float]:
    """(pod, namespace, gpu index, UUID) -> saturation 0-100."""
    out: dict[tuple[str, str, str, str], float] = {}
    for st in snap.slices:
        s = st.slice
        key = (s.id.pod, s.id.namespace, str(s.gpu_index), s.id.uuid)
        out[key] = max(out.get(key, 0.0), st.saturation)
    return out


class EppCollector(Collector):
    def __init__(self, source: Callable[[], Snapshot]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            METRIC,
            "Slice saturation 0-100 (kube-vgpu EPP feed; not the whole GPU)",
            labels=["pod", "namespace", "gpu", "UUID"],
        )
        for labels, value in sorted(epp_samples(self.source()).items()):
            fam.add_metric(list(labels), value)
        yield fam


def epp_registry(source: Callable[[], Snapshot], registry: CollectorRegistry | None = None) -> CollectorRegistry:
    registry = registry or CollectorRegistry()
    registry.register(EppCollector(source))
    return registry
