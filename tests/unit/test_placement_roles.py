"""Role rules (docs/architecture.md, placement pipeline): prefill SMs never oversubscribed, decode budget, P/D complementarity, locality."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import GPU_MEM, assert_invariants, make_assignment, make_info, make_node
from tests.unit.test_placement_binpack import planner
from vgpu.config import RoleRules
from vgpu.fit import NodePlacement
from vgpu.placement.role_score import free_after, role_score
from vgpu.planner import Planner
from vgpu.roles import Role

POLICIES = ["binpack", "spread"]


def _gpus(p: Planner, pod_name: str = "p", **kw: object) -> tuple[str, list[int]]:
    """Best node and the GPU indices its placement uses, for a one-container pod."""
    best = p.evaluate(make_info(pod_name, **kw)).best()  # type: ignore[arg-type]
    assert best is not None, "no feasible node"
    placement = best[1].placement
    assert isinstance(placement, NodePlacement)
    return best[0], sorted(d.index for c in placement.containers for d in c.devices)


@pytest.mark.parametrize("policy", POLICIES)
def test_prefill_avoids_a_gpu_whose_sms_it_would_oversubscribe(policy: str) -> None:
    # Other roles may oversubscribe SMs; prefill never. (The decode bandwidth budget is off: two big
    # decodes share GPU 1 here.)
    p = planner(policy, core_scaling=2.0, roles=RoleRules(decode_bandwidth_budget=None))
    p.state.upsert_node(make_node("n", 2))
    p.state.apply("ns/d", make_assignment("n", [(0, 40000, 60)], role=Role.DECODE))
    p.state.apply("ns/e", make_assignment("n", [(1, 1000, 40)], role=Role.DECODE))
    # 60 + 50 > 100 on GPU 0 (binpack's favourite); 40 + 50 fits GPU 1.
    assert _gpus(p, role="prefill", gpumem=8192, gpucores=50) == ("n", [1])
    # An aggregated pod may oversubscribe (core_scaling 2.0).
    p.state.apply("ns/e2", make_assignment("n", [(1, 1000, 60)], role=Role.DECODE))
    ev = p.evaluate(make_info(role="prefill", gpumem=8192, gpucores=50))
    assert ev.feasible == {} and "would oversubscribe SMs of a prefill GPU on 2" in ev.failed["n"]
    assert "n" in p.evaluate(make_info(role="prefill-decode", gpumem=8192, gpucores=50)).feasible


@pytest.mark.parametrize("policy", POLICIES)
def test_prefill_never_lands_next_to_a_best_effort_slice(policy: str) -> None:
    p = planner(policy)
    p.state.upsert_node(make_node("n", 2))
    p.state.apply("ns/be", make_assignment("n", [(0, 40000, 0)], role=Role.DECODE))
    p.state.apply("ns/x", make_assignment("n", [(1, 1000, 10)]))
    assert _gpus(p, role="prefill", gpumem=8192, gpucores=20) == ("n", [1])
    # ... and a best-effort slice never joins a prefill.
    p.state.apply("ns/pf", make_assignment("n", [(1, 1000, 20)], role=Role.PREFILL))
    ev = p.evaluate(make_info(role="decode", gpumem=1000, gpucores=0, gpu=2))
    assert "n" in ev.failed and "would oversubscribe SMs of a prefill GPU on 1" in ev.failed["n"]


@pytest.mark.parametrize("policy", POLICIES)
def test_decode_budget_per_gpu(policy: str) -> None:
    p = planner(policy, roles=RoleRules(max_decode_per_gpu=2))
    p.state.upsert_node(make_node("n", 2))
    for i in range(2):
        p.state.apply(f"ns/d{i}", make_assignment("n", [(0, 1000, 5)], role=Role.DECODE))
    assert _gpus(p, role="decode", gpumem=1000, gpucores=5) == ("n", [1])
    assert _gpus(p, role="prefill-decode", gpu=2, gpumem=1000, gpucores=5) == ("n", [0, 1])
    ev = p.evaluate(make_info(role="decode", gpu=2, gpumem=1000, gpucores=5))
    assert "decode bandwidth budget reached on 1" in ev.failed["n"]


@st.composite
def pods(draw: st.DrawFn) -> dict[str, object]:
    role = draw(st.sampled_from(["prefill", "decode", "prefill-decode", "encode-prefill"]))
    kw: dict[str, object] = {"role": role, "model": draw(st.sampled_from(["a", "b"]))}
    kw["gpumem"] = draw(st.sampled_from([2000, 8000, 20000, 40000]))
    kw["gpucores"] = draw(st.sampled_from([0, 10, 20, 30, 50, 70]))
    kw["gpu"] = draw(st.integers(1, 2))
    return kw


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None)
@given(st.lists(pods(), min_size=5, max_size=25), st.sampled_from([1.0, 1.5, 2.0]))
def test_random_placements_never_oversubscribe_a_prefill_gpu(
    policy: str, arrivals: list[dict[str, object]], core_scaling: float
) -> None:
    """Pods of random roles and shapes placed one by one through the planner, as the extender would."""
    p = planner(policy, core_scaling=core_scaling, memory_scaling=1.0)
    for name in ("a", "b"):
        p.state.upsert_node(make_node(name, 2, split=4))
    for i, kw in enumerate(arrivals):
        pod = make_info(f"p{i}", **kw)  # type: ignore[arg-type]
        best = p.evaluate(pod).best()
        if best is None:
            continue
        assert best[1].placement is not None
        p.state.apply(pod.key, best[1].placement.assignment(pod))
        assert_invariants(p.state)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("role", "other"), [(Role.DECODE, Role.PREFILL), (Role.PREFILL, Role.DECODE)])
def test_complementarity_prefers_the_gpu_with_the_counterpart_of_the_same_model(
    policy: str, role: Role, other: Role
) -> None:
    p = planner(policy)
    p.state.upsert_node(make_node("n", 3))
    # Same usage on every GPU; only GPU 1 holds the counterpart of model m.
    p.state.apply("ns/x", make_assignment("n", [(0, 20000, 30)], role=other, model="default/other"))
    p.state.apply("ns/y", make_assignment("n", [(1, 20000, 30)], role=other, model="default/m"))
    p.state.apply("ns/z", make_assignment("n", [(2, 20000, 30)], role=Role.PREFILL_DECODE, model="default/m"))
    assert _gpus(p, role=role.value, model="m", gpumem=8192, gpucores=30) == ("n", [1])


@pytest.mark.parametrize("policy", POLICIES)
def test_a_prefill_avoids_another_prefill(policy: str) -> None:
    p = planner(policy)
    p.state.upsert_node(make_node("n", 2))
    p.state.apply("ns/x", make_assignment("n", [(0, 20000, 30)], role=Role.PREFILL, model="default/m"))
    p.state.apply("ns/y", make_assignment("n", [(1, 20000, 30)], role=Role.PREFILL_DECODE, model="default/m"))
    assert _gpus(p, role="prefill", model="m", gpumem=8192, gpucores=30) == ("n", [1])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("namespace", "model", "expected"),
    [("default", "m", "a"), ("default", "x", "b"), ("other-ns", "m", None)],
)
def test_locality_prefers_the_node_with_the_counterpart_of_the_same_model(
    policy: str, namespace: str, model: str, expected: str | None
) -> None:
    p = planner(policy)
    for name, held in (("a", "default/m"), ("b", "default/x")):
        p.state.upsert_node(make_node(name, 2))
        # The counterpart fills GPU 0, so the decode lands on GPU 1 either way: only locality differs.
        p.state.apply(f"ns/{name}", make_assignment(name, [(0, GPU_MEM, 50)], role=Role.PREFILL, model=held))
    ev = p.evaluate(make_info(role="decode", model=model, namespace=namespace, gpumem=8192, gpucores=10))
    assert set(ev.feasible) == {"a", "b"}
    for result in ev.feasible.values():
        assert [d.index for d in result.placement.containers[0].devices] == [1]  # type: ignore[union-attr]
    scores = {n: r.score for n, r in ev.feasible.items()}
    if expected is None:
        assert scores["a"] == pytest.approx(scores["b"])
    else:
        assert max(scores, key=scores.__getitem__) == expected
        assert abs(scores["a"] - scores["b"]) == pytest.approx(RoleRules().locality_weight)


def test_aggregated_pods_get_no_role_bonus() -> None:
    p = planner()
    for name in ("a", "b"):
        p.state.upsert_node(make_node(name, 1))
    p.state.apply("ns/pf", make_assignment("a", [(0, 20000, 30)], role=Role.PREFILL, model="default/m"))
    p.state.apply("ns/pd", make_assignment("b", [(0, 20000, 30)], role=Role.PREFILL_DECODE, model="default/m"))
    ev = p.evaluate(make_info(role="prefill-decode", model="m", gpumem=8192, gpucores=10))
    assert ev.feasible["a"].score == pytest.approx(ev.feasible["b"].score)


def _decode_placement(node: str) -> NodePlacement:
    return NodePlacement(node, make_assignment(node, [(0, 8192, 10)]).containers)


def _tight_and_roomy(p: Planner) -> Planner:
    for name in ("tight", "roomy"):
        p.state.upsert_node(make_node(name, 4))
        # Both hold a prefill of the pool (same locality); "tight" has two more GPUs taken.
        p.state.apply(f"ns/p-{name}", make_assignment(name, [(3, GPU_MEM, 50)], role=Role.PREFILL, model="default/m"))
    p.state.apply("ns/other", make_assignment("tight", [(1, GPU_MEM, 100), (2, GPU_MEM, 100)]))
    return p


def test_headroom_prefers_the_node_with_room_for_the_counterparts() -> None:
    p = _tight_and_roomy(planner(roles=RoleRules(pair_headroom_gpus=2.0)))
    pod = make_info(role="decode", model="m", gpumem=8192, gpucores=10)
    rules = p.config.roles
    tight, roomy = p.state.nodes["tight"], p.state.nodes["roomy"]
    # Free after the decode on GPU 0: tight 0.9 GPU-equivalents, roomy 2.9 (capped at pair_headroom_gpus 2).
    assert free_after(tight, _decode_placement("tight")) == pytest.approx(0.9)
    assert free_after(roomy, _decode_placement("roomy")) == pytest.approx(2.9)
    gap = role_score(roomy, _decode_placement("roomy"), pod, rules) - role_score(
        tight, _decode_placement("tight"), pod, rules
    )
    assert gap == pytest.approx(rules.headroom_weight * (1.0 - 0.9 / 2.0))
    # Through the planner: a headroom weight that outweighs binpack's fuller-node preference, and none.
    strong = _tight_and_roomy(planner(roles=RoleRules(headroom_weight=2.0, pair_headroom_gpus=2.0)))
    plain = _tight_and_roomy(planner(roles=RoleRules(headroom_weight=0.0)))
    assert _gpus(strong, role="decode", model="m", gpumem=8192, gpucores=10)[0] == "roomy"
    assert _gpus(plain, role="decode", model="m", gpumem=8192, gpucores=10)[0] == "tight"


def test_headroom_is_off_for_roleless_pods_and_without_role_rules() -> None:
    p = planner()
    p.state.upsert_node(make_node("n", 4))
    node = p.state.nodes["n"]
    assert role_score(node, _decode_placement("n"), make_info(gpumem=8192, gpucores=10), RoleRules()) == 0.0
    pod = make_info(role="decode", model="m", gpumem=8192, gpucores=10)
    assert role_score(node, _decode_placement("n"), pod, RoleRules.off()) == 0.0
    assert role_score(node, _decode_placement("n"), pod, RoleRules()) == pytest.approx(RoleRules().headroom_weight)


def test_a_decode_seeks_prefills_without_a_decode_and_a_prefill_still_joins_a_paired_node() -> None:
    p = planner()
    for name, second in (("paired", Role.DECODE), ("unpaired", Role.PREFILL_DECODE)):
        p.state.upsert_node(make_node(name, 4))
        p.state.apply(f"ns/p-{name}", make_assignment(name, [(0, GPU_MEM, 50)], role=Role.PREFILL, model="default/m"))
        # Same usage on both nodes: a decode of the pool on "paired", an aggregated pod on "unpaired".
        p.state.apply(f"ns/x-{name}", make_assignment(name, [(1, GPU_MEM, 50)], role=second, model="default/m"))
    decode = p.evaluate(make_info(role="decode", model="m", gpumem=8192, gpucores=10))
    scores = {n: r.score for n, r in decode.feasible.items()}
    # "unpaired": its prefill has no decode yet (locality); "paired": a second decode pairs nothing new.
    assert scores["unpaired"] - scores["paired"] == pytest.approx(RoleRules().locality_weight)
    prefill = p.evaluate(make_info(role="prefill", model="m", gpumem=8192, gpucores=10))
    scores = {n: r.score for n, r in prefill.feasible.items()}
    # A prefill gets locality next to the decode, only pool weight next to its own pool's prefill.
    assert scores["paired"] - scores["unpaired"] == pytest.approx(RoleRules().locality_weight - RoleRules().pool_weight)
