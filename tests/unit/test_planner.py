"""Planner: cached evaluation always equals a fresh one, priorities on 0..10, narrow, policy errors."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import assert_invariants, make_assignment, make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.errors import UnknownPolicyError
from vgpu.placement import registry
from vgpu.planner import MAX_PRIORITY, Evaluation, NodeResult, Planner, PriorityMapping, to_priorities
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState

SHAPES: list[dict[str, object]] = [
    {"gpumem": 8192},
    {"gpu": 2, "gpumem_percentage": 30, "gpucores": 20},
    {"role": "prefill", "model": "m", "gpumem": 20000, "gpucores": 40},
    {"role": "decode", "model": "m", "gpumem": 10000, "gpucores": 10},
    {"role": "decode", "model": "x", "gpumem": 4000, "gpucores": 0},
    {"gpu": 1},
]


def _fresh(p: Planner, pod: PodInfo, names: list[str]) -> Evaluation:
    """The uncached truth: evaluate_node per node."""
    out = Evaluation()
    for name in names:
        r = p.evaluate_node(name, pod)
        if r.failure is None:
            out.feasible[name] = r
        elif r.failure.unresolvable:
            out.unresolvable[name] = r.failure.reason
        else:
            out.failed[name] = r.failure.reason
    return out


def _same(cached: Evaluation, fresh: Evaluation) -> None:
    assert {n: (r.placement, r.score) for n, r in cached.feasible.items()} == {
        n: (r.placement, r.score) for n, r in fresh.feasible.items()
    }
    assert cached.failed == fresh.failed
    assert cached.unresolvable == fresh.unresolvable


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_cached_evaluation_matches_uncached_after_random_changes(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    p = Planner(ClusterState(PlacementConfig(node_policy=policy)))
    names = [f"n{i}" for i in range(5)]
    for name in names[:4]:
        p.state.upsert_node(make_node(name, rng.randint(1, 3), split=4))
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    placed: list[str] = []
    for step in range(120):
        op = rng.random()
        if op < 0.05:
            p.state.upsert_node(make_node(rng.choice(names), rng.randint(1, 3), memory_mib=rng.choice([40000, 81920])))
        elif op < 0.08:
            p.state.remove_node(rng.choice(names))
        elif op < 0.35 and placed:
            p.state.release(placed.pop(rng.randrange(len(placed))))
        else:
            pod = make_info(f"q{step}", **rng.choice(SHAPES))  # type: ignore[arg-type]
            best = p.evaluate(pod).best()
            if best is not None:
                assert best[1].placement is not None
                p.state.apply(pod.key, best[1].placement.assignment(pod))
                placed.append(pod.key)
        assert_invariants(p.state)
        # Every shape, over all nodes and over the subset a /prioritize after /filter would send.
        for pod in pods:
            everyone = list(p.state.nodes)
            full = p.evaluate(pod)
            _same(full, _fresh(p, pod, everyone))
            assert p.priorities(full) == to_priorities({n: r.score for n, r in full.feasible.items()})
            # Even steps: the subset-reuse path (filter then prioritize); odd: a node the state lacks.
            subset = sorted(full.feasible)[: max(1, len(full.feasible) - 1)]
            if step % 2:
                subset.append("n-unknown")
            part = p.evaluate(pod, subset)
            _same(part, _fresh(p, pod, subset))
            assert p.priorities(part) == to_priorities({n: r.score for n, r in part.feasible.items()})


def test_evaluate_sees_apply_and_release_on_a_node() -> None:
    p = Planner(ClusterState())
    p.state.upsert_node(make_node("n", 1))
    pod = make_info(gpumem=50000)
    assert "n" in p.evaluate(pod).feasible
    p.state.apply("ns/x", make_assignment("n", [(0, 40000, 40)]))
    assert "GPU memory full" in p.evaluate(pod).failed["n"]
    p.state.release("ns/x")
    assert "n" in p.evaluate(pod).feasible


def test_evaluate_sees_a_recreated_node() -> None:
    p = Planner(ClusterState())
    p.state.upsert_node(make_node("n", 1))
    pod = make_info(gpu=2, gpumem=1000)
    assert "n" in p.evaluate(pod).unresolvable
    p.state.remove_node("n")
    assert "no vGPU inventory" in p.evaluate(pod, ["n"]).failed["n"]
    p.state.upsert_node(make_node("n", 2))
    assert "n" in p.evaluate(pod).feasible


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.floats(-2, 2, allow_nan=False), max_size=30))
def test_minmax_priorities_map_onto_0_to_10(scores: dict[str, float]) -> None:
    prios = to_priorities(scores, "minmax")
    assert prios.keys() == scores.keys()
    assert all(0 <= v <= MAX_PRIORITY for v in prios.values())
    if scores:
        assert max(prios.values()) == MAX_PRIORITY
        if max(scores.values()) - min(scores.values()) > 1e-9:
            assert min(prios.values()) == 0
            assert prios[max(scores, key=scores.__getitem__)] == MAX_PRIORITY
        for a in scores:
            for b in scores:
                if scores[a] < scores[b]:
                    assert prios[a] <= prios[b]


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ({}, {}),
        ({"a": 0.3}, {"a": 10}),
        ({"a": 0.3, "b": 0.3}, {"a": 10, "b": 10}),
        ({"a": 0.0, "b": 0.5, "c": 1.0}, {"a": 0, "b": 5, "c": 10}),
        ({"a": -1.0, "b": 0.04, "c": 0.0}, {"a": 0, "b": 10, "c": 10}),
    ],
)
def test_minmax_priorities_table(scores: dict[str, float], expected: dict[str, int]) -> None:
    assert to_priorities(scores, "minmax") == expected


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.floats(-2, 2, allow_nan=False), max_size=30))
def test_rank_priorities_give_the_best_ten_nodes_10_down_to_1(scores: dict[str, float]) -> None:
    prios = to_priorities(scores)
    assert prios.keys() <= scores.keys() and len(prios) == min(len(scores), MAX_PRIORITY)
    assert sorted(prios.values(), reverse=True) == list(range(MAX_PRIORITY, MAX_PRIORITY - len(prios), -1))
    for a in scores:
        for b in scores:
            if scores[a] < scores[b] and a in prios:
                assert prios.get(b, 0) > prios[a]  # a better node is never ranked lower
    assert to_priorities(dict(reversed(list(scores.items())))) == prios  # ties: stable, not input order


def test_rank_priorities_break_ties_the_same_way_in_every_call() -> None:
    tied = {f"node-{i}": 0.5 for i in range(50)}
    first = to_priorities(tied)
    assert len(first) == MAX_PRIORITY and first == to_priorities(dict(sorted(tied.items(), reverse=True)))
    assert to_priorities({**tied, "node-x": 0.6})["node-x"] == MAX_PRIORITY


def _planner_with_tiers(mapping: PriorityMapping = "rank") -> Planner:
    p = Planner(ClusterState(PlacementConfig(node_policy="binpack", priority_mapping=mapping)))
    for name, used in (("full", 60000), ("twin", 60000), ("half", 30000), ("empty", 0)):
        p.state.upsert_node(make_node(name, 1))
        if used:
            p.state.apply(f"ns/{name}", make_assignment(name, [(0, used, 10)]))
    p.state.upsert_node(make_node("tiny", 1, memory_mib=4096))
    p.state.upsert_node(make_node("busy", 1))
    p.state.apply("ns/busy", make_assignment("busy", [(0, 80000, 10)]))
    return p


def test_narrow_keeps_only_the_top_tier_minmax() -> None:
    p = _planner_with_tiers("minmax")
    ev = p.evaluate(make_info(gpumem=8192))
    assert set(ev.feasible) == {"full", "twin", "half", "empty"}
    narrowed = p.narrow(ev)
    assert set(narrowed.feasible) == {"full", "twin"}
    assert p.priorities(narrowed) == {"full": MAX_PRIORITY, "twin": MAX_PRIORITY}
    for name in ("half", "empty"):
        assert "below the best tier (narrow filter)" in narrowed.failed[name]
    assert narrowed.unresolvable == ev.unresolvable and "tiny" in narrowed.unresolvable
    assert narrowed.failed["busy"] == ev.failed["busy"]
    assert set(ev.feasible) == {"full", "twin", "half", "empty"}  # the input is not changed


def test_narrow_with_rank_keeps_the_single_best_node_tie_broken_stably() -> None:
    p = _planner_with_tiers()
    ev = p.evaluate(make_info(gpumem=8192))
    narrowed = p.narrow(ev)
    (kept,) = narrowed.feasible
    assert kept in {"full", "twin"}  # the two fullest tie; the stable per-node order picks one
    assert (
        kept == p.narrow(_planner_with_tiers().evaluate(make_info(gpumem=8192))).feasible.keys().__iter__().__next__()
    )
    assert {"full", "twin", "half", "empty"} - {kept} <= set(narrowed.failed)


def test_narrow_of_nothing_feasible_is_the_same_evaluation() -> None:
    p = _planner_with_tiers()
    ev = p.evaluate(make_info(gpumem=100_000))
    assert p.narrow(ev).feasible == {} and p.narrow(ev).unresolvable == ev.unresolvable


def test_every_rejected_node_has_a_readable_reason() -> None:
    p = _planner_with_tiers()
    p.state.upsert_node(make_node("sick", 1, unhealthy=(0,)))
    pod = make_info(gpumem=8192)
    ev = p.evaluate(pod, [*p.state.nodes, "ghost"])
    rejected = {**ev.failed, **ev.unresolvable}
    assert set(rejected) == {"tiny", "busy", "sick", "ghost"}
    assert not set(rejected) & set(ev.feasible)
    assert "card too small" in ev.unresolvable["tiny"]
    assert "GPU memory full" in ev.failed["busy"]
    assert "unhealthy" in ev.failed["sick"]
    assert "no vGPU inventory" in ev.failed["ghost"]
    for name in ("tiny", "busy", "sick"):
        assert "container 'main' needs 1 vGPU(s) of 8192 MiB" in rejected[name]


@pytest.mark.parametrize(
    ("annotations", "key", "known"),
    [
        ({"vgpu.io/node-policy": "tetris"}, "vgpu.io/node-policy", registry.production_names()),
        ({"vgpu.io/gpu-policy": "tetris"}, "vgpu.io/gpu-policy", ["binpack", "spread"]),
        ({"vgpu.io/node-policy": "fragaware-wg100"}, "benchmark experiment", registry.production_names()),
    ],
)
def test_bad_policy_annotation_names_the_known_policies(
    annotations: dict[str, str], key: str, known: list[str]
) -> None:
    p = Planner(ClusterState())
    p.state.upsert_node(make_node("n", 1))
    pod = make_info(annotations=annotations)
    for call in (lambda: p.evaluate(pod), lambda: p.evaluate_node("n", pod)):
        with pytest.raises(UnknownPolicyError) as info:
            call()
        text = str(info.value)
        assert key in text and repr(next(iter(annotations.values()))) in text
        assert all(name in text for name in known)
        assert not any(name in text.split("allowed:")[1] for name in registry.EXPERIMENTAL)


@pytest.mark.parametrize("experiment", sorted(registry.EXPERIMENTAL))
def test_a_pod_cannot_pick_a_benchmark_experiment_by_annotation(experiment: str) -> None:
    """Every node of the cluster says why: the annotation, that the name is an experiment, the allowed values."""
    p = Planner(ClusterState())
    for name in ("a", "b"):
        p.state.upsert_node(make_node(name, 1))
    pod = make_info(gpumem=1000, annotations={"vgpu.io/node-policy": experiment})
    with pytest.raises(UnknownPolicyError) as info:
        p.evaluate(pod)
    assert str(info.value) == (
        f"annotation vgpu.io/node-policy: placement policy {experiment!r} is a benchmark experiment, not a "
        f"production policy; allowed: {', '.join(registry.production_names())}"
    )
    with pytest.raises(UnknownPolicyError):
        p.observe(pod)  # nor teach an experiment's model
    assert experiment not in p._policies


def test_only_the_replay_benchmarks_opt_into_experiments_per_pod() -> None:
    config = PlacementConfig(experimental_policies=True)
    p = Planner(ClusterState(config))
    p.state.upsert_node(make_node("a", 1))
    pod = make_info(gpumem=1000, annotations={"vgpu.io/node-policy": "fragaware-gpusteps"})
    assert p.evaluate(pod).best()[0] == "a"  # type: ignore[index]
    assert p.policy("fragaware-gpusteps").name  # resolved through the registry like any other name
    assert PlacementConfig().experimental_policies is False


def test_per_pod_policy_annotation_overrides_the_cluster_default() -> None:
    p = Planner(ClusterState(PlacementConfig(node_policy="binpack")))
    for name in ("a", "b"):
        p.state.upsert_node(make_node(name, 1))
    p.state.apply("ns/x", make_assignment("a", [(0, 40000, 50)], role=Role.DECODE))
    assert p.evaluate(make_info(gpumem=1000)).best()[0] == "a"  # type: ignore[index]
    spread = make_info(gpumem=1000, annotations={"vgpu.io/node-policy": "spread"})
    assert p.evaluate(spread).best()[0] == "b"  # type: ignore[index]


def test_a_bad_cluster_default_fails_at_construction() -> None:
    with pytest.raises(UnknownPolicyError, match="'tetris'"):
        Planner(ClusterState(PlacementConfig(node_policy="tetris")))


def test_best_of_an_empty_evaluation_is_none() -> None:
    assert Evaluation().best() is None
    ev = Evaluation(feasible={"a": NodeResult(None, 0.2), "b": NodeResult(None, 0.7)})
    assert ev.best() == ("b", ev.feasible["b"])
