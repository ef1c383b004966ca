"""Prometheus metrics of the extender: the allocation view as a collector, plus request latency.

Base units and a `vgpu_` prefix; GPU labels use DCGM's keys (`gpu`, `UUID`, `modelName`, `Hostname`)
so dashboards can join allocation with DCGM/our node exporter usage.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpu.state import ClusterState

MIB = 1024 * 1024
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class AllocationCollector(Collector):
    """Reads the live cluster state at scrape time; no copies to keep in sync."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["Hostname", "gpu", "UUID", "modelName"]
        mem_total = GaugeMetricFamily("vgpu_gpu_memory_total_bytes", "GPU memory advertised", labels=labels)
        mem_alloc = GaugeMetricFamily(
            "vgpu_gpu_memory_allocated_bytes", "GPU memory allocated to slices", labels=labels
        )
        cores = GaugeMetricFamily(
            "vgpu_gpu_cores_allocated_ratio", "Share of SMs reserved by slices (0-1)", labels=labels
        )
        sharers = GaugeMetricFamily("vgpu_gpu_sharers", "Slices on the GPU", labels=labels)
        roles = GaugeMetricFamily("vgpu_gpu_role_slices", "Slices on the GPU by role", labels=[*labels, "role"])
        healthy = GaugeMetricFamily(
            "vgpu_gpu_healthy", "1 if the node inventory reports the GPU healthy", labels=labels
        )
        node_alloc = GaugeMetricFamily(
            "vgpu_node_memory_allocated_bytes", "GPU memory allocated per node", labels=["Hostname"]
        )
        node_mem_total = GaugeMetricFamily(
            "vgpu_node_memory_total_bytes", "GPU memory advertised per node (healthy or not)", labels=["Hostname"]
        )
        node_cores = GaugeMetricFamily(
            "vgpu_node_cores_allocated_ratio", "Share of the node's SMs reserved by slices (0-1)", labels=["Hostname"]
        )
        cordoned = GaugeMetricFamily(
            "vgpu_gpu_cordoned", "1 if the admin cordoned the GPU (vgpu.io/cordoned-gpus): no new slices", labels=labels
        )
        node_cordoned = GaugeMetricFamily(
            "vgpu_node_cordoned_gpus", "GPUs of the node's inventory that are cordoned", labels=["Hostname"]
        )
        cordon_invalid = GaugeMetricFamily(
            "vgpu_node_cordon_invalid_entries",
            "Entries of the node's cordon annotation not honoured as written: malformed (not a GPU UUID, ignored) or"
            " unknown (not in the inventory, kept)",
            labels=["Hostname", "problem"],
        )
        for node in self.state.nodes.values():
            node_cordon = node.inventory.cordon
            node_total = 0
            mem_sum = 0
            cores_used = 0
            cores_sum = 0
            for u in node.gpus:
                d = u.device
                lv = [node.name, str(d.index), d.uuid, d.model]
                mem_total.add_metric(lv, d.memory_mib * MIB)
                mem_alloc.add_metric(lv, u.memory_used * MIB)
                cores.add_metric(lv, u.cores_used / d.cores)
                sharers.add_metric(lv, u.sharers)
                healthy.add_metric(lv, 1.0 if d.healthy else 0.0)
                cordoned.add_metric(lv, 1.0 if d.uuid in node_cordon.uuids else 0.0)
                by_role: dict[str, int] = {}
                for h in u.holders:
                    by_role[h.role.value] = by_role.get(h.role.value, 0) + 1
                for role, n in sorted(by_role.items()):
                    roles.add_metric([*lv, role], n)
                node_total += u.memory_used
                mem_sum += d.memory_mib
                cores_used += u.cores_used
                cores_sum += d.cores
            node_alloc.add_metric([node.name], node_total * MIB)
            node_mem_total.add_metric([node.name], mem_sum * MIB)
            node_cores.add_metric([node.name], cores_used / cores_sum if cores_sum else 0.0)
            node_cordoned.add_metric([node.name], sum(1 for u in node.gpus if u.device.uuid in node_cordon.uuids))
            cordon_invalid.add_metric([node.name, "malformed"], len(node_cordon.malformed))
            cordon_invalid.add_metric([node.name, "unknown"], len(node_cordon.unknown))
        pods = GaugeMetricFamily("vgpu_allocated_pods", "Pods holding slices")
        pods.add_metric([], len(self.state.assignments))
        orphans = GaugeMetricFamily("vgpu_orphan_allocations", "Assignments whose node or GPU is unknown")
        orphans.add_metric([], len(self.state.orphans))
        conflicts = GaugeMetricFamily("vgpu_conflicting_allocations", "Assignments that would over-commit a GPU")
        conflicts.add_metric([], len(self.state.conflicts))
        yield from (mem_total, mem_alloc, cores, sharers, roles, healthy, node_alloc, pods, orphans, conflicts)
        yield from (node_mem_total, node_cores, cordoned, node_cordoned, cordon_invalid)


class ExtenderMetrics:
    def __init__(self, state: ClusterState, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.registry.register(AllocationCollector(state))
        self.latency = Histogram(
            "vgpu_extender_request_duration_seconds",
            "Extender verb latency",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.failures = Counter(
            "vgpu_extender_failures_total",
            "Filter and bind failures by reason",
            ["verb", "reason"],
            registry=self.registry,
        )
        self.problems = Counter(
            "vgpu_extender_state_problems_total",
            "Undecodable or conflicting annotations seen",
            ["kind"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "vgpu_extender_pending_pods", "vGPU pods whose last /filter found no node", registry=self.registry
        )
        self.inflight = Gauge(
            "vgpu_extender_inflight_binds", "Binds between reserve and Binding", registry=self.registry
        )
        self.learning_seeded = Counter(
            "vgpu_extender_learning_seeded_pods_total",
            "Running pods that seeded the placement policy's learned workload when the extender started or took over",
            registry=self.registry,
        )
        self.learning_seed_skipped = Counter(
            "vgpu_extender_learning_seed_skipped_pods_total",
            "Running pods with an assignment left out of the seeding, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.requeue_nudges = Counter(
            "vgpu_extender_requeue_nudges",
            "Nudges (vgpu.io/requeue) of pending pods after capacity freed, by outcome: sent, gone (404/409),"
            " error, coalesced (already queued), dropped (over --requeue-max-pods)",
            ["outcome"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "vgpu_extender_leader",
            "1 while this replica serves (leads, or runs without leader election), 0 while it stands by",
            registry=self.registry,
        )
        self.leader.set(1)
        self.standby_refusals = Counter(
            "vgpu_extender_standby_refusals_total",
            "Verbs answered 503 because this replica stands by (kube-scheduler reached a non-leader)",
            ["verb"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "vgpu_extender_bad_requests_total", "Requests refused with HTTP 4xx", ["verb"], registry=self.registry
        )
        self.preemptions = Counter(
            "vgpu_extender_preempt_calls_total",
            "preempt verb calls by outcome: answered (at least one node with a victim set), no-node (none works)",
            ["outcome"],
            registry=self.registry,
        )

    def filter_failure(self, reason: str) -> None:
        self.failures.labels("filter", reason).inc()

    def bind_failure(self) -> None:
        self.failures.labels("bind", "error").inc()

    def bound(self, seconds: float) -> None:
        self.latency.labels("bind").observe(seconds)

    def problem(self, kind: str, message: str) -> None:
        self.problems.labels(kind).inc()
