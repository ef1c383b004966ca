"""The kubelet's Topology Manager rules (k8s.io/kubernetes v1.34.4) and the extender's agreement with them.

The first tests pin the model to the kubelet's source (hint generation, the per-policy merge, the
devicesToAllocate narrowing). The matrix then runs the real extender fit (vgpu.fit with the hook) and the
real GetPreferredAllocation answer (device_plugin.matching.preferred) through the modelled kubelet, per
policy, on a 2-NUMA node: every placement the extender makes is admitted with replicas on exactly the
assigned GPUs, and what a policy must refuse is refused by the extender before binding, with a reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_plugin.matching import preferred as plugin_preferred
from device_plugin.pods import PodRecord
from tests.conftest import make_container, make_info
from vgpu import kubelet_topology as kt
from vgpu.annotations import Assignment, BindPhase
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, GpuUsage, Holder

M0, M1, M01 = frozenset({0}), frozenset({1}), frozenset({0, 1})
NUMA = (0, 0, 1, 1)
SPLIT = 4
MEM = 81920


def topo(per_numa: dict[int, int]) -> dict[str, kt.Mask]:
    return {f"d{n}-{i}": frozenset({n}) for n, c in per_numa.items() for i in range(c)}


# --- the kubelet's rules ----------------------------------------------------------------------------


def test_bitmask_iteration_and_narrowness_follow_bitmask_go() -> None:
    assert kt.iterate_masks([0, 1]) == [M0, M1, M01]
    assert kt.is_narrower(M0, M1) and not kt.is_narrower(M1, M0)  # a tie goes to the lower NUMA node
    assert kt.is_narrower(M1, M01)


def test_device_hints_prefer_every_single_numa_node_that_can_hold_the_request() -> None:
    t = topo({0: 2, 1: 2})
    assert kt.device_hints(t, set(t), 1, [0, 1]) == [kt.Hint(M0, True), kt.Hint(M1, True), kt.Hint(M01, False)]
    # Three devices fit on no single NUMA node: only the wide mask, and it is preferred (minAffinitySize 2).
    assert kt.device_hints(t, set(t), 3, [0, 1]) == [kt.Hint(M01, True)]
    assert kt.device_hints(t, {"d0-0"}, 2, [0, 1]) == []  # fewer free than requested
    assert kt.device_hints({"a": frozenset()}, {"a"}, 1, [0, 1]) is None  # no topology: no preference


def test_min_affinity_counts_every_advertised_device_not_only_free_ones() -> None:
    t = topo({0: 2, 1: 2})
    # NUMA 0 could hold 2 (all devices), so only single-NUMA masks are preferred even when just one is free
    # on each: the wide mask that can serve the request is not preferred.
    assert kt.device_hints(t, {"d0-0", "d1-0"}, 2, [0, 1]) == [kt.Hint(M01, False)]


@pytest.mark.parametrize(
    ("policy", "hints", "want", "admit"),
    [
        ("none", [kt.Hint(M1, True)], kt.Hint(None, False), True),
        ("best-effort", [kt.Hint(M0, True), kt.Hint(M1, True)], kt.Hint(M0, True), True),
        ("best-effort", [kt.Hint(M01, False)], kt.Hint(M01, False), True),
        ("best-effort", [], kt.Hint(M01, False), True),
        ("restricted", [kt.Hint(M01, False)], kt.Hint(M01, False), False),
        ("restricted", [kt.Hint(M1, True), kt.Hint(M01, False)], kt.Hint(M1, True), True),
        ("single-numa-node", [kt.Hint(M01, True)], kt.Hint(None, False), False),
        ("single-numa-node", [kt.Hint(M0, True), kt.Hint(M1, True)], kt.Hint(M0, True), True),
        ("single-numa-node", None, kt.Hint(None, True), True),
    ],
)
def test_merge_per_policy(policy: kt.Policy, hints: list[kt.Hint] | None, want: kt.Hint, admit: bool) -> None:
    assert kt.merge(policy, [hints], [0, 1]) == (want, admit)


def test_merge_intersects_providers_and_a_disagreeing_cpu_hint_moves_the_choice() -> None:
    gpu = [kt.Hint(M0, True), kt.Hint(M1, True), kt.Hint(M01, False)]
    cpu = [kt.Hint(M1, True), kt.Hint(M01, False)]  # CPUs free only on NUMA 1
    assert kt.merge("single-numa-node", [gpu, cpu], [0, 1]) == (kt.Hint(M1, True), True)


def test_devices_to_allocate_offers_only_the_hint_numa_when_it_holds_more_than_needed() -> None:
    t = topo({0: 2, 1: 2})
    asked: list[list[str]] = []

    def pref(avail: list[str], must: list[str], size: int) -> list[str]:
        asked.append(avail)
        return []  # the assigned GPU is not among them: the kubelet then picks itself

    a = kt.devices_to_allocate(t, set(t), 1, M0, pref)
    assert asked == [["d0-0", "d0-1"]] and a.offered == ("d0-0", "d0-1") and a.fallback == a.chosen
    # No hint (policy none): every free device is offered.
    b = kt.devices_to_allocate(t, set(t), 1, None, lambda av, m, s: [av[-1]])
    assert b.offered == tuple(sorted(t)) and b.chosen == ("d1-1",) and not b.fallback


def test_devices_to_allocate_takes_the_whole_aligned_set_first_when_it_is_not_larger_than_needed() -> None:
    t = topo({0: 2, 1: 2})
    a = kt.devices_to_allocate(t, {"d0-0", "d1-0", "d1-1"}, 2, M0, lambda av, m, s: [*m, "d1-1"])
    assert a.forced == ("d0-0",) and a.must_include == ("d0-0",) and set(a.chosen) == {"d0-0", "d1-1"}


# --- the extender's hook against the modelled kubelet ------------------------------------------------


def node(policy: kt.Policy, *, advertise: str = "auto", scope: kt.Scope = "container") -> NodeInventory:
    gpus = tuple(
        GpuDevice(uuid=f"GPU-{i}", index=i, model="H100", memory_mib=MEM, split_count=SPLIT, numa=NUMA[i])
        for i in range(4)
    )
    shown = kt.advertises_numa(policy, advertise)  # type: ignore[arg-type]
    return NodeInventory("n", gpus, kubelet=kt.NodePolicy(policy=policy, scope=scope, numa_advertised=shown))


def state(inv: NodeInventory, held: dict[int, list[int]]) -> ClusterState:
    """`held`: GPU index -> MiB of each slice already on it (other pods, each holding one replica)."""
    s = ClusterState()
    s.upsert_node(inv)
    for i, sizes in held.items():
        u: GpuUsage = s.nodes["n"].gpus[i]
        for k, mib in enumerate(sizes):
            u.add(Holder(f"ns/other-{i}-{k}", Role.PREFILL_DECODE, None, mib, 10))
    return s


LowFirst = lambda u, m, c, p: float(u.device.index)  # noqa: E731 - GPU policy ranking NUMA 0 first
HighFirst = lambda u, m, c, p: float(-u.device.index)  # noqa: E731 - ... and NUMA 1 first (binpack-like)
FULL = [MEM // SPLIT] * SPLIT  # every replica and all memory held

# The four cases of the must-show on a 2-NUMA node (GPUs 0,1 on NUMA 0; 2,3 on NUMA 1): what is already
# held, the pod's vGPU count, and the NUMA nodes its GPUs end on when the kubelet admits it.
CASES: dict[str, tuple[dict[int, list[int]], int]] = {
    "1 vGPU on NUMA 0": ({}, 1),
    "1 vGPU on NUMA 1": ({0: FULL, 1: FULL}, 1),
    "2 vGPUs on one NUMA node": ({0: FULL, 1: FULL}, 2),
    "2 vGPUs across NUMA nodes": ({0: FULL, 1: FULL[:3], 2: FULL[:3], 3: FULL}, 2),
}
WHERE = {
    "1 vGPU on NUMA 0": {0},
    "1 vGPU on NUMA 1": {1},
    "2 vGPUs on one NUMA node": {1},
    "2 vGPUs across NUMA nodes": {0, 1},
}


def plugin_for(pod: PodInfo, assignment: Assignment) -> Callable[[str], kt.Preferred]:
    record = PodRecord(
        namespace=pod.namespace, name=pod.name, uid="uid", node="n", bind_phase=BindPhase.ALLOCATING,
        assignment=assignment,
    )  # fmt: skip

    names = [c.name for c in assignment.containers]

    def for_container(name: str) -> kt.Preferred:
        served = {("uid", n) for n in names[: names.index(name)]}  # the earlier containers were allocated
        return lambda avail, must, size: plugin_preferred(
            avail, must, size, [record], node="n", kubelet=None, served=served
        )

    return for_container


def kubelet_admits(s: ClusterState, pod: PodInfo, placement: NodePlacement) -> kt.Admission:
    inv = s.nodes["n"].inventory
    assert inv.kubelet is not None
    gpus = kt.replicas_of(s.nodes["n"].gpus, {})
    containers = [(c.name, len(c.devices)) for c in placement.containers]
    return kt.admit_pod(inv.kubelet, gpus, containers, plugin_for(pod, placement.assignment(pod)))


def served_gpus(adm: kt.Admission, container: str) -> list[str]:
    return [r.rpartition("::")[0] for r in adm.allocations[container].chosen]


MATRIX = [(p, c, r) for p in kt.POLICIES for c in CASES for r in ("low-first", "high-first")]


@pytest.mark.parametrize(("policy", "case", "rank"), MATRIX)
def test_every_placement_is_admitted_on_the_assigned_gpus_or_refused_before_binding(
    policy: kt.Policy, case: str, rank: str
) -> None:
    held, count = CASES[case]
    s = state(node(policy), held)
    pod = make_info(gpu=count, gpumem=10000)
    fit = fit_node(s.nodes["n"], pod, s.config, LowFirst if rank == "low-first" else HighFirst)
    must_refuse = policy in ("restricted", "single-numa-node") and case == "2 vGPUs across NUMA nodes"
    if must_refuse:
        assert isinstance(fit, FitFailure)
        assert "Topology Manager" in fit.reason and "would refuse 2 vGPU(s)" in fit.reason
        assert "NUMA 0: 1, NUMA 1: 1" in fit.reason  # says what the kubelet has to offer
        # ... and the kubelet would indeed refuse it (TopologyAffinityError), so nothing was lost.
        gpus = kt.replicas_of(s.nodes["n"].gpus, {})
        adm = kt.admit_pod(s.nodes["n"].inventory.kubelet, gpus, [("main", 2)], lambda _: lambda a, m, n: [])  # type: ignore[arg-type]
        assert not adm.admitted and "TopologyAffinityError" in adm.reason
        return
    assert isinstance(fit, NodePlacement), fit
    assigned = [d.uuid for d in fit.containers[0].devices]
    inv = s.nodes["n"].inventory
    assert inv.kubelet is not None
    if rank == "low-first" or inv.kubelet.narrows:  # else the GPU policy may take NUMA 1 on an empty node
        assert {NUMA[int(u[-1])] for u in assigned} == WHERE[case]
    adm = kubelet_admits(s, pod, fit)
    assert adm.admitted, adm.reason
    got = served_gpus(adm, "main")
    assert sorted(got) == sorted(assigned) and len(set(got)) == len(got)
    assert not adm.allocations["main"].fallback  # the plugin's answer decided, not the kubelet's fallback


def test_the_issue_reproduced_without_the_hook_only_one_of_four_is_admitted_under_best_effort() -> None:
    """NUMA advertised, the extender ignoring the kubelet (a GPU policy ranking NUMA 1 first): the kubelet
    offers only NUMA 0 replicas and then picks on its own. Only the case it would have picked itself works."""
    outcomes = {}
    for case, (held, count) in CASES.items():
        inv = node("best-effort", advertise="always")
        s = state(NodeInventory(inv.name, inv.gpus), held)  # no kubelet policy known: no hook
        pod = make_info(gpu=count, gpumem=10000)
        fit = fit_node(s.nodes["n"], pod, s.config, HighFirst)
        if case == "1 vGPU on NUMA 0":  # what the kubelet's tie-break gives; force it onto NUMA 0's GPU
            fit = fit_node(s.nodes["n"], pod, s.config, LowFirst)
        assert isinstance(fit, NodePlacement)
        assert inv.kubelet is not None
        gpus = kt.replicas_of(s.nodes["n"].gpus, {})
        adm = kt.admit_pod(inv.kubelet, gpus, [("main", count)], plugin_for(pod, fit.assignment(pod)))
        outcomes[case] = adm.admitted and sorted(served_gpus(adm, "main")) == sorted(
            d.uuid for d in fit.containers[0].devices
        )
    # The NUMA-1 cases pass here only because NUMA 0 is full; on an empty node with a NUMA-1-first policy:
    s = state(NodeInventory("n", node("best-effort").gpus), {})
    pod = make_info(gpu=1, gpumem=10000)
    fit = fit_node(s.nodes["n"], pod, s.config, HighFirst)
    assert isinstance(fit, NodePlacement) and fit.containers[0].devices[0].uuid == "GPU-3"
    adm = kt.admit_pod(
        kt.NodePolicy("best-effort"), kt.replicas_of(s.nodes["n"].gpus, {}), [("main", 1)],
        plugin_for(pod, fit.assignment(pod)),
    )  # fmt: skip
    a = adm.allocations["main"]
    assert a.offered is not None and {r.rpartition("::")[0] for r in a.offered} == {"GPU-0", "GPU-1"}
    assert a.fallback and served_gpus(adm, "main")[0] != "GPU-3"  # the kubelet's own pick: Allocate refuses
    assert outcomes["1 vGPU on NUMA 0"]


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_with_the_hook_a_numa1_first_policy_is_moved_to_the_numa_node_the_kubelet_will_choose(
    policy: kt.Policy,
) -> None:
    s = state(node(policy), {})
    pod = make_info(gpu=2, gpumem=10000)
    fit = fit_node(s.nodes["n"], pod, s.config, HighFirst)
    assert isinstance(fit, NodePlacement)
    assert [d.uuid for d in fit.containers[0].devices] == ["GPU-1", "GPU-0"]
    adm = kubelet_admits(s, pod, fit)
    assert adm.admitted and sorted(served_gpus(adm, "main")) == ["GPU-0", "GPU-1"]


def test_numa0_full_by_memory_but_with_free_replicas_is_refused_naming_what_the_kubelet_offers() -> None:
    """The price of alignment with count-based replicas: the kubelet picks NUMA 0 (free replicas) where no
    GPU has the memory, and would never offer NUMA 1's. Refused before binding, saying so."""
    s = state(node("single-numa-node"), {0: [MEM], 1: [MEM]})
    fit = fit_node(s.nodes["n"], make_info(gpu=1, gpumem=10000), s.config, LowFirst)
    assert isinstance(fit, FitFailure) and not fit.unresolvable
    assert "not offered by the kubelet: " in fit.reason and "aligns this container to NUMA {0}" in fit.reason
    assert "NUMA 0: 6, NUMA 1: 8" in fit.reason
    # Hiding NUMA (advertise never) admits it on NUMA 1, without CPU alignment.
    s = state(node("single-numa-node", advertise="never"), {0: [MEM], 1: [MEM]})
    pod = make_info(gpu=1, gpumem=10000)
    fit = fit_node(s.nodes["n"], pod, s.config, LowFirst)
    assert isinstance(fit, NodePlacement) and fit.containers[0].devices[0].uuid == "GPU-2"
    assert kubelet_admits(s, pod, fit).admitted


def test_the_kubelet_taking_two_replicas_of_one_gpu_is_refused_before_binding() -> None:
    """NUMA 0 has exactly two free replicas, both on GPU 0: for 2 vGPUs the kubelet takes both without asking
    the plugin (needed >= aligned) - two vGPUs of one container on one GPU. The extender refuses the node."""
    s = state(node("restricted"), {0: FULL[:2], 1: FULL})
    fit = fit_node(s.nodes["n"], make_info(gpu=2, gpumem=10000), s.config, LowFirst)
    assert isinstance(fit, FitFailure)
    assert "two vGPUs of one container on GPU GPU-0" in fit.reason
    # The model agrees: the kubelet's allocation holds GPU-0 twice.
    adm = kt.admit_pod(
        kt.NodePolicy("restricted"), kt.replicas_of(s.nodes["n"].gpus, {}), [("main", 2)], lambda _: lambda a, m, n: m
    )
    assert adm.admitted and served_gpus(adm, "main") == ["GPU-0", "GPU-0"]


def test_pod_scope_aligns_the_whole_pod_to_one_numa_node() -> None:
    s = state(node("single-numa-node", scope="pod"), {})
    pod = make_info(containers=[make_container("a", gpu=1, gpumem=10000), make_container("b", gpu=1, gpumem=10000)])
    fit = fit_node(s.nodes["n"], pod, s.config, HighFirst)
    assert isinstance(fit, NodePlacement)
    assert {NUMA[int(d.uuid[-1])] for c in fit.containers for d in c.devices} == {0}


def test_node_policy_is_validated() -> None:
    with pytest.raises(ValueError, match="one of none, best-effort, restricted, single-numa-node"):
        kt.NodePolicy(policy="strict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one of container, pod"):
        kt.NodePolicy(scope="node")  # type: ignore[arg-type]


# --- the node inventory carries the policy to the extender ---------------------------------------------


def test_the_inventory_carries_the_node_policy_to_the_extender_state() -> None:
    from scheduler_extender.sync import StateSync
    from vgpu import annotations as ann

    inv = node("single-numa-node")
    assert inv.kubelet is not None
    value = kt.with_policy(ann.encode_inventory(inv.gpus), inv.kubelet)
    assert ann.decode_inventory(value) == inv.gpus  # readers of the GPUs are unaffected
    assert kt.policy_of(value) == inv.kubelet
    s = ClusterState()
    StateSync(s).node_event("ADDED", {"metadata": {"name": "n", "annotations": {ann.NODE_INVENTORY: value}}})
    assert s.nodes["n"].inventory.kubelet == inv.kubelet
    # An inventory from an older plugin has no policy: the extender assumes none (no narrowing).
    assert kt.policy_of(ann.encode_inventory(inv.gpus)) is None


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"policy": "strict"}, "topology manager policy 'strict' is not one of none, best-effort"),
        ({"numaNodes": ["0"]}, "numaNodes must be a list of NUMA node ids"),
        ({"numaAdvertised": "yes"}, "numaAdvertised must be true or false"),
        ("single-numa-node", "field 'kubelet' must be an object"),
    ],
)
def test_a_bad_policy_in_the_inventory_is_refused_naming_the_field(field: object, message: str) -> None:
    from vgpu import annotations as ann
    from vgpu.errors import CodecError

    value = ann.encode_inventory(node("none").gpus)[:-1] + ',"kubelet":' + __import__("json").dumps(field) + "}"
    with pytest.raises(CodecError, match=message.replace("(", r"\(")) as err:
        kt.policy_of(value)
    assert ann.NODE_INVENTORY in str(err.value)


def test_the_extenders_filter_drops_a_node_the_kubelet_would_refuse_and_keeps_the_others() -> None:
    """What kube-scheduler gets from /filter (vgpu.planner): the single-numa-node node that could only give GPUs
    across NUMA nodes is failed with the kubelet's view as the reason; a node without that policy stays."""
    from vgpu.planner import Planner

    p = Planner(state(node("single-numa-node"), CASES["2 vGPUs across NUMA nodes"][0]))
    gpus = tuple(dataclasses.replace(g, uuid=g.uuid.replace("GPU", "GPU-b")) for g in node("none").gpus)
    p.state.upsert_node(NodeInventory("b", gpus, kubelet=kt.NodePolicy("none")))
    got = p.evaluate(make_info(gpu=2, gpumem=10000))
    assert list(got.feasible) == ["b"]
    assert "single-numa-node" in got.failed["n"] and "would refuse 2 vGPU(s)" in got.failed["n"]


@settings(max_examples=300, deadline=None)
@given(
    policy=st.sampled_from(kt.POLICIES),
    scope=st.sampled_from(kt.SCOPES),
    numa=st.lists(st.integers(0, 1), min_size=2, max_size=6),
    held=st.lists(st.integers(0, SPLIT), min_size=6, max_size=6),
    counts=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    high_first=st.booleans(),
)
def test_whatever_the_extender_places_the_modelled_kubelet_admits_on_the_assigned_gpus(
    policy: kt.Policy, scope: kt.Scope, numa: list[int], held: list[int], counts: list[int], high_first: bool
) -> None:
    """Random 2-NUMA nodes, occupancy, policies, scopes and pods: a placement of the fit (with the hook) is
    admitted by the modelled kubelet with the plugin's answer deciding every replica, one per assigned GPU."""
    gpus = tuple(
        GpuDevice(uuid=f"GPU-{i}", index=i, model="H100", memory_mib=MEM, split_count=SPLIT, numa=n)
        for i, n in enumerate(numa)
    )
    inv = NodeInventory("n", gpus, kubelet=kt.NodePolicy(policy, scope, kt.advertises_numa(policy, "auto")))
    s = state(inv, {i: [1000] * held[i] for i in range(len(gpus))})
    pod = make_info(containers=[make_container(f"c{k}", gpu=c, gpumem=1000) for k, c in enumerate(counts)])
    fit = fit_node(s.nodes["n"], pod, s.config, HighFirst if high_first else LowFirst)
    if isinstance(fit, FitFailure):
        return
    assert inv.kubelet is not None
    adm = kt.admit_pod(
        inv.kubelet,
        kt.replicas_of(s.nodes["n"].gpus, {}),
        [(c.name, len(c.devices)) for c in fit.containers],
        plugin_for(pod, fit.assignment(pod)),
    )
    assert adm.admitted, adm.reason
    for c in fit.containers:
        got = served_gpus(adm, c.name)
        assert sorted(got) == sorted(d.uuid for d in c.devices) and len(set(got)) == len(got)
        assert not adm.allocations[c.name].fallback
