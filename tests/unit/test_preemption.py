"""Victim choice (vgpu.preemption) and priority (vgpu.priority): rules, and minimality against brute force."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.conftest import GPU_MEM, make_assignment, make_container, make_info, make_node, make_pod
from vgpu.config import PlacementConfig
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.pod import PodInfo, pod_info
from vgpu.preemption import Choice, Cost, VictimFacts, choose_victims, cost_of, eligible, without
from vgpu.priority import Priority, pod_priority, spec_priority
from vgpu.state import ClusterState, GpuUsage


def _first(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return 0.0


def _state(gpus: int = 2, split: int = 4) -> ClusterState:
    s = ClusterState(PlacementConfig())
    s.upsert_node(make_node("n", gpus, split=split))
    return s


def _put(s: ClusterState, key: str, gpu: int, mem: int, cores: int = 0) -> None:
    s.apply(f"default/{key}", make_assignment("n", [(gpu, mem, cores)]))


def _choose(s: ClusterState, pod: PodInfo, facts: dict[str, VictimFacts], prio: int = 100) -> Choice | None:
    return choose_victims(s.nodes["n"], pod, s.config, _first, facts, Priority(prio))


def _f(prio: int, created: float = 0.0, protected: bool = False, hami_high: bool = False) -> VictimFacts:
    return VictimFacts(Priority(prio, hami_high), created, protected)


def test_priority_from_spec_and_hami() -> None:
    pod = make_pod("p", [make_container(gpu=1, gpumem=1000, priority=0)])
    pod["spec"]["priority"] = 1000
    info = pod_info(pod)
    assert pod_priority(pod, info.request) == Priority(1000, hami_high=True)
    assert spec_priority({"spec": {}}) == 0 and spec_priority({"spec": {"priority": True}}) == 0
    low = make_pod("q", [make_container(gpu=1, gpumem=1000, priority=1)])
    assert pod_priority(low, pod_info(low).request) == Priority(0, hami_high=False)
    # HAMi's key orders pods of one class value, but never makes one preemptible by another of that value.
    assert Priority(5, True) > Priority(5, False) > Priority(4, True)
    assert not Priority(5, True).may_preempt(Priority(5, False))
    assert Priority(6).may_preempt(Priority(5, True))


def test_the_lowest_priority_goes_first_then_fewest_then_youngest() -> None:
    s = _state(gpus=1)
    for key, mem in (("a", 30000), ("b", 30000), ("c", 10000), ("d", 10000)):
        _put(s, key, 0, mem)
    pod = make_info("online", gpumem=25000)  # 1920 MiB free
    facts = {
        "default/a": _f(10, created=1),
        "default/b": _f(10, created=2),
        "default/c": _f(5),
        "default/d": _f(5, created=3),
    }
    got = _choose(s, pod, facts)
    # Both priority-5 pods free only 21920 MiB: one priority-10 pod it is, and of a and b, b is younger.
    assert got is not None and got.victims == ("default/b",)
    facts["default/a"] = _f(4, created=1)  # now a alone, the lowest, is enough
    got = _choose(s, pod, facts)
    assert got is not None and got.victims == ("default/a",)
    facts["default/a"] = _f(10, created=1)
    facts["default/c"] = facts["default/d"] = _f(5)
    s.release("default/b")  # 31920 free would fit: nothing to evict
    assert _choose(s, pod, facts) is None
    _put(s, "b", 0, 20000)  # 11920 free: c and d (priority 5) free 31920, cheaper than one priority-10 pod
    got = _choose(s, pod, facts)
    assert got is not None and set(got.victims) == {"default/c", "default/d"}


def test_a_pdb_protected_pod_is_spared_when_another_set_works() -> None:
    s = _state(gpus=2)
    _put(s, "x", 0, 70000)
    _put(s, "y", 1, 70000)
    pod = make_info("online", gpumem=40000)
    facts = {"default/x": _f(1, protected=True), "default/y": _f(50)}
    got = _choose(s, pod, facts)
    assert got is not None and got.victims == ("default/y",)
    assert [d.uuid for c in got.placement.containers for d in c.devices] == ["n-g1"]
    facts["default/y"] = _f(50, protected=True)
    got = _choose(s, pod, facts)  # both protected: the lower priority goes
    assert got is not None and got.victims == ("default/x",)


def test_no_victim_of_equal_or_higher_priority_and_no_set_when_nothing_helps() -> None:
    s = _state(gpus=1)
    _put(s, "a", 0, 70000)
    pod = make_info("online", gpumem=40000)
    assert _choose(s, pod, {"default/a": _f(100)}) is None  # equal priority: not preemptible
    assert _choose(s, pod, {}) is None  # unknown pods are never victims
    assert _choose(s, make_info("huge", gpumem=GPU_MEM + 1), {"default/a": _f(1)}) is None
    # A pod that fits already needs no preemption.
    assert _choose(s, make_info("small", gpumem=1000), {"default/a": _f(1)}) is None


def test_the_sharer_limit_is_freed_too() -> None:
    s = _state(gpus=1, split=2)
    _put(s, "a", 0, 1000)
    _put(s, "b", 0, 1000)
    got = _choose(s, make_info("online", gpumem=1000), {"default/a": _f(1, created=5), "default/b": _f(1, created=9)})
    assert got is not None and got.victims == ("default/b",)


def test_a_two_gpu_pod_takes_victims_on_two_gpus() -> None:
    s = _state(gpus=3)
    _put(s, "a", 0, 70000)
    _put(s, "b", 1, 70000)
    _put(s, "c", 2, 70000)
    pod = make_info("tp2", gpu=2, gpumem=40000)
    got = _choose(s, pod, {"default/a": _f(3), "default/b": _f(1), "default/c": _f(2)})
    assert got is not None and set(got.victims) == {"default/b", "default/c"}


def test_cost_order_is_a_multiset_order_of_priorities() -> None:
    facts = {"p1": _f(1), "p1b": _f(1), "p1c": _f(1), "p2": _f(2)}
    assert cost_of(["p1", "p1b", "p1c"], facts) < cost_of(["p2"], facts)
    assert cost_of(["p2"], facts) < cost_of(["p2", "p1"], facts)


def _brute(s: ClusterState, pod: PodInfo, facts: dict[str, VictimFacts], prio: Priority) -> Cost | None:
    node = s.nodes["n"]
    can = sorted(eligible(node, prio, facts))
    best: Cost | None = None
    for size in range(1, len(can) + 1):
        for subset in itertools.combinations(can, size):
            if isinstance(fit_node(without(node, subset), pod, s.config, _first), NodePlacement):
                c = cost_of(subset, facts)
                best = c if best is None or c < best else best
    return best


@pytest.mark.parametrize("seed", range(300))
def test_minimal_against_every_subset(seed: int) -> None:
    """Random small nodes (2-3 GPUs, 3 to 9 one-GPU pods, random priorities, ages and PDBs): the choice costs
    exactly the minimum over every subset of the node's pods, and is None exactly when no subset works."""
    rnd = random.Random(seed)
    gpus = rnd.choice((2, 3))
    split = rnd.choice((2, 3, 4))
    s = _state(gpus=gpus, split=split)
    facts: dict[str, VictimFacts] = {}
    for i in range(rnd.randint(3, 9)):
        mem = rnd.choice((10000, 20000, 30000, 40000))
        cores = rnd.choice((0, 10, 30, 50))
        g = rnd.randrange(gpus)
        try:
            _put(s, f"v{i}", g, mem, cores)
        except Exception:
            continue
        facts[f"default/v{i}"] = _f(rnd.choice((1, 2, 3, 200)), rnd.choice((1.0, 2.0, 3.0)), rnd.random() < 0.2)
    count = rnd.choice((1, 1, 2)) if gpus > 1 else 1
    pod = make_info("online", gpu=count, gpumem=rnd.choice((20000, 40000, 60000)), gpucores=rnd.choice((0, 20, 50)))
    prio = Priority(100)
    got = choose_victims(s.nodes["n"], pod, s.config, _first, facts, prio)
    fits_now = isinstance(fit_node(s.nodes["n"], pod, s.config, _first), NodePlacement)
    want = None if fits_now else _brute(s, pod, facts, prio)
    assert (got.cost if got else None) == want
    if got is not None:
        assert all(facts[v].priority < prio for v in got.victims)
        after = without(s.nodes["n"], got.victims)
        assert not isinstance(fit_node(after, pod, s.config, _first), FitFailure)


def test_the_benchmark_runs_and_the_extender_evicts_the_fewest_pods() -> None:
    """benchmarks/preemption.py on a small workload: every online pod our verb preempted for was placed with the
    fewest victims brute force finds, and no more preemptions than kube-scheduler's replica-counting default."""
    from benchmarks.preemption import run

    ours = run(1, 8.0, 3, "extender-all")
    default = run(1, 8.0, 3, "default")
    none = run(1, 8.0, 3, "none")
    assert ours.preemptions > 0 and none.preemptions == 0
    assert all(v == m for v, m, h in zip(ours.victims, ours.minimum, ours.helped, strict=True) if m > 0 and h)
    assert ours.preemptions <= default.preemptions
    assert max(ours.waits) <= max(none.waits)
