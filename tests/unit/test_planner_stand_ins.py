"""Weighing a pod beside soft holds on a copy of the node decides what applying the holds to the state decided, and
leaves the state, its versions and every memoised evaluation as they were.

/prioritize asks, for its best-ranked nodes, whether the pod still fits beside the soft holds of pods scored before it
(scheduler_extender.holds). It used to apply each hold to the state as a stand-in, evaluate the node and release them:
two version moves per stand-in, so every memoised pod shape re-evaluated the node at its next call although its GPUs
were as before. `ClusterState.with_stand_ins` / `Planner.evaluate_beside` do it on a copy. Checked here against that
old path (apply, `evaluate_node`, release, on the same state) for every policy family, with holds that no longer fit,
that name another node or a key held already, and through binds, releases and expiries in the extender service.
"""

from __future__ import annotations

import copy
import random
import uuid
from typing import Any

import pytest

from scheduler_extender import schema
from scheduler_extender.holds import steer
from scheduler_extender.service import HOLD_PREFIX, ExtenderService
from tests.conftest import make_info
from tests.unit.test_extender_service import FakeBinder
from tests.unit.test_fit_fast import SHAPES, _cluster
from tests.unit.test_planner_subsets import _oracle, _same
from vgpu.annotations import Assignment
from vgpu.errors import CapacityError
from vgpu.planner import NodeResult, Planner
from vgpu.pod import PodInfo
from vgpu.state import ClusterState

POLICIES = ["default", "fgd", "fragaware-gpusteps", "fragaware-wg100", "random", "binpack", "bestfit"]


def _applied(
    state: ClusterState, p: Planner, node: str, pod: PodInfo, stand_ins: list[tuple[str, Assignment]]
) -> NodeResult:
    """The old path: each stand-in applied to the state in turn (one that does not fit refused), the node evaluated,
    the stand-ins released."""
    placed = []
    try:
        for key, a in stand_ins:
            try:
                state.apply(key, a)
            except CapacityError:
                continue
            if key in state.assignments:
                placed.append(key)
        return p.evaluate_node(node, pod)
    finally:
        for key in placed:
            state.release(key)


def _snapshot(state: ClusterState, node: str) -> tuple[object, ...]:
    n = state.nodes[node]
    gpus = tuple((u.memory_used, u.cores_used, tuple(u.holders), u.prefill, u.decode, u.best_effort) for u in n.gpus)
    return (state.version, n.version, gpus, dict(n.pods), dict(n.role_models), n.cpu_used, n.memory_used, n.class_key)


def _holds_for(
    state: ClusterState, p: Planner, rng: random.Random, node: str, step: int
) -> list[tuple[str, Assignment]]:
    """What /prioritize would hold on `node` for 1-4 pods scored before: each one's placement on the node as it is,
    so together they may not fit; now and then one naming another node, a key the state holds, or a key twice."""
    out: list[tuple[str, Assignment]] = []
    for k in range(rng.randint(1, 4)):
        held = make_info(f"h{step}-{k}", **rng.choice(SHAPES))  # type: ignore[arg-type]
        r = p.evaluate_node(node, held)
        if r.placement is not None:
            out.append((f"{HOLD_PREFIX}{held.key}", r.placement.assignment(held)))
    roll = rng.random()
    others = [n for n in sorted(state.nodes) if n != node]
    if roll < 0.15 and others:
        held = make_info(f"o{step}", **SHAPES[1])  # type: ignore[arg-type]
        r = p.evaluate_node(rng.choice(others), held)
        if r.placement is not None:
            out.insert(0, (f"{HOLD_PREFIX}{held.key}", r.placement.assignment(held)))
    elif roll < 0.25 and state.nodes[node].pods:
        key, a = next(iter(state.nodes[node].pods.items()))
        out.insert(rng.randrange(len(out) + 1), (key, a))  # a key the state holds: apply refuses or ignores it
    elif roll < 0.35 and out:
        out.append(out[0])  # the same hold twice
    return out


def _change(state: ClusterState, p: Planner, rng: random.Random, step: int) -> None:
    names = sorted(state.nodes)
    if rng.random() < 0.6 or not state.assignments:
        pod = make_info(f"b{step}", **rng.choice(SHAPES[:6]))  # type: ignore[arg-type]
        node = rng.choice(names)
        r = p.evaluate_node(node, pod)
        if r.placement is not None:
            state.apply(pod.key, r.placement.assignment(pod))
    else:
        state.release(rng.choice(sorted(state.assignments)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_a_pod_beside_stand_ins_is_decided_as_with_them_applied(seed: int, policy: str) -> None:
    state = _cluster(seed, policy, nodes=16)
    p = Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    compared = refused = 0
    for step in range(80):
        pod = rng.choice(pods)
        if step % 11 == 5:
            p.observe(pod)  # a learning policy relearns
        node = rng.choice(sorted(state.nodes))
        stand_ins = _holds_for(state, p, rng, node, step)
        before = _snapshot(state, node)
        got = p.evaluate_beside(node, pod, stand_ins)
        assert _snapshot(state, node) == before  # nothing moved: no version, no holder, no class
        assert state.changed_since(state.version) == set()
        want = _applied(state, p, node, pod, stand_ins)
        assert (got.placement, got.score, got.failure) == (want.placement, want.score, want.failure)
        compared += 1
        refused += got.placement is None and p.evaluate_node(node, pod).placement is not None
        if rng.random() < 0.5:
            _change(state, p, rng, step)
    assert compared == 80
    assert refused > 0  # some holds did block the pod: the comparison covered both answers


def test_no_stand_in_held_evaluates_the_node_itself() -> None:
    state = _cluster(1, "default", nodes=4)
    node = sorted(state.nodes)[0]
    assert state.with_stand_ins(node, []) is state.nodes[node]
    assert state.with_stand_ins("missing", []) is None
    p = Planner(state)
    pod = make_info("s", **SHAPES[0])  # type: ignore[arg-type]
    missing = p.evaluate_beside("missing", pod, [])
    assert missing.placement is None and missing.failure == p.evaluate_node("missing", pod).failure


@pytest.mark.parametrize("policy", ["default", "fgd", "binpack", "random"])
def test_memoised_evaluations_stay_valid_beside_stand_ins(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weighing pods beside holds re-evaluates no node for any memoised shape; the applied stand-ins did (the
    version moved twice for each), which is what this change removes."""
    state = _cluster(2, policy, nodes=20)
    p = Planner(state)
    rng = random.Random(2)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    names = sorted(state.nodes)
    for pod in pods:
        p.evaluate(pod, names)
    calls: list[str] = []
    real = Planner._evaluate

    def counted(self: Planner, node_name: str, *args: Any, **kwargs: Any) -> NodeResult:
        calls.append(node_name)
        return real(self, node_name, *args, **kwargs)

    monkeypatch.setattr(Planner, "_evaluate", counted)
    for step in range(10):
        node = rng.choice(names)
        p.evaluate_beside(node, rng.choice(pods), _holds_for(state, p, rng, node, step))
    calls.clear()
    for pod in pods:
        p.evaluate(pod, names)
    assert calls == []  # every memo answers from its cache
    for pod in pods:
        _same(p.evaluate(pod, names), _oracle(p, pod, names))  # and its answers are the full path's
    # The old path on a node moves its version twice a stand-in: each memoised shape evaluates the node once more.
    for step, node in enumerate(names):
        v = state.version
        _applied(state, p, node, pods[0], _holds_for(state, p, rng, node, 100 + step))
        if state.version != v:
            break
    assert state.version != v
    calls.clear()
    for pod in pods:
        p.evaluate(pod, names)
    assert calls == [node] * len(pods)


# -- the extender service: /prioritize's steering, old path against new, through binds, releases and expiries -------


def _old_steer(svc: ExtenderService, info: PodInfo, prios: dict[str, int]) -> dict[str, int]:
    """`ExtenderService._steer` as it was: the holds applied to the state as stand-ins around `evaluate_node`."""
    placed: dict[str, Assignment] = {}

    def blocked(node: str) -> bool:
        holds = svc.holds.on(node, other_than=info.key)
        if not holds:
            return False
        stand_ins = []
        try:
            for h in holds:
                try:
                    svc.state.apply(HOLD_PREFIX + h.key, h.assignment)
                except CapacityError:
                    continue
                stand_ins.append(HOLD_PREFIX + h.key)
            result = svc.planner.evaluate_node(node, info)
        finally:
            for key in stand_ins:
                svc.state.release(key)
        if result.placement is None:
            return True
        placed[node] = result.placement.assignment(info)
        return False

    prios, best = steer(prios, blocked)
    if best is not None:
        if best not in placed:
            result = svc.planner.cached_result(best, info)
            if result.placement is not None:
                placed[best] = result.placement.assignment(info)
        if best in placed:
            svc.holds.hold(info.key, best, placed[best])
    return prios


class _OldService(ExtenderService):
    def _steer(self, info: PodInfo, prios: dict[str, int]) -> dict[str, int]:
        return _old_steer(self, info, prios)


def _pod(i: int, rng: random.Random) -> dict[str, Any]:
    pct = rng.choice([10, 20, 25, 50, 100])
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": str(pct), "nvidia.com/gpucores": str(pct)}
    return {
        "metadata": {"name": f"p{i}", "namespace": "ns", "uid": str(uuid.UUID(int=rng.getrandbits(128)))},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["default", "fgd", "binpack"])
def test_the_service_steers_as_with_applied_stand_ins(seed: int, policy: str) -> None:
    """Two services on equal states, one with the old steering: the same /filter and /prioritize answers through
    unbound pods' holds piling up, binds (which end a hold), releases and holds expiring. (randomfit draws per node
    version, which the old path moved, so its draws part ways by design; its per-call answers are checked above.)"""
    clock = [0.0]
    services = []
    for cls in (_OldService, ExtenderService):
        svc = cls(_cluster(seed, policy, nodes=10), FakeBinder())
        svc.holds.clock = lambda: clock[0]
        services.append(svc)
    old, new = services
    rng = random.Random(seed)
    names = sorted(new.state.nodes)
    versions = 0
    for i in range(120):
        pod = _pod(i, rng)
        asked = rng.sample(names, rng.choice([3, 6, len(names)]))
        answers = []
        for svc in services:
            f = svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=list(asked)))
            v = svc.state.version
            prios = svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=f["NodeNames"]))
            if svc is new:
                assert svc.state.version == v  # the new steering never moves the state
            else:
                versions += svc.state.version - v
            answers.append((f, prios))
        assert answers[0] == answers[1]
        assert sorted(new.holds._by_pod) == sorted(old.holds._by_pod)
        roll = rng.random()
        key = f"ns/p{i}"
        if roll < 0.35 and key in new.holds:  # bound where it was held: the hold becomes the pod's slices
            for svc in services:
                h = svc.holds._by_pod[key]
                svc.holds.drop(key)
                svc.state.apply(key, h.assignment)
        elif roll < 0.5 and new.state.assignments:
            gone = rng.choice(sorted(k for k in new.state.assignments if k.startswith("ns/")) or [""])
            for svc in services:
                svc.state.release(gone)
        elif roll < 0.6:
            clock[0] += 6.0  # past the hold's TTL: every hold expires
    assert versions > 0  # the old path did move versions: the comparison went through held nodes
