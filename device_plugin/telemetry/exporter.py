"""Prometheus collector of the node: per physical GPU and per slice, from the watchdog's latest snapshot.

Base units (bytes, ratios 0-1), a `vgpu_` prefix and DCGM's label keys (`gpu`, `UUID`, `modelName`,
`Hostname`, `namespace`, `pod`, `container`) plus `role`, so panels join with the extender's allocation
view (`vgpu_gpu_*`, same GPU labels) and with dcgm-exporter. Names: `vgpu_node_gpu_*` is what the node
observes of a physical GPU, `vgpu_slice_*` one container's share of one GPU, `vgpu_watchdog_*` the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from device_plugin.watchdog.slices import Slice, SliceId
from device_plugin.watchdog.watchdog import Snapshot

GPU_LABELS = ["Hostname", "gpu", "UUID", "modelName"]
SLICE_LABELS = [*GPU_LABELS, "namespace", "pod", "container", "role"]


def _gpu(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*GPU_LABELS, *extra])


def _slice_gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*SLICE_LABELS, *extra])


class NodeCollector(Collector):
    """Reads `source()` (the watchdog's snapshot) at scrape time."""

    def __init__(self, source: Callable[[], Snapshot]) -> None:
        self.source = source
        self.models: dict[str, str] = {}  # GPU uuid -> model, from the snapshot being collected

    def _slice_labels(self, node: str, s: Slice) -> list[str]:
        sid = s.id
        model = self.models.get(sid.uuid, "")
        return [node, str(s.gpu_index), sid.uuid, model, sid.namespace, sid.pod, sid.container, s.role]

    def collect(self) -> Iterator[Metric]:
        snap = self.source()
        node = snap.node
        self.models = {g.device.uuid: g.device.model for g in snap.gpus}
        yield from self._gpus(snap)
        yield from self._slices(snap)
        slices: dict[SliceId, Slice] = {st.slice.id: st.slice for st in snap.slices}
        violations = CounterMetricFamily(
            "vgpu_slice_violations", "Violations started, by kind (memory, sm)", labels=[*SLICE_LABELS, "kind"]
        )
        for (sid, kind), n in sorted(snap.violations.items()):
            if sid in slices:
                violations.add_metric([*self._slice_labels(node, slices[sid]), kind], n)
        actions = CounterMetricFamily(
            "vgpu_slice_enforcement_actions",
            "Enforcement ladder actions by step (event, annotate, evict) and outcome (done, dry-run, blocked, failed, skipped)",
            labels=[*SLICE_LABELS, "step", "outcome"],
        )
        for (sid, step, outcome), n in sorted(snap.actions.items()):
            if sid in slices:
                actions.add_metric([*self._slice_labels(node, slices[sid]), step, outcome], n)
        yield violations
        yield actions
        yield from self._loop(snap)

    def _gpus(self, snap: Snapshot) -> Iterator[Metric]:
        total = _gpu("vgpu_node_gpu_memory_total_bytes", "GPU memory (NVML)")
        used = _gpu("vgpu_node_gpu_memory_used_bytes", "GPU memory in use (NVML)")
        util = _gpu("vgpu_node_gpu_utilization_ratio", "GPU busy ratio 0-1 (nvmlDeviceGetUtilizationRates.gpu)")
        sharers = _gpu("vgpu_node_gpu_sharers", "Slices held on the GPU by pods of this node")
        healthy = _gpu("vgpu_node_gpu_healthy", "1 if the GPU is healthy (XID/probe health and readable)")
        roles = _gpu("vgpu_node_gpu_role_slices", "Slices on the GPU by role", ("role",))
        foreign = _gpu(
            "vgpu_node_gpu_unattributed_memory_bytes", "GPU memory held by processes in no slice (host, other pods)"
        )
        for g in snap.gpus:
            d = g.device
            lv = [snap.node, str(d.index), d.uuid, d.model]
            total.add_metric(lv, g.memory_total)
            used.add_metric(lv, g.memory_used)
            util.add_metric(lv, g.utilization / 100.0)
            sharers.add_metric(lv, g.sharers)
            healthy.add_metric(lv, 1.0 if g.healthy else 0.0)
            foreign.add_metric(lv, g.unattributed_memory)
            for role, n in g.roles:
                roles.add_metric([*lv, role], n)
        yield from (total, used, util, sharers, healthy, roles, foreign)

    def _slices(self, snap: Snapshot) -> Iterator[Metric]:
        limit = _slice_gauge("vgpu_slice_memory_limit_bytes", "GPU memory of the slice (assignment)")
        used = _slice_gauge("vgpu_slice_memory_used_bytes", "GPU memory held by the slice's processes")
        quota = _slice_gauge("vgpu_slice_cores_quota_ratio", "SM quota of the slice, 0-1 of the GPU (0: best effort)")
        sm = _slice_gauge("vgpu_slice_sm_used_ratio", "SM use of the slice's processes, 0-1 of the GPU")
        sat = _slice_gauge(
            "vgpu_slice_saturation_ratio", "SM use over quota, 0-1 (best effort: GPU utilisation); the EPP feed x100"
        )
        procs = _slice_gauge("vgpu_slice_processes", "GPU processes attributed to the slice")
        active = _slice_gauge("vgpu_slice_violation_active", "1 while the slice violates its limit", ("kind",))
        cap = _slice_gauge(
            "vgpu_slice_hard_memory_limit_bytes", "Hard cap set with nvmlDeviceSetMemoryLimits_v1 (absent: none)"
        )
        for st in snap.slices:
            lv = self._slice_labels(snap.node, st.slice)
            limit.add_metric(lv, st.slice.memory_limit)
            used.add_metric(lv, st.memory_used)
            quota.add_metric(lv, st.slice.cores / 100.0)
            sm.add_metric(lv, st.sm_used / 100.0)
            sat.add_metric(lv, st.saturation / 100.0)
            procs.add_metric(lv, st.processes)
            for kind in ("memory", "sm"):
                active.add_metric([*lv, kind], 1.0 if any(k.value == kind for k in st.violations) else 0.0)
            if st.hard_limit is not None:
                cap.add_metric(lv, st.hard_limit)
        yield from (limit, used, quota, sm, sat, procs, active, cap)

    def _loop(self, snap: Snapshot) -> Iterator[Metric]:
        cycles = CounterMetricFamily("vgpu_watchdog_cycles", "Watchdog cycles run", labels=["Hostname"])
        cycles.add_metric([snap.node], snap.cycles)
        errors = CounterMetricFamily("vgpu_watchdog_errors", "Watchdog errors by kind", labels=["Hostname", "kind"])
        for kind, n in sorted(snap.errors.items()):
            errors.add_metric([snap.node, kind], n)
        seconds = GaugeMetricFamily(
            "vgpu_watchdog_last_cycle_seconds", "Wall time of the last watchdog cycle", labels=["Hostname"]
        )
        seconds.add_metric([snap.node], snap.last_cycle_seconds)
        dry = GaugeMetricFamily("vgpu_watchdog_dry_run", "1 if enforcement only logs and counts", labels=["Hostname"])
        dry.add_metric([snap.node], 1.0 if snap.dry_run else 0.0)
        hard = GaugeMetricFamily(
            "vgpu_node_hard_memory_limits_supported",
            "1 if nvmlDeviceSetMemoryLimits_v1 caps are in use; reason says why not",
            labels=["Hostname", "reason"],
        )
        hard.add_metric([snap.node, snap.hard_limits_reason], 1.0 if snap.hard_limits_supported else 0.0)
        yield from (cycles, errors, seconds, dry, hard)


def node_registry(source: Callable[[], Snapshot], registry: CollectorRegistry | None = None) -> CollectorRegistry:
    registry = registry or CollectorRegistry()
    registry.register(NodeCollector(source))
    return registry
