"""The warm path's re-evaluation of nodes that binds changed (`Planner._re_evaluate`): it reads the node classes a shape
knows but records none (a changed node is in a state no other node met), and keeps `_absent`'s stand-in per memoised
evaluation. Checked against the uncached `evaluate_node` on random clusters (binds of the best node, releases,
cordons, P/D pods of several models, NVLink pairs, host room) for several policies, and by what is recorded."""

from __future__ import annotations

import dataclasses
import random

import pytest

import vgpu.planner as planner_mod
from tests.conftest import make_info
from tests.unit.test_fit_fast import _class_cluster
from tests.unit.test_planner_subsets import _change, _oracle, _same
from vgpu.planner import Planner, to_priorities
from vgpu.pod import PodInfo
from vgpu.state import ClusterState

# P/D slices of several models (each model's pods share the stand-in's evaluation on nodes running neither), a pod
# without a role, and a whole card.
PODS: list[dict[str, object]] = [
    {"role": "decode", "model": "m", "gpumem_percentage": 20, "gpucores": 20},
    {"role": "decode", "model": "x", "gpumem_percentage": 20, "gpucores": 20},
    {"role": "decode", "model": "y", "gpumem_percentage": 20, "gpucores": 20},
    {"role": "prefill", "model": "m", "gpumem_percentage": 25, "gpucores": 40},
    {"role": "prefill", "model": "y", "gpumem_percentage": 25, "gpucores": 40},
    {"gpumem_percentage": 10, "gpucores": 10},
    {"gpumem_percentage": 100, "gpucores": 100},
]


def _pods(step: int) -> list[PodInfo]:
    return [make_info(f"p{step}-{i}", **kw) for i, kw in enumerate(PODS)]  # type: ignore[arg-type]


def _classes(p: Planner) -> int:
    return sum(len(c) for c in p._classes.values())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("patterns", [3, 40])
@pytest.mark.parametrize("policy", ["default", "fgd", "binpack", "random"])
def test_re_evaluated_nodes_decide_as_the_full_path(seed: int, patterns: int, policy: str) -> None:
    """kube-scheduler's loop: each pod over a rotating window (/filter's `filter_names`, /prioritize's
    `priorities_for`), bound to the best node of it; between pods releases, cordons and binds elsewhere. Each answer
    is the uncached evaluation's: failed nodes with the asking pod's reasons, priorities over the feasible ones."""
    state = _class_cluster(seed, policy, patterns=patterns, host=seed == 1)
    p = Planner(state)
    rng = random.Random(seed)
    names = sorted(state.nodes)
    for pod in _pods(0):
        p.filter_names(pod, names, unknown="no inventory")  # every shape's memo covers every node
    start = 0
    for step in range(1, 40):
        pod = rng.choice(_pods(step))  # a new pod object each time, as the service parses one a request
        size = rng.choice([6, 12, len(names)])
        window = [names[(start + k) % len(names)] for k in range(size)]
        start = (start + size) % len(names)
        passed, failed, unresolvable = p.filter_names(pod, window, unknown="no inventory")
        want = _oracle(p, pod, window)
        assert passed == [n for n in window if n in want.feasible]
        assert failed == want.failed
        assert unresolvable == want.unresolvable
        assert p.priorities_for(pod, passed) == to_priorities(want.scores, state.config.priority_mapping)
        _same(p.evaluate(pod, window), want)  # each node's GPU and score to the last bit
        if passed:
            best = max(passed, key=lambda n: want.scores[n])
            placement = want.feasible[best].placement
            assert placement is not None
            bound = dataclasses.replace(pod, name=f"b{step}", uid=f"uid-b{step}")
            state.apply(bound.key, placement.assignment(bound))
        for _ in range(rng.choice([0, 1, 2])):
            _change(state, p, rng, step, window)
        names = sorted(state.nodes)


def _bind(state: ClusterState, p: Planner, node: str, pod: PodInfo, tag: str) -> bool:
    bound = dataclasses.replace(pod, name=tag, uid=f"uid-{tag}")
    placement = p.evaluate_node(node, bound).placement
    if placement is None:
        return False
    state.apply(bound.key, placement.assignment(bound))
    return True


def _taken(state: ClusterState, p: Planner, node: str, pod: PodInfo) -> int | None:
    """The state of the GPU the pod's fit takes on the node (None: it does not fit)."""
    placement = p.evaluate_node(node, pod).placement
    if placement is None:
        return None
    return state.nodes[node].by_uuid[placement.containers[0].devices[0].uuid].state_id


def test_a_re_evaluation_records_no_class_and_reads_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node a bind changed is evaluated in full and its class is not recorded; where a pass met its new class (here:
    another node already in that state), it takes that class's answer, without a fit."""
    state = _class_cluster(0, "default", patterns=3)
    p = Planner(state)
    names = sorted(state.nodes)
    pods = _pods(0)
    pod, other = pods[5], pods[0]  # a pod without a role: no stand-in, the pass and the re-evaluation share classes
    # Two nodes of one class whose fits take a GPU of one state (a tie between states goes by index, which differs);
    # the second is bound first, so the pass below meets the state the first moves to later.
    first, second = next(
        (a, b)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if state.nodes[a].class_key == state.nodes[b].class_key
        and (k := _taken(state, p, a, other)) is not None
        and k == _taken(state, p, b, other)
    )
    assert _bind(state, p, second, other, "b0")
    p.filter_names(pod, names, unknown="no inventory")  # a pass: every class recorded, the second node's new one too
    fits: list[str] = []
    real = planner_mod.fit_node
    monkeypatch.setattr(planner_mod, "fit_node", lambda node, *a: fits.append(node.name) or real(node, *a))

    # A bind that leaves a node in a class the pass did not meet: evaluated in full, nothing recorded.
    known = set().union(*p._classes.values())
    for lone in names:
        if (
            lone not in (first, second)
            and _bind(state, p, lone, other, f"b1-{lone}")
            and state.nodes[lone].class_key not in known
        ):
            break
    else:
        pytest.fail("no node left a known class")
    fits.clear()
    recorded = _classes(p)
    passed, failed, _ = p.filter_names(pod, names, unknown="no inventory")
    assert lone in fits
    assert _classes(p) == recorded
    want = _oracle(p, pod, names)
    assert passed == [n for n in names if n in want.feasible] and failed == want.failed

    # The first node bound as the second was: its new class is the second's, known from the pass: no fit.
    assert _bind(state, p, first, other, "b2")
    assert state.nodes[first].class_key == state.nodes[second].class_key
    fits.clear()
    passed, failed, _ = p.filter_names(pod, names, unknown="no inventory")
    assert fits == []
    want = _oracle(p, pod, names)
    assert passed == [n for n in names if n in want.feasible] and failed == want.failed
    assert p.priorities_for(pod, passed) == to_priorities(want.scores, state.config.priority_mapping)


def test_each_memo_keeps_its_own_stand_in() -> None:
    """Pods of two P/D shapes, of models no node runs: each memo re-evaluates changed nodes through its own shape's
    stand-in (a stand-in kept once for the planner would evaluate the second shape as the first)."""
    state = _class_cluster(1, "default", patterns=40)
    p = Planner(state)
    names = sorted(state.nodes)
    pods = _pods(0)
    decode, prefill = pods[2], pods[4]  # model y: no node runs it
    for step in range(6):
        for pod in (decode, prefill):
            pod = dataclasses.replace(pod, name=f"{pod.name}-{step}", uid=f"{pod.uid}-{step}")
            passed, failed, _ = p.filter_names(pod, names, unknown="no inventory")
            want = _oracle(p, pod, names)
            assert passed == [n for n in names if n in want.feasible]
            assert failed == want.failed
            assert p.priorities_for(pod, passed) == to_priorities(want.scores, state.config.priority_mapping)
            _same(p.evaluate(pod, names), want)
        for k, pod in enumerate(pods[:2]):  # binds of other models on a few nodes: both memos re-evaluate them
            bound = dataclasses.replace(pod, name=f"b{step}-{k}", uid=f"uid-b{step}-{k}")
            node = names[(3 * step + k) % len(names)]
            placement = p.evaluate_node(node, bound).placement
            if placement is not None:
                state.apply(bound.key, placement.assignment(bound))


def test_a_kept_stand_in_never_outlives_its_cache_in_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """With more shapes than the caches' LRU bound, a stand-in's per-node cache leaves `Planner._cache`: the memo then
    makes its stand-in again instead of keeping the old cache alive past the bound; decisions as the full path's."""
    monkeypatch.setattr(planner_mod, "_CACHED_SHAPES", 4)  # three memos fit, their three stand-ins' caches do not
    state = _class_cluster(2, "default", patterns=40)
    p = Planner(state)
    names = sorted(state.nodes)
    made: list[str] = []
    real = Planner._absent
    monkeypatch.setattr(Planner, "_absent", lambda self, pod, *a: made.append(pod.name) or real(self, pod, *a))
    shapes = [
        {"role": "decode", "model": "y", "gpumem_percentage": 15, "gpucores": 15},
        {"role": "decode", "model": "y", "gpumem_percentage": 20, "gpucores": 20},
        {"role": "prefill", "model": "y", "gpumem_percentage": 25, "gpucores": 40},
    ]
    for step in range(8):
        for k, kw in enumerate(shapes):
            for j in range(2):  # binds elsewhere (model m): every memo has changed nodes to re-evaluate
                _bind(state, p, names[(5 * step + 2 * k + j) % len(names)], _pods(0)[0], f"b{step}-{k}-{j}")
            pod = make_info(f"y{step}-{k}", **kw)  # type: ignore[arg-type]
            passed, failed, _ = p.filter_names(pod, names, unknown="no inventory")
            want = _oracle(p, pod, names)
            assert passed == [n for n in names if n in want.feasible] and failed == want.failed
            _same(p.evaluate(pod, names), want)
            memo = next(reversed(p._memo.values()))  # this pod's (the last used)
            if memo.absent is not None and memo.absent[2] is not None:
                assert p._cache.get(memo.absent[2].key) is memo.absent[2].cache
    assert len(made) > len(shapes)  # stand-ins made again after their caches left
