"""The extender's /metrics body (scheduler_extender.metrics): the allocation view served from per-node text kept per
node version says exactly what the registry's collector says, after binds, releases, a cordon and a node leaving,
with label values that need escaping; and it is valid Prometheus text."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler_extender.metrics import ExtenderMetrics
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.devices import Cordon, GpuDevice, NodeInventory
from vgpu.pod import Role
from vgpu.state import ClusterState


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith(("vgpu_gpu_", "vgpu_node_", "vgpu_allocated", "vgpu_orphan", "vgpu_conflicting"))
    }


def _inventory(name: str, model: str = "H100", cordon: Cordon = Cordon()) -> NodeInventory:
    gpus = tuple(GpuDevice(f"GPU-{name}-{i}", i, model, 81920, split_count=4) for i in range(2))
    return NodeInventory(name, gpus, cordon=cordon)


def _slice(node: str, gpu: int, mib: int, role: Role = Role.DECODE) -> Assignment:
    return Assignment(node, (ContainerAssignment("c", (DeviceSlice(f"GPU-{node}-{gpu}", gpu, mib, 25),)),), role=role)


def test_served_text_equals_the_collector_through_changes() -> None:
    state = ClusterState()
    metrics = ExtenderMetrics(state)
    lock = threading.RLock()

    def same() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        served = _samples(metrics.exposition(lock).decode())
        assert served == _samples(generate_latest(metrics.registry).decode())
        return served

    state.upsert_node(_inventory("a"))
    state.upsert_node(_inventory('b"\\odd\nname', model='Model "X"\\1'))
    assert same()[("vgpu_node_memory_total_bytes", (("Hostname", "a"),))] == 2 * 81920 * 1024 * 1024
    state.apply("ns/p", _slice("a", 0, 20000, Role.PREFILL))
    state.apply("ns/q", _slice("a", 0, 10000))
    got = same()
    labels = (("Hostname", "a"), ("UUID", "GPU-a-0"), ("gpu", "0"), ("modelName", "H100"))
    assert got[("vgpu_gpu_memory_allocated_bytes", labels)] == 30000 * 1024 * 1024
    assert got[("vgpu_gpu_sharers", labels)] == 2
    assert got[("vgpu_gpu_role_slices", (*labels[:3], ("modelName", "H100"), ("role", "prefill")))] == 1
    assert got[("vgpu_allocated_pods", ())] == 2
    state.release("ns/p")  # the cached text of node a must be redone
    assert same()[("vgpu_gpu_memory_allocated_bytes", labels)] == 10000 * 1024 * 1024
    state.upsert_node(_inventory("a", cordon=Cordon(uuids=frozenset({"GPU-a-1"}))))
    assert same()[("vgpu_node_cordoned_gpus", (("Hostname", "a"),))] == 1
    state.remove_node('b"\\odd\nname')
    assert not any(dict(k[1]).get("Hostname", "").startswith("b") for k in same())


def test_per_node_mode_serves_the_per_gpu_view_without_its_gpu_families() -> None:
    """--allocation-metrics per-node: no vgpu_gpu_* family, every other sample as the per-gpu view has it (the served
    text and the registry's collector alike), through a bind and a release."""
    state = ClusterState()
    full, per_node = ExtenderMetrics(state), ExtenderMetrics(state, per_gpu=False)
    lock = threading.RLock()

    def both() -> None:
        want = {k: v for k, v in _samples(full.exposition(lock).decode()).items() if not k[0].startswith("vgpu_gpu_")}
        assert len(want) < len(_samples(full.exposition(lock).decode()))  # the full view had per-GPU samples
        assert _samples(per_node.exposition(lock).decode()) == want
        assert _samples(generate_latest(per_node.registry).decode()) == want

    for name in ("a", "b"):
        state.upsert_node(_inventory(name))
    both()
    state.apply("ns/p", _slice("a", 1, 20000, Role.PREFILL))
    both()
    assert (
        _samples(per_node.exposition(lock).decode())[("vgpu_node_memory_allocated_bytes", (("Hostname", "a"),))]
        == 20000 * 1024 * 1024
    )
    state.release("ns/p")
    both()


class _CountingLock:
    """A lock that notes how many nodes' text the collector held in its cache at each release."""

    def __init__(self, metrics: ExtenderMetrics) -> None:
        self.metrics, self.lock, self.cached = metrics, threading.RLock(), [0]

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.cached.append(len(self.metrics.allocation._cache))
        self.lock.release()


def test_a_scrape_redoes_at_most_a_chunk_of_nodes_per_hold_of_the_state_lock() -> None:
    """The first scrape redoes every node (2-3 s at 5,000 nodes in one hold had stalled the verbs): it lets the
    lock go every `REBUILD_CHUNK` nodes, and serves what a scrape in one hold serves; a later scrape with a few
    changed nodes takes the lock once."""
    state = ClusterState()
    for i in range(50):
        state.upsert_node(_inventory(f"n{i:02d}"))
    state.apply("ns/p", _slice("n07", 1, 20000, Role.PREFILL))
    metrics = ExtenderMetrics(state)
    lock = _CountingLock(metrics)
    text = "".join(metrics.allocation.pieces(lock, chunk=8))  # type: ignore[arg-type]
    grew = [b - a for a, b in zip(lock.cached, lock.cached[1:], strict=False)]
    assert max(grew) <= 8 and sum(grew) == 50 and len(grew) == 7  # 6 holds of 8, one of 2 and the answer
    whole = ExtenderMetrics(state)
    assert _samples(text) == _samples(whole.exposition(threading.RLock()).decode())
    state.apply("ns/q", _slice("n09", 0, 10000))
    lock.cached = [len(metrics.allocation._cache)]
    changed = "".join(metrics.allocation.pieces(lock, chunk=8))  # type: ignore[arg-type]
    assert len(lock.cached) == 2  # one hold
    key = ("vgpu_node_memory_allocated_bytes", (("Hostname", "n09"),))
    assert _samples(changed)[key] == 10000 * 1024 * 1024


def test_a_scrape_under_churn_faster_than_its_holds_ends_with_one_whole_hold() -> None:
    """Every node changes while the lock is let go (a relist each time): chasing them a chunk a hold would never end,
    so after the rounds a full rebuild needs (and a few more) the rest is redone in one hold, the answer current."""
    state = ClusterState()
    names = [f"n{i:02d}" for i in range(50)]
    for name in names:
        state.upsert_node(_inventory(name))
    metrics = ExtenderMetrics(state)
    holds = [0]

    class Churning:
        def __init__(self) -> None:
            self.lock = threading.RLock()

        def __enter__(self) -> None:
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            holds[0] += 1
            for name in names:  # every node changed, as a relist changing every node's inventory
                state.upsert_node(_inventory(name, model=f"H{holds[0]}"))
            self.lock.release()

    text = "".join(metrics.allocation.pieces(Churning(), chunk=8))  # type: ignore[arg-type]
    assert holds[0] == 50 // 8 + 8 + 1
    assert len([k for k in _samples(text) if k[0] == "vgpu_node_memory_total_bytes"]) == 50
    assert {dict(k[1])["modelName"] for k in _samples(text) if k[0] == "vgpu_gpu_healthy"} == {f"H{holds[0] - 1}"}
