"""The planner's per-shape caches key a pod without its model where nothing reads the model (`vgpu.planner._shape`):
pods of other models share an evaluation only where that decides exactly what each pod's own would."""

from __future__ import annotations

import dataclasses
import random

import pytest

import vgpu.planner as planner_mod
from tests.conftest import make_container, make_info
from tests.unit.test_fit_fast import _class_cluster, _fresh, _same
from vgpu.planner import Planner, _shape
from vgpu.pod import PodInfo

MODELS = ("m", "x", None)  # the clusters' holders run default/m and default/x
ROLES = (None, "prefill", "decode", "encode-prefill", "prefill-decode", "encode")
SIZES: list[dict[str, object]] = [
    {"gpumem_percentage": 20, "gpucores": 20},
    {"gpumem_percentage": 100, "gpucores": 100},
    {"gpu": 2, "gpumem_percentage": 30, "gpucores": 30},
]


def _pods() -> list[PodInfo]:
    """Every role (and none) with each model, for each size."""
    out = []
    for size in SIZES:
        for role in ROLES:
            for model in MODELS:
                out.append(make_info(f"p{len(out)}", role=role, model=model, **size))  # type: ignore[arg-type]
    return out


def test_the_model_is_left_out_only_for_a_pod_without_a_prefill_or_decode_role() -> None:
    for pod in _pods():
        key = _shape(pod)
        assert pod.shape_key()[2] == pod.model  # `_shape` drops shape_key's third item
        names = tuple(c.container for c in pod.request.containers)  # the last item: the containers' names
        if pod.role.does_prefill or pod.role.does_decode:
            assert key == (*pod.shape_key(), names)
        else:
            assert key == (*dataclasses.replace(pod, model=None).shape_key(), names)


@pytest.mark.parametrize(("seed", "policy"), [(0, "default"), (1, "default"), (2, "fgd"), (3, "binpack")])
def test_pods_of_every_model_and_role_decide_what_each_decides_alone(seed: int, policy: str) -> None:
    """Pods of each model and role interleaved on one planner, through binds and releases: every node's placement,
    score, failure and the priorities as the uncached full path gives them for that very pod. Holders of the P/D
    roles of two models make the role order and the role score read the model: a P/D pod that took another
    model's answer would differ."""
    state = _class_cluster(seed, policy, patterns=6, nodes=32)
    p = Planner(state)
    rng = random.Random(seed)
    pods = _pods()
    placed: list[str] = []
    for step in range(4):
        rng.shuffle(pods)
        for pod in pods:
            p.observe(pod)
            ev = p.evaluate(pod)
            fresh = _fresh(p, pod, list(state.nodes))
            _same(ev, fresh)
            fresh.scores = {n: r.score for n, r in fresh.feasible.items()}
            assert p.priorities(ev) == p.priorities(fresh)
        pod = dataclasses.replace(rng.choice(pods), name=f"b{step}", uid=f"uid-b{step}")
        best = p.evaluate(pod).best()
        if best is not None and best[1].placement is not None:
            state.apply(pod.key, best[1].placement.assignment(pod))
            placed.append(pod.key)
        if step % 2 and placed:
            state.release(placed.pop(0))


def test_whole_card_pods_of_other_models_share_one_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod without a P/D role after one of another model: the same evaluation, and after a bind only the changed
    node is fitted again, once (each model re-fitted it before)."""
    state = _class_cluster(1, "default", patterns=6)
    p = Planner(state)
    fits: list[str] = []
    real = planner_mod.fit_node

    def counted(node, pod, *a, **k):  # type: ignore[no-untyped-def]
        fits.append(node.name)
        return real(node, pod, *a, **k)

    monkeypatch.setattr(planner_mod, "fit_node", counted)
    for size in ({"gpumem_percentage": 100, "gpucores": 100}, {"gpu": 2, "gpumem_percentage": 100, "gpucores": 100}):
        a, b, c = (make_info(f"w{m}", model=m, **size) for m in ("m", "x", None))  # type: ignore[arg-type]
        ev = p.evaluate(a)
        assert p.evaluate(b) is ev and p.evaluate(c) is ev
        best = ev.best()
        assert best is not None and best[1].placement is not None
        state.apply("bg/bound-" + str(len(fits)), best[1].placement.assignment(a))
        fits.clear()
        evs = [p.evaluate(pod) for pod in (b, c, a)]
        assert fits.count(best[0]) <= 1  # the changed node, once for the three (the 2-GPU shape: exactly once)
        assert len(fits) <= 1
        for pod, ev in zip((b, c, a), evs, strict=True):
            _same(ev, _fresh(p, pod, list(state.nodes)))


def test_pd_pods_of_models_a_node_does_not_run_share_its_re_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a bind, a P/D pod of a model the changed node does not run re-fits it once for every such model; a pod
    of a model it runs re-fits it on its own. Each decides what the uncached full path decides."""
    state = _class_cluster(2, "default", patterns=6)
    p = Planner(state)
    fits: list[str] = []
    real = planner_mod.fit_node

    def counted(node, pod, *a, **k):  # type: ignore[no-untyped-def]
        fits.append(node.name)
        return real(node, pod, *a, **k)

    monkeypatch.setattr(planner_mod, "fit_node", counted)
    size = {"gpumem_percentage": 20, "gpucores": 20}
    pods = {m: make_info(f"d-{m}", role="decode", model=m, **size) for m in ("a", "b", "c", "m")}  # type: ignore[arg-type]
    for pod in pods.values():
        p.evaluate(pod)
    best = p.evaluate(pods["c"]).best()
    assert best is not None and best[1].placement is not None
    node = best[0]
    state.apply("bg/bound-c", best[1].placement.assignment(pods["c"]))  # the node now runs default/c
    assert "default/c" in state.nodes[node].models
    assert "default/a" not in state.nodes[node].models and "default/b" not in state.nodes[node].models
    fits.clear()
    evs = {m: p.evaluate(pod) for m, pod in pods.items()}
    runs_m = "default/m" in state.nodes[node].models
    assert fits.count(node) == 1 + 1 + (1 if runs_m else 0)  # a and b share one; c on its own; m on its own if run
    for m, pod in pods.items():
        _same(evs[m], _fresh(p, pod, list(state.nodes)))


def test_a_node_s_models_are_those_its_pods_run() -> None:
    state = _class_cluster(3, "default", patterns=6)
    for node in state.nodes.values():
        held = {m for (_, m), n in node.role_models.items() if n > 0}
        held |= {h.model for u in node.gpus for h in u.holders}
        assert node.models == held


def test_cached_result_is_a_fresh_fit_and_a_changed_node_is_fitted_again() -> None:
    """/bind takes `Planner.cached_result`: the evaluation's own result while the node is at that version, else a
    fresh fit (never the result of the node before a bind)."""
    state = _class_cluster(4, "default", patterns=6)
    p = Planner(state)
    pods = [make_info(f"c{i}", **kw) for i, kw in enumerate(SIZES)]  # type: ignore[arg-type]
    pods.append(make_info("pd", role="prefill", model="m", gpumem_percentage=25, gpucores=40))
    for step in range(6):
        for pod in pods:
            ev = p.evaluate(pod)
            for name in state.nodes:
                got, want = p.cached_result(name, pod), p.evaluate_node(name, pod)
                assert (got.placement, got.score, got.failure) == (want.placement, want.score, want.failure)
            best = ev.best()
            if best is not None and best[1].placement is not None and pod is pods[step % len(pods)]:
                old = p.cached_result(best[0], pod)
                state.apply(f"bg/s{step}", best[1].placement.assignment(pod))
                new = p.cached_result(best[0], pod)
                assert new is not old
                want = p.evaluate_node(best[0], pod)
                assert (new.placement, new.score, new.failure) == (want.placement, want.score, want.failure)


@pytest.mark.parametrize("size", SIZES)
def test_cached_result_names_the_pods_own_containers(size: dict[str, object]) -> None:
    """Pods of one shape with other container names keep their own per-shape caches (a failure's reason names the
    containers), and /bind's `cached_result` names this pod's containers: the Assignment it writes is checked by the
    device plugin against the pod's spec (vgpu.assignment_check)."""
    state = _class_cluster(5, "default", patterns=6)
    p = Planner(state)
    first = make_info("a", role="decode", model="m", containers=[make_container("vllm", **size)])
    other = make_info("b", role="decode", model="m", containers=[make_container("server", **size)])
    assert _shape(first) != _shape(other)
    p.evaluate(first)
    p.evaluate(other)
    fitted = 0
    for name in state.nodes:
        got, want = p.cached_result(name, other), p.evaluate_node(name, other)
        assert (got.placement, got.score, got.failure) == (want.placement, want.score, want.failure)
        if got.placement is not None:
            fitted += 1
            assert [c.name for c in got.placement.assignment(other).containers] == ["server"]
    assert fitted  # the cluster has room for the shape: the names were compared


def test_cached_result_fails_naming_the_pods_own_container() -> None:
    """/bind's refusal says why this pod does not fit: a cached failure of another pod of the shape names its container."""
    state = _class_cluster(5, "default", patterns=6)
    p = Planner(state)
    first = make_info("a", containers=[make_container("vllm", gpu=64, gpumem_percentage=10)])
    other = make_info("b", containers=[make_container("server", gpu=64, gpumem_percentage=10)])
    assert not p.evaluate(first).feasible  # no node has 64 GPUs: every node's cached failure names 'vllm'
    for name in state.nodes:
        got = p.cached_result(name, other)
        assert got.failure is not None and "'server'" in got.failure.reason, got.failure
