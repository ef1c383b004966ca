"""ClusterState: hard limits, atomic apply, idempotent release, orphans, and random op sequences."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.conftest import GPU_MEM, assert_invariants, make_assignment, make_node
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig, RoleRules
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.errors import CapacityError
from vgpu.roles import Role
from vgpu.state import ClusterState, GpuUsage, HostUse, slice_blocker


def snapshot(state: ClusterState) -> Any:
    """Everything observable about a state, for before/after equality."""
    return (
        dict(state.assignments),
        dict(state.orphans),
        dict(state.conflicts),
        state.version,
        {
            name: (
                n.version,
                n.cpu_used,
                n.memory_used,
                dict(n.pods),
                dict(n.role_models),
                [
                    (u.memory_used, u.cores_used, u.prefill, u.decode, u.best_effort, [vars_of(h) for h in u.holders])
                    for u in n.gpus
                ],
            )
            for name, n in state.nodes.items()
        },
    )


def vars_of(h: Any) -> tuple[object, ...]:
    return (h.pod_key, h.role, h.model, h.memory_mib, h.cores)


def _state(*nodes: NodeInventory, config: PlacementConfig | None = None) -> ClusterState:
    s = ClusterState(config)
    for n in nodes:
        s.upsert_node(n)
    return s


# --- slice_blocker: one reason per hard rule ------------------------------------------------------


def _gpu(*holders: tuple[Role, int, int], split: int = 10) -> GpuUsage:
    from vgpu.state import Holder

    u = GpuUsage(GpuDevice("g", 0, "H100", 1000, split_count=split))
    for i, (role, mem, cores) in enumerate(holders):
        u.add(Holder(f"ns/p{i}", role, None, mem, cores))
    return u


D, P, PD = Role.DECODE, Role.PREFILL, Role.PREFILL_DECODE


@pytest.mark.parametrize(
    ("holders", "split", "slice_", "config", "reason"),
    [
        ([], 10, (PD, 1000, 100), PlacementConfig(), None),
        ([], 10, (PD, 1001, 10), PlacementConfig(), "memory"),
        ([(PD, 500, 50)], 10, (PD, 600, 10), PlacementConfig(), "memory"),
        ([(PD, 500, 50)], 10, (PD, 600, 10), PlacementConfig(memory_scaling=1.2), None),
        ([(PD, 100, 60)], 10, (PD, 100, 50), PlacementConfig(), "cores"),
        ([(PD, 100, 60)], 10, (PD, 100, 50), PlacementConfig(core_scaling=1.5), None),
        ([(PD, 100, 10)], 1, (PD, 100, 10), PlacementConfig(), "split"),
        # Prefill: SMs never oversubscribed, even with core scaling, and no best-effort neighbours.
        ([(PD, 100, 60)], 10, (P, 100, 50), PlacementConfig(core_scaling=1.5), "prefill-sm"),
        ([(P, 100, 60)], 10, (PD, 100, 50), PlacementConfig(core_scaling=1.5), "prefill-sm"),
        ([(P, 100, 60)], 10, (D, 100, 40), PlacementConfig(), None),
        ([(P, 100, 60)], 10, (D, 100, 0), PlacementConfig(), "prefill-sm"),
        ([(D, 100, 0)], 10, (P, 100, 50), PlacementConfig(), "prefill-sm"),
        # Two best-effort decodes each demand the full decode MBU (0.6) of bandwidth: over the budget.
        ([(D, 100, 0)], 10, (D, 100, 0), PlacementConfig(), "decode-bandwidth"),
        ([(D, 100, 0)], 10, (D, 100, 0), PlacementConfig(roles=RoleRules(decode_bandwidth_budget=None)), None),
        ([], 10, (P, 100, 0), PlacementConfig(), None),  # alone, best effort is harmless
        (
            [(PD, 100, 60)],
            10,
            (P, 100, 50),
            PlacementConfig(roles=RoleRules(protect_prefill_sms=False), core_scaling=1.5),
            None,
        ),
        # Decode bandwidth budget.
        ([(D, 10, 10)] * 4, 10, (D, 10, 10), PlacementConfig(), "decode-bandwidth"),
        ([(D, 10, 10)] * 3, 10, (D, 10, 10), PlacementConfig(), None),
        ([(D, 10, 10)] * 4, 10, (PD, 10, 10), PlacementConfig(), None),
        # Bandwidth: 0.6 * min(1, cores / 35) per decode, budget 1.0.
        ([(D, 100, 30)], 10, (D, 100, 30), PlacementConfig(), "decode-bandwidth"),
        ([(D, 100, 30)], 10, (D, 100, 20), PlacementConfig(), None),
        ([(D, 100, 30)], 10, (P, 100, 50), PlacementConfig(), None),
        ([(D, 100, 30)], 10, (D, 100, 30), PlacementConfig(roles=RoleRules(decode_sat_cores=70)), None),
        (
            [(D, 10, 10)] * 2,
            10,
            (D, 10, 10),
            PlacementConfig(roles=RoleRules(max_decode_per_gpu=2)),
            "decode-bandwidth",
        ),
    ],
)
def test_slice_blocker(
    holders: list[tuple[Role, int, int]],
    split: int,
    slice_: tuple[Role, int, int],
    config: PlacementConfig,
    reason: str | None,
) -> None:
    role, mem, cores = slice_
    assert slice_blocker(_gpu(*holders, split=split), mem, cores, role, config) == reason


# --- apply / release ------------------------------------------------------------------------------


def test_apply_and_release_account_every_slice() -> None:
    s = _state(make_node("n", 2), config=PlacementConfig())
    a = make_assignment("n", [(0, 1000, 10), (1, 2000, 20)], role=Role.DECODE, model="ns/m")
    s.apply("ns/p", a, HostUse(500, 256))
    node = s.nodes["n"]
    assert [(u.memory_used, u.cores_used, u.decode) for u in node.gpus] == [(1000, 10, 1), (2000, 20, 1)]
    assert (node.cpu_used, node.memory_used, node.role_models[(Role.DECODE, "ns/m")]) == (500, 256, 1)
    assert s.slice_of("ns/p") == a.slices()
    assert s.totals() == {
        "nodes": 1,
        "gpus": 2,
        "memory_mib": 2 * GPU_MEM,
        "memory_used_mib": 3000,
        "cores": 200,
        "cores_used": 30,
        "slices": 2,
        "pods": 1,
    }
    assert s.release("ns/p") == a
    assert (node.cpu_used, node.memory_used, dict(node.role_models)) == (0, 0, {})
    assert s.totals()["memory_used_mib"] == 0 and s.slice_of("ns/p") == []
    assert_invariants(s)


def test_failed_apply_changes_nothing() -> None:
    s = _state(make_node("n", 2))
    s.apply("ns/a", make_assignment("n", [(1, GPU_MEM - 100, 50)]))
    before = snapshot(s)
    # The first slice fits, the second does not: the whole assignment is refused.
    bad = make_assignment("n", [(0, 1000, 10), (1, 1000, 10)])
    with pytest.raises(CapacityError, match=r"pod ns/b: GPU 1 \(n-g1\) on n: memory \(memory 81820\+1000/81920 MiB"):
        s.apply("ns/b", bad, HostUse(100, 100))
    assert snapshot(s) == before
    assert "ns/b" not in s.assignments and "ns/b" not in s.orphans


@pytest.mark.parametrize(
    ("assignment", "reason"),
    [
        (make_assignment("n", [(5, 10, 10)]), "GPU n-g5 is not on node n"),
        (make_assignment("other", [(0, 10, 10)]), "node other has no GPU inventory"),
        (make_assignment("n", [(0, 60000, 10)], container="a"), None),
    ],
)
def test_check_explains(assignment: Assignment, reason: str | None) -> None:
    assert _state(make_node("n", 1)).check(assignment) == reason


def test_two_slices_of_one_pod_on_one_gpu_are_summed() -> None:
    s = _state(make_node("n", 1))
    two = Assignment(
        "n",
        (
            ContainerAssignment("a", (DeviceSlice("n-g0", 0, 50000, 50),)),
            ContainerAssignment("b", (DeviceSlice("n-g0", 0, 50000, 50),)),
        ),
    )
    assert s.check(two) is not None and "memory" in str(s.check(two))
    with pytest.raises(CapacityError):
        s.apply("ns/p", two)
    assert s.totals()["slices"] == 0


def test_apply_is_idempotent_for_the_same_assignment_only() -> None:
    s = _state(make_node("n", 1))
    a = make_assignment("n", [(0, 1000, 10)])
    s.apply("ns/p", a)
    before = snapshot(s)
    s.apply("ns/p", a)
    assert snapshot(s) == before
    with pytest.raises(CapacityError, match="already holds an assignment"):
        s.apply("ns/p", make_assignment("n", [(0, 2000, 10)]))
    assert snapshot(s) == before


def test_release_is_idempotent() -> None:
    s = _state(make_node("n", 1))
    a = make_assignment("n", [(0, 1000, 10)])
    s.apply("ns/p", a)
    assert s.release("ns/p") == a
    after = snapshot(s)
    assert s.release("ns/p") is None
    assert s.release("ns/never") is None
    assert snapshot(s) == after


def test_orphans_are_applied_when_their_node_appears() -> None:
    s = ClusterState()
    a = make_assignment("n", [(0, 1000, 10)], role=Role.PREFILL, model="ns/m")
    s.apply("ns/p", a, HostUse(100, 10))
    assert s.orphans == {"ns/p": a} and s.assignments == {}
    s.upsert_node(make_node("n", 1))
    assert s.orphans == {} and s.assignments == {"ns/p": a}
    assert (s.nodes["n"].gpus[0].prefill, s.nodes["n"].cpu_used) == (1, 100)
    assert_invariants(s)


def test_removed_node_keeps_its_pods_as_orphans_until_it_returns() -> None:
    s = _state(make_node("n", 1))
    a = make_assignment("n", [(0, 1000, 10)])
    s.apply("ns/p", a)
    s.remove_node("n")
    assert s.orphans == {"ns/p": a} and s.totals()["pods"] == 0
    s.remove_node("n")  # idempotent
    s.upsert_node(make_node("n", 1))
    assert s.assignments == {"ns/p": a} and s.orphans == {}
    assert_invariants(s)


def test_a_shrunk_inventory_reports_conflicts_and_never_overcommits() -> None:
    s = _state(make_node("n", 1))
    s.apply("ns/a", make_assignment("n", [(0, 30000, 30)]))
    s.apply("ns/b", make_assignment("n", [(0, 30000, 30)]))
    s.upsert_node(make_node("n", 1, memory_mib=40000))
    assert list(s.assignments) == ["ns/a"] and list(s.conflicts) == ["ns/b"]
    assert "memory" in s.conflicts["ns/b"]
    assert_invariants(s)
    # The conflicting pod is still releasable, and a grown inventory places it again.
    s.upsert_node(make_node("n", 1, memory_mib=GPU_MEM))
    assert sorted(s.assignments) == ["ns/a", "ns/b"]
    assert s.conflicts == {}
    assert_invariants(s)
    assert s.release("ns/b") is not None and s.release("ns/b") is None


def test_upserting_the_same_inventory_is_a_no_op() -> None:
    s = _state(make_node("n", 1))
    s.apply("ns/a", make_assignment("n", [(0, 1000, 10)]))
    before = snapshot(s)
    s.upsert_node(make_node("n", 1))
    assert snapshot(s) == before


def test_a_recreated_node_never_reuses_a_version() -> None:
    """Caches key node results on the version; a node that comes back must not look unchanged."""
    s = _state(make_node("n", 1))
    s.apply("ns/a", make_assignment("n", [(0, 1000, 10)]))
    s.release("ns/a")
    seen = {s.nodes["n"].version}
    s.remove_node("n")
    s.upsert_node(make_node("n", 2))
    for i in range(3):
        assert s.nodes["n"].version not in seen
        seen.add(s.nodes["n"].version)
        s.apply(f"ns/x{i}", make_assignment("n", [(0, 10, 1)]))
    s.upsert_node(make_node("n", 3))
    assert s.nodes["n"].version not in seen


@pytest.mark.parametrize(
    ("role", "containers", "allowed"),
    [
        # Budget 4, three decodes present: one more decode fits, two more (one pod) do not.
        (Role.DECODE, [[(0, 10, 10)]], True),
        (Role.DECODE, [[(0, 10, 10)], [(0, 10, 10)]], False),
        # A prefill pod whose second container is best effort on the same GPU would steal its SMs.
        (Role.PREFILL, [[(1, 10, 50)], [(1, 10, 0)]], False),
        (Role.PREFILL, [[(1, 10, 0)], [(1, 10, 50)]], False),
        (Role.PREFILL, [[(1, 10, 50)], [(1, 10, 50)]], True),
    ],
)
def test_limits_count_the_pods_own_slices_on_a_gpu(
    role: Role, containers: list[list[tuple[int, int, int]]], allowed: bool
) -> None:
    s = _state(make_node("n", 2))
    for i in range(3):
        s.apply(f"ns/d{i}", make_assignment("n", [(0, 10, 10)], role=Role.DECODE))
    a = Assignment(
        "n",
        tuple(
            ContainerAssignment(f"c{j}", tuple(DeviceSlice(f"n-g{g}", g, m, c) for g, m, c in slices))
            for j, slices in enumerate(containers)
        ),
        role=role,
    )
    assert (s.check(a) is None) == allowed
    if not allowed:
        with pytest.raises(CapacityError):
            s.apply("ns/p", a)
    else:
        s.apply("ns/p", a)
    assert_invariants(s)


# --- random operation sequences -------------------------------------------------------------------

NODES = ("n0", "n1", "n2")
inventories = st.builds(
    lambda name, n, mem, split: make_node(name, n, memory_mib=mem, split=split),
    st.sampled_from(NODES),
    st.integers(1, 3),
    st.sampled_from([40000, GPU_MEM]),
    st.integers(1, 4),
)
slices = st.tuples(
    st.integers(0, 3), st.sampled_from([0, 1000, 10000, 30000, 45000]), st.sampled_from([0, 10, 30, 50, 70, 100])
)
random_assignments = st.builds(
    lambda node, containers, role, model: Assignment(
        node,
        tuple(
            ContainerAssignment(f"c{j}", tuple(DeviceSlice(f"{node}-g{g}", g, m, c) for g, m, c in cs))
            for j, cs in enumerate(containers)
        ),
        role,
        model,
    ),
    st.sampled_from(NODES),
    st.lists(st.lists(slices, min_size=1, max_size=2, unique_by=lambda t: t[0]), min_size=1, max_size=2),
    st.sampled_from(list(Role)),
    st.sampled_from([None, "ns/a", "ns/b"]),
)
pod_keys = st.sampled_from([f"ns/p{i}" for i in range(8)])


class StateMachine(RuleBasedStateMachine):
    config = PlacementConfig()

    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState(self.config)

    @initialize(shapes=st.lists(st.tuples(st.integers(1, 3), st.integers(2, 4)), min_size=3, max_size=3))
    def nodes(self, shapes: list[tuple[int, int]]) -> None:
        for name, (gpus, split) in zip(NODES, shapes, strict=True):
            self.state.upsert_node(make_node(name, gpus, split=split))

    @rule(inventory=inventories)
    def upsert(self, inventory: NodeInventory) -> None:
        self.state.upsert_node(inventory)

    @rule(name=st.sampled_from(NODES))
    def remove(self, name: str) -> None:
        self.state.remove_node(name)

    @rule(key=pod_keys, assignment=random_assignments, cpu=st.integers(0, 4000))
    def apply(self, key: str, assignment: Assignment, cpu: int) -> None:
        fresh = key not in self.state.assignments and key not in self.state.orphans
        reason = self.state.check(assignment) if assignment.node in self.state.nodes else None
        before = snapshot(self.state)
        try:
            self.state.apply(key, assignment, HostUse(cpu, 0))
        except CapacityError:
            event("apply refused")
            assert snapshot(self.state) == before
            assert reason is not None or not fresh
        else:
            event("apply accepted" if key in self.state.assignments else "apply kept as orphan or conflict")
            assert reason is None or not fresh
            held = self.state.assignments.get(key) or self.state.orphans.get(key)
            assert held == assignment

    @rule(key=pod_keys)
    def release(self, key: str) -> None:
        self.state.release(key)
        assert key not in self.state.assignments and key not in self.state.orphans
        after = snapshot(self.state)
        assert self.state.release(key) is None
        assert snapshot(self.state) == after

    @invariant()
    def within_limits(self) -> None:
        assert_invariants(self.state)


class ScaledStateMachine(StateMachine):
    config = PlacementConfig(core_scaling=1.5, memory_scaling=1.25, roles=RoleRules(max_decode_per_gpu=2))


_SETTINGS = settings(
    max_examples=50, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestStateMachine = StateMachine.TestCase
TestStateMachine.settings = _SETTINGS
TestScaledStateMachine = ScaledStateMachine.TestCase
TestScaledStateMachine.settings = _SETTINGS


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("config", [StateMachine.config, ScaledStateMachine.config], ids=["default", "scaled"])
def test_long_random_sequences_stay_within_limits(seed: int, config: PlacementConfig) -> None:
    """Hundreds of random operations per run; also checks the run really placed and refused pods."""
    rng = random.Random(seed)
    s = ClusterState(config)
    for name in NODES:
        s.upsert_node(make_node(name, rng.randint(1, 3), split=rng.randint(2, 4)))
    outcomes: Counter[str] = Counter()
    for _ in range(400):
        op = rng.random()
        key = f"ns/p{rng.randrange(12)}"
        if op < 0.03:
            s.upsert_node(make_node(rng.choice(NODES), rng.randint(1, 3), memory_mib=rng.choice([40000, GPU_MEM])))
        elif op < 0.05:
            s.remove_node(rng.choice(NODES))
        elif op < 0.35:
            s.release(key)
            assert s.release(key) is None
        else:
            node = rng.choice(NODES)
            gpus = rng.sample(range(3), rng.randint(1, 2))
            a = make_assignment(
                node,
                [(g, rng.choice([0, 1000, 10000, 30000]), rng.choice([0, 10, 30, 50, 70])) for g in gpus],
                role=rng.choice(list(Role)),
                model=rng.choice([None, "ns/a"]),
            )
            before = snapshot(s)
            try:
                s.apply(key, a)
                outcomes["accepted" if key in s.assignments else "orphan"] += 1
            except CapacityError:
                outcomes["refused"] += 1
                assert snapshot(s) == before
        assert_invariants(s)
    assert outcomes["accepted"] >= 10 and outcomes["refused"] >= 10, outcomes
