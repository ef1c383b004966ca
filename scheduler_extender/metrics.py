"""Prometheus metrics of the extender: the allocation view as a collector, plus request latency.

Base units and a `vgpu_` prefix; GPU labels use DCGM's keys (`gpu`, `UUID`, `modelName`, `Hostname`)
so dashboards can join allocation with DCGM/our node exporter usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler_extender.gcpause import collection_seconds
from scheduler_extender.pending import MAX_PENDING, TTL_S
from vgpu.state import ClusterState, NodeState

MIB = 1024 * 1024
# Nodes whose text a scrape redoes in one hold of the state lock (~0.5 ms each per-gpu with 8 GPUs).
REBUILD_CHUNK = 256
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


_GPU = ("Hostname", "gpu", "UUID", "modelName")
_NODE = ("Hostname",)
# (name, help, label names) of the per-node families, in the order rows are produced for a node.
_FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vgpu_gpu_memory_total_bytes", "GPU memory advertised", _GPU),
    ("vgpu_gpu_memory_allocated_bytes", "GPU memory allocated to slices", _GPU),
    ("vgpu_gpu_cores_allocated_ratio", "Share of SMs reserved by slices (0-1)", _GPU),
    ("vgpu_gpu_sharers", "Slices on the GPU", _GPU),
    ("vgpu_gpu_role_slices", "Slices on the GPU by role", (*_GPU, "role")),
    ("vgpu_gpu_healthy", "1 if the node inventory reports the GPU healthy", _GPU),
    ("vgpu_gpu_cordoned", "1 if the admin cordoned the GPU (vgpu.io/cordoned-gpus): no new slices", _GPU),
    ("vgpu_node_memory_allocated_bytes", "GPU memory allocated per node", _NODE),
    ("vgpu_node_memory_total_bytes", "GPU memory advertised per node (healthy or not)", _NODE),
    ("vgpu_node_cores_allocated_ratio", "Share of the node's SMs reserved by slices (0-1)", _NODE),
    ("vgpu_node_cordoned_gpus", "GPUs of the node's inventory that are cordoned", _NODE),
    (
        "vgpu_node_cordon_invalid_entries",
        "Entries of the node's cordon annotation not honoured as written: malformed (not a GPU UUID, ignored) or"
        " unknown (not in the inventory, kept)",
        ("Hostname", "problem"),
    ),
)
_TOTALS = (
    ("vgpu_allocated_pods", "Pods holding slices"),
    ("vgpu_orphan_allocations", "Assignments whose node or GPU is unknown"),
    ("vgpu_conflicting_allocations", "Assignments that would over-commit a GPU"),
)
Rows = tuple[list[tuple[tuple[str, ...], float]], ...]  # per family: (label values, value)


def _node_rows(node: NodeState, per_gpu: bool = True) -> Rows:
    """Every family's rows for one node; without `per_gpu` the per-GPU families' stay empty."""
    rows: Rows = tuple([] for _ in _FAMILIES)
    mem_total, mem_alloc, cores, sharers, roles, healthy, cordoned = rows[:7]
    node_alloc, node_mem_total, node_cores, node_cordoned, cordon_invalid = rows[7:]
    cordon = node.inventory.cordon
    used_sum = mem_sum = cores_used = cores_sum = 0
    for u in node.gpus:
        d = u.device
        used_sum += u.memory_used
        mem_sum += d.memory_mib
        cores_used += u.cores_used
        cores_sum += d.cores
        if not per_gpu:
            continue
        lv = (node.name, str(d.index), d.uuid, d.model)
        mem_total.append((lv, d.memory_mib * MIB))
        mem_alloc.append((lv, u.memory_used * MIB))
        cores.append((lv, u.cores_used / d.cores))
        sharers.append((lv, u.sharers))
        healthy.append((lv, 1.0 if d.healthy else 0.0))
        cordoned.append((lv, 1.0 if d.uuid in cordon.uuids else 0.0))
        by_role: dict[str, int] = {}
        for h in u.holders:
            by_role[h.role.value] = by_role.get(h.role.value, 0) + 1
        roles.extend(((*lv, role), n) for role, n in sorted(by_role.items()))
    node_alloc.append(((node.name,), used_sum * MIB))
    node_mem_total.append(((node.name,), mem_sum * MIB))
    node_cores.append(((node.name,), cores_used / cores_sum if cores_sum else 0.0))
    node_cordoned.append(((node.name,), sum(1 for u in node.gpus if u.device.uuid in cordon.uuids)))
    cordon_invalid.append(((node.name, "malformed"), len(cordon.malformed)))
    cordon_invalid.append(((node.name, "unknown"), len(cordon.unknown)))
    return rows


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(k + '="' + _escape(v) + '"' for k, v in zip(names, values, strict=True))


def _lines(name: str, labels: tuple[str, ...], rows: list[tuple[tuple[str, ...], float]]) -> str:
    """Prometheus text exposition format 0.0.4 sample lines."""
    return "".join(f"{name}{{{_labels(labels, lv)}}} {float(x)!r}\n" for lv, x in rows)


class AllocationCollector(Collector):
    """Reads the live cluster state at scrape time; no copies to keep in sync.

    At 5,000 nodes x 8 GPUs the per-GPU families are ~300,000 samples (32 MB of text): built through
    prometheus_client they took 5-6 s, under the state lock the verbs need, past kube-scheduler's 5 s httpTimeout.
    So each node's rows and text are kept per node version and redone only for nodes that changed; `text` is what
    /metrics serves (the lock held only to pick up the nodes), `collect` the same rows for a registry reader.
    `per_gpu` False (--allocation-metrics per-node) leaves the per-GPU families out: Prometheus keeps each series in
    memory, and 300,000 of them from one target is more than a large cluster's dashboards read."""

    def __init__(self, state: ClusterState, *, per_gpu: bool = True) -> None:
        self.state = state
        self.per_gpu = per_gpu
        self.families = tuple(i for i, f in enumerate(_FAMILIES) if per_gpu or not f[0].startswith("vgpu_gpu_"))
        # node name -> (the NodeState, its version, rows, text per family)
        self._cache: dict[str, tuple[NodeState, int, Rows, tuple[str, ...]]] = {}

    def _current(self, budget: int | None = None) -> list[tuple[Rows, tuple[str, ...]]] | None:
        """Each node's rows and text, redone for the nodes that changed; with a `budget`, None once more than that
        many needed redoing (those were redone: the caller calls again, see `pieces`)."""
        out = []
        cache = self._cache
        for name, node in self.state.nodes.items():
            hit = cache.get(name)
            if hit is None or hit[0] is not node or hit[1] != node.version:
                if budget is not None:
                    if budget == 0:
                        return None
                    budget -= 1
                rows = _node_rows(node, self.per_gpu)
                text = tuple(_lines(_FAMILIES[i][0], _FAMILIES[i][2], rows[i]) for i in self.families)
                hit = cache[name] = (node, node.version, rows, text)
            out.append((hit[2], hit[3]))
        if len(cache) > len(self.state.nodes):
            for gone in [n for n in cache if n not in self.state.nodes]:
                del cache[gone]
        return out

    def _totals(self) -> tuple[int, int, int]:
        return len(self.state.assignments), len(self.state.orphans), len(self.state.conflicts)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nodes = self._current()
        assert nodes is not None
        for i in self.families:
            name, doc, labels = _FAMILIES[i]
            family = GaugeMetricFamily(name, doc, labels=list(labels))
            for rows, _ in nodes:
                for lv, x in rows[i]:
                    family.add_metric(list(lv), x)
            yield family
        for (name, doc), value in zip(_TOTALS, self._totals(), strict=True):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            yield family

    def pieces(self, lock: AbstractContextManager[object], chunk: int = REBUILD_CHUNK) -> list[str]:
        """The exposition text of every allocation family, as pieces to join, taken under `lock` (the state's): each
        node's cached text is picked up and the nodes that changed are redone, at most `chunk` of them a hold, the
        lock let go in between. The first scrape after a start redoes every node: at 5,000 nodes x 8 GPUs 2-3 s of
        CPU in one hold had stalled every verb for as long (kube-scheduler's extender httpTimeout is 5 s by default)."""
        for _ in range(len(self.state.nodes) // chunk + 8):
            with lock:
                nodes = self._current(chunk)
                if nodes is not None:
                    return self._render(nodes)
        with lock:  # nodes changed faster than a hold redid them: the rest in one hold rather than chase them for ever
            nodes = self._current()
            assert nodes is not None
            return self._render(nodes)

    def _render(self, nodes: list[tuple[Rows, tuple[str, ...]]]) -> list[str]:
        out: list[str] = []
        for at, i in enumerate(self.families):
            name, doc, _ = _FAMILIES[i]
            out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            out.extend(text[at] for _, text in nodes)
        for (name, doc), value in zip(_TOTALS, self._totals(), strict=True):
            out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n{name} {float(value)!r}\n")
        return out


class _Rest(Collector):
    """Every metric but the allocation view: generate_latest of it runs outside the state lock."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()


class _CollectorTime(Collector):
    """The garbage collector's seconds by generation (scheduler_extender.gcpause.time_collections; zeros until main
    starts timing): a collection runs on whichever thread allocated past a threshold, so its cost hides in that
    thread's CPU."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "vgpu_extender_gc_seconds", "Seconds the garbage collector ran, by generation", labels=["generation"]
        )
        for generation, seconds in enumerate(collection_seconds()):
            family.add_metric([str(generation)], seconds)
        yield family


class ExtenderMetrics:
    def __init__(self, state: ClusterState, registry: CollectorRegistry | None = None, *, per_gpu: bool = True) -> None:
        # `registry` holds everything (tests and registry readers); /metrics renders the allocation view from its
        # per-node text cache under the lock and the rest (`self.rest`) outside it (`exposition`).
        self.registry = registry or CollectorRegistry()
        self.allocation = AllocationCollector(state, per_gpu=per_gpu)
        self.registry.register(self.allocation)
        self.rest = CollectorRegistry()
        self.rest.register(_CollectorTime())
        self.latency = Histogram(
            "vgpu_extender_request_duration_seconds",
            "Extender verb latency",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.rest,
        )
        self.failures = Counter(
            "vgpu_extender_failures_total",
            "Filter and bind failures by reason",
            ["verb", "reason"],
            registry=self.rest,
        )
        self.problems = Counter(
            "vgpu_extender_state_problems_total",
            "Undecodable or conflicting annotations seen",
            ["kind"],
            registry=self.rest,
        )
        self.pending = Gauge(
            "vgpu_extender_pending_pods",
            f"vGPU pods whose last /filter found no node, kept {TTL_S:g} s after that rejection, at most"
            f" {MAX_PENDING}; bound, deleted or answered 404/409 to a nudge: gone",
            registry=self.rest,
        )
        self.inflight = Gauge("vgpu_extender_inflight_binds", "Binds between reserve and Binding", registry=self.rest)
        self.learning_seeded = Counter(
            "vgpu_extender_learning_seeded_pods_total",
            "Running pods that seeded the placement policy's learned workload when the extender started or took over",
            registry=self.rest,
        )
        self.learning_seed_skipped = Counter(
            "vgpu_extender_learning_seed_skipped_pods_total",
            "Running pods with an assignment left out of the seeding, by reason",
            ["reason"],
            registry=self.rest,
        )
        self.requeue_nudges = Counter(
            "vgpu_extender_requeue_nudges",
            "Nudges (vgpu.io/requeue) of pending pods after capacity freed, by outcome: sent, gone (404/409),"
            " error, coalesced (already queued); none is dropped: over --requeue-max-pods an interval, they wait",
            ["outcome"],
            registry=self.rest,
        )
        self.leader = Gauge(
            "vgpu_extender_leader",
            "1 while this replica serves (leads, or runs without leader election), 0 while it stands by",
            registry=self.rest,
        )
        self.leader.set(1)
        self.standby_refusals = Counter(
            "vgpu_extender_standby_refusals_total",
            "Verbs answered 503 because this replica stands by (kube-scheduler reached a non-leader)",
            ["verb"],
            registry=self.rest,
        )
        self.bad_requests = Counter(
            "vgpu_extender_bad_requests_total", "Requests refused with HTTP 4xx", ["verb"], registry=self.rest
        )
        self.preemptions = Counter(
            "vgpu_extender_preempt_calls_total",
            "preempt verb calls by outcome: answered (at least one node with a victim set), no-node (none works), "
            "no-gpu (no GPU request: kube-scheduler's victims passed back), cannot-fit (the pod's GPU request is "
            "invalid or can never fit: no victims); answered empty as the apiserver holds no such pod to preempt for: "
            "pod-missing, uid-mismatch, pod-bound, pod-deleting, read-failed",
            ["outcome"],
            registry=self.rest,
        )

        self.one_node = Counter(
            "vgpu_extender_one_node_answers_total",
            "--filter-answers-one: /filter calls of a pod that fits, by outcome: one (a single node answered, no "
            "/prioritize follows), all-held (every best-ranked node is blocked by other pods' soft holds: the whole "
            "answer went back and /prioritize decides)",
            ["outcome"],
            registry=self.rest,
        )

        self.registry.register(_Rest(self.rest))

    def exposition(self, lock: AbstractContextManager[object]) -> bytes:
        """The /metrics body: the allocation view taken under `lock` (the state's, held for at most
        `REBUILD_CHUNK` nodes' rebuild at a time), the rest rendered outside it."""
        pieces = self.allocation.pieces(lock)
        return generate_latest(self.rest) + "".join(pieces).encode()

    def filter_failure(self, reason: str) -> None:
        self.failures.labels("filter", reason).inc()

    def bind_failure(self) -> None:
        self.failures.labels("bind", "error").inc()

    def bound(self, seconds: float) -> None:
        self.latency.labels("bind").observe(seconds)

    def problem(self, kind: str, message: str) -> None:
        self.problems.labels(kind).inc()
