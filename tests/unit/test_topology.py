"""vgpu.topology and its use in the fit and the node score: NVLink sets first, then one NUMA node, then the rest."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GPU_MEM, make_assignment, make_container, make_info
from vgpu import annotations as ann
from vgpu.clusterfile import parse_cluster
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.errors import AnnotationError
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.planner import Planner
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, GpuUsage, slice_blocker
from vgpu.topology import WHOLE_NODE_COST, Link, _maximal_cliques, choose, node_topology

REQUIRE = {ann.POD_REQUIRE_NVLINK: "true"}


def _node(
    name: str, n: int, links: Iterable[tuple[int, int]] = (), numa: Sequence[int | None] | None = None
) -> NodeInventory:
    """`n` GPUs `<name>-g<i>`; each link (a, b) is listed on `a` only (the other end is implied)."""
    peers: dict[int, list[str]] = {i: [] for i in range(n)}
    for a, b in links:
        peers[a].append(f"{name}-g{b}")
    return NodeInventory(
        name=name,
        gpus=tuple(
            GpuDevice(
                uuid=f"{name}-g{i}",
                index=i,
                model="H100",
                memory_mib=GPU_MEM,
                numa=None if numa is None else numa[i],
                nvlink_peers=tuple(peers[i]),
            )
            for i in range(n)
        ),
    )


def _nvswitch(name: str, n: int = 8) -> NodeInventory:
    return _node(name, n, itertools.combinations(range(n), 2), [i * 2 // n for i in range(n)])


def _pairs(name: str, n: int = 8) -> NodeInventory:
    """PCIe cards with NVLink bridges between 0-1, 2-3, ...; the first half on NUMA 0."""
    return _node(name, n, [(i, i + 1) for i in range(0, n, 2)], [i * 2 // n for i in range(n)])


def _state(*nodes: NodeInventory, config: PlacementConfig | None = None) -> ClusterState:
    s = ClusterState(config or PlacementConfig())
    for n in nodes:
        s.upsert_node(n)
    return s


def _by_index(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return 0.0


def _prefer(*order: int) -> object:
    """A GPU policy that ranks the GPUs of these indexes first, in this order."""

    def rank(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        i = u.device.index
        return float(order.index(i)) if i in order else 100.0 + i

    return rank


def _indexes(fit: NodePlacement | FitFailure, container: int = 0) -> list[int]:
    assert isinstance(fit, NodePlacement), fit
    return sorted(d.index for d in fit.containers[container].devices)


# --- the facts --------------------------------------------------------------------------------------


def test_nvswitch_is_one_clique_and_bridged_pairs_are_four() -> None:
    assert [len(c) for c in node_topology(_nvswitch("a").gpus).cliques] == [8]
    pairs = node_topology(_pairs("b").gpus)
    assert [sorted(c) for c in pairs.cliques] == [[f"b-g{i}", f"b-g{i + 1}"] for i in range(0, 8, 2)]
    assert not pairs.flat


def test_hybrid_cube_mesh_has_two_fully_linked_quads() -> None:
    """DGX-1 (V100): GPUs 0-3 and 4-7 all-to-all, plus i <-> i+4; its maximal cliques are the quads and the rungs."""
    links = [
        *itertools.combinations(range(4), 2),
        *itertools.combinations(range(4, 8), 2),
        *((i, i + 4) for i in range(4)),
    ]
    topo = node_topology(_node("d", 8, links).gpus)
    sizes = sorted(len(c) for c in topo.cliques)
    assert sizes == [2, 2, 2, 2, 4, 4]
    assert topo.link(["d-g0", "d-g1", "d-g2", "d-g3"]) == Link.NVLINK
    assert topo.link(["d-g0", "d-g1", "d-g4"]) == Link.NUMA  # NUMA unknown counts as one node


def test_a_link_listed_on_one_end_counts_and_links_off_the_node_do_not() -> None:
    inv = _node("n", 2, [(0, 1)])
    stray = GpuDevice(uuid="x", index=2, model="H100", memory_mib=GPU_MEM, nvlink_peers=("elsewhere",))
    topo = node_topology((*inv.gpus, stray))
    assert topo.peers["n-g1"] == frozenset({"n-g0"})
    assert topo.peers["x"] == frozenset()


def test_flat_means_no_links_and_one_numa_value() -> None:
    assert node_topology(_node("n", 4).gpus).flat
    assert node_topology(_node("n", 4, numa=[0, 0, 0, 0]).gpus).flat
    assert not node_topology(_node("n", 4, numa=[0, 0, 1, 1]).gpus).flat
    assert not node_topology(_node("n", 4, [(0, 1)]).gpus).flat


def test_link_tiers() -> None:
    topo = node_topology(_nvswitch("a").gpus)
    assert topo.link(["a-g0", "a-g3"]) == Link.NVLINK
    assert topo.link(["a-g0", "a-g4"]) == Link.NVLINK_CROSS_NUMA
    pairs = node_topology(_pairs("b").gpus)
    assert pairs.link(["b-g0", "b-g2"]) == Link.NUMA
    assert pairs.link(["b-g0", "b-g4"]) == Link.NONE


# --- the choice -------------------------------------------------------------------------------------


def test_choose_takes_the_policys_first_set_inside_the_best_tier() -> None:
    topo = node_topology(_pairs("b").gpus)
    order = ["b-g1", "b-g2", "b-g5", "b-g3", "b-g4", "b-g0"]
    pos, link = choose(order, 2, topo)
    # The policy's favourite (g1) with its peer g0, although the pair 2-3 is ranked 2nd and 4th: lexicographic.
    assert link == Link.NVLINK and [order[i] for i in pos] == ["b-g1", "b-g0"]
    pos, link = choose(order[:3], 2, topo)  # no whole pair among g1, g2, g5: g1 and g2 share NUMA 0
    assert link == Link.NUMA and pos == [0, 1]
    pos, link = choose(["b-g1", "b-g5"], 2, topo)
    assert link == Link.NONE and pos == [0, 1]


def test_choose_on_a_flat_node_is_the_policys_order() -> None:
    topo = node_topology(_node("n", 8).gpus)
    assert choose([f"n-g{i}" for i in (5, 2, 7, 0)], 3, topo) == ([0, 1, 2], Link.NUMA)


def test_tp4_on_nvswitch_stays_on_one_numa_node() -> None:
    topo = node_topology(_nvswitch("a").gpus)
    order = [f"a-g{i}" for i in (0, 4, 5, 1, 6, 2, 7, 3)]
    pos, link = choose(order, 4, topo)
    assert link == Link.NVLINK and sorted(order[i] for i in pos) == ["a-g0", "a-g1", "a-g2", "a-g3"]


# --- the fit ----------------------------------------------------------------------------------------


def test_tp2_on_bridged_pairs_gets_a_pair_not_the_policys_first_two() -> None:
    s = _state(_pairs("b"))
    fit = fit_node(s.nodes["b"], make_info(gpu=2), s.config, _prefer(1, 2, 4, 3))  # type: ignore[arg-type]
    assert _indexes(fit) == [0, 1]  # the policy's favourite with its bridge peer


def test_topology_off_keeps_the_policys_first_two() -> None:
    s = _state(_pairs("b"), config=PlacementConfig(topology=False))
    fit = fit_node(s.nodes["b"], make_info(gpu=2), s.config, _prefer(1, 2, 4, 3))  # type: ignore[arg-type]
    assert _indexes(fit) == [1, 2]


def test_full_gpus_are_skipped_and_the_next_connected_set_taken() -> None:
    s = _state(_pairs("b"))
    s.apply("default/busy", make_assignment("b", [(0, 60000, 50), (3, 60000, 50)]))
    fit = fit_node(s.nodes["b"], make_info(gpu=2, gpumem=40000), s.config, _by_index)
    assert _indexes(fit) == [4, 5]


def test_require_nvlink_refuses_with_the_reason_and_whether_waiting_helps() -> None:
    s = _state(_pairs("b", 4), _node("pcie", 4, numa=[0, 0, 1, 1]))
    pod = make_info(gpu=2, gpumem=60000, annotations=REQUIRE)
    assert pod.require_nvlink
    s.apply("default/busy", make_assignment("b", [(0, 60000, 50), (2, 60000, 50)]))
    busy = fit_node(s.nodes["b"], pod, s.config, _by_index)
    assert isinstance(busy, FitFailure) and not busy.unresolvable
    assert busy.reason == (
        "container 'main' needs 2 GPUs that are all NVLink peers (vgpu.io/require-nvlink); "
        "of the 2 GPUs that can host its slice now, at most 1 are NVLink peers of each other"
    )
    never = fit_node(s.nodes["pcie"], pod, s.config, _by_index)
    assert isinstance(never, FitFailure) and never.unresolvable
    assert "at most 1 of this node's GPUs that could ever host it are NVLink peers" in never.reason
    assert "(no NVLink between its GPUs)" in never.reason
    tp4 = fit_node(s.nodes["b"], make_info(gpu=4, gpumem=1000, annotations=REQUIRE), s.config, _by_index)
    assert isinstance(tp4, FitFailure) and tp4.unresolvable


def test_require_nvlink_holds_with_topology_off_and_accepts_a_set_across_numa() -> None:
    s = _state(_nvswitch("a", 4), config=PlacementConfig(topology=False))
    fit = fit_node(s.nodes["a"], make_info(gpu=4, annotations=REQUIRE), s.config, _by_index)
    assert _indexes(fit) == [0, 1, 2, 3]


def test_require_nvlink_values() -> None:
    assert ann.require_nvlink({}) is False
    assert ann.require_nvlink({ann.POD_REQUIRE_NVLINK: "false"}) is False
    with pytest.raises(
        AnnotationError, match=r"vgpu.io/require-nvlink='yes' is invalid; allowed: \"true\" or \"false\""
    ):
        make_info(gpu=2, annotations={ann.POD_REQUIRE_NVLINK: "yes"})
    plain = make_info(containers=[{"name": "cpu", "image": "busybox"}], annotations={ann.POD_REQUIRE_NVLINK: "yes"})
    assert not plain.require_nvlink  # a pod without vGPUs: the key means nothing


def test_decode_prefers_a_gpu_nvlinked_to_its_prefill() -> None:
    s = _state(_pairs("b", 4))
    s.apply(
        "default/pre",
        make_assignment("b", [(3, 81920, 100)], role=Role.PREFILL, model="default/llama"),
    )
    decode = make_info("dec", role="decode", model="llama", gpu=1, gpumem=20000, gpucores=30)
    fit = fit_node(s.nodes["b"], decode, s.config, _by_index)
    assert _indexes(fit) == [2]  # GPU 3 is full; 2 is its NVLink peer
    off = _state(_pairs("b", 4), config=PlacementConfig(topology=False))
    off.apply("default/pre", make_assignment("b", [(3, 81920, 100)], role=Role.PREFILL, model="default/llama"))
    assert _indexes(fit_node(off.nodes["b"], decode, off.config, _by_index)) == [0]


# --- the node score ---------------------------------------------------------------------------------


def test_a_tp_pod_prefers_the_node_that_gives_a_connected_set() -> None:
    s = _state(_node("pcie", 8, numa=[0] * 4 + [1] * 4), _pairs("bridged"), _nvswitch("nvs"))
    plan = Planner(s)
    ev = plan.evaluate(make_info(gpu=4))
    assert max(ev.scores, key=lambda n: ev.scores[n]) == "nvs"
    assert ev.scores["bridged"] == ev.scores["pcie"]  # neither has 4 linked GPUs; both give one NUMA node
    ev2 = plan.evaluate(make_info(gpu=2))
    assert ev2.scores["bridged"] > ev2.scores["pcie"]
    single = plan.evaluate(make_info(gpu=1))
    assert single.scores["bridged"] == single.scores["pcie"] == single.scores["nvs"]  # no term for 1 GPU


def test_require_nvlink_reasons_reach_the_planners_failures() -> None:
    s = _state(_node("pcie", 8), _pairs("bridged"))
    ev = Planner(s).evaluate(make_info(gpu=4, annotations=REQUIRE))
    assert not ev.feasible
    assert set(ev.unresolvable) == {"pcie", "bridged"}
    assert "needs 4 GPUs that are all NVLink peers" in ev.unresolvable["bridged"]


# --- properties -------------------------------------------------------------------------------------


@st.composite
def _topologies(draw: st.DrawFn, name: str = "n") -> tuple[NodeInventory, list[int]]:
    n = draw(st.integers(2, 8))
    pairs = list(itertools.combinations(range(n), 2))
    links = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    numa = draw(st.lists(st.sampled_from([0, 1, None]), min_size=n, max_size=n))
    used = draw(st.lists(st.integers(0, GPU_MEM), min_size=n, max_size=n))
    return _node(name, n, links, numa), used


def _loaded(inv: NodeInventory, used: list[int], state: ClusterState) -> None:
    state.upsert_node(inv)
    for i, mem in enumerate(used):
        if mem:
            state.apply(f"default/{inv.name}-u{i}", make_assignment(inv.name, [(i, mem, 10)]))


def _best_possible(state: ClusterState, node: str, count: int, memory: int) -> Link:
    """Brute force: the best tier of any `count` GPUs of the node that can each host the slice."""
    ns = state.nodes[node]
    free = [u.device.uuid for u in ns.gpus if slice_blocker(u, memory, 10, Role.PREFILL_DECODE, state.config) is None]
    return min((ns.topology.link(list(c)) for c in itertools.combinations(free, count)), default=Link.NONE)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_topologies(), st.integers(2, 4), st.integers(1000, 40000))
def test_property_the_set_is_as_connected_as_any_set_on_the_node(
    topo_used: tuple[NodeInventory, list[int]], count: int, memory: int
) -> None:
    inv, used = topo_used
    s = ClusterState(PlacementConfig())
    _loaded(inv, used, s)
    pod = make_info(gpu=count, gpumem=memory, gpucores=10)
    fit = fit_node(s.nodes["n"], pod, s.config, _by_index)
    if isinstance(fit, FitFailure):
        assert _best_possible(s, "n", count, memory) == Link.NONE  # no set at all (min of nothing)
        assert sum(slice_blocker(u, memory, 10, pod.role, s.config) is None for u in s.nodes["n"].gpus) < count
        return
    got = s.nodes["n"].topology.link([d.uuid for d in fit.containers[0].devices])
    assert got == _best_possible(s, "n", count, memory)
    required = fit_node(
        s.nodes["n"], make_info(gpu=count, gpumem=memory, gpucores=10, annotations=REQUIRE), s.config, _by_index
    )
    if got <= Link.NVLINK_CROSS_NUMA:
        assert isinstance(required, NodePlacement)
    else:
        assert isinstance(required, FitFailure) and "NVLink peers" in required.reason


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_topologies("a"), _topologies("b"), st.integers(2, 4), st.integers(1000, 40000))
def test_property_the_best_node_gives_an_nvlink_set_when_a_node_can(
    a: tuple[NodeInventory, list[int]], b: tuple[NodeInventory, list[int]], count: int, memory: int
) -> None:
    s = ClusterState(PlacementConfig())
    _loaded(*a, s)
    _loaded(*b, s)
    ev = Planner(s).evaluate(make_info(gpu=count, gpumem=memory, gpucores=10))
    if not ev.feasible:
        return
    best = max(ev.scores, key=lambda n: ev.scores[n])
    linked = {n for n in ev.feasible if _best_possible(s, n, count, memory) <= Link.NVLINK_CROSS_NUMA}
    # A node already in use, or one the pod takes whole: no WHOLE_NODE_COST, so its NVLink set beats any other.
    in_use = {n for n, (inv, used) in (("a", a), ("b", b)) if any(used) or count >= len(inv.gpus)}
    if linked & in_use:
        assert best in linked
        placement = ev.feasible[best].placement
        assert placement is not None
        link = s.nodes[best].topology.link([d.uuid for d in placement.containers[0].devices])
        assert link <= Link.NVLINK_CROSS_NUMA


def test_pod_with_two_tp_containers_gets_a_connected_set_each() -> None:
    s = _state(_pairs("b"))
    pod = make_info(containers=[make_container("a", gpu=2), make_container("c", gpu=2)])
    fit = fit_node(s.nodes["b"], pod, s.config, _prefer(1, 2, 5, 6, 0, 3, 4, 7))  # type: ignore[arg-type]
    assert isinstance(fit, NodePlacement)
    for i in range(2):
        pair = _indexes(fit, i)
        assert pair[1] == pair[0] + 1 and pair[0] % 2 == 0


def test_cluster_file_template_pairs_bridges_neighbours_and_leaves_an_odd_gpu_alone() -> None:
    doc = {
        "version": "v1",
        "nodes": [{"name": "l40", "gpuTemplate": {"count": 3, "model": "L40S", "memoryMiB": 46068, "nvlink": "pairs"}}],
    }
    (node,), _ = parse_cluster(doc)
    assert [g.nvlink_peers for g in node.gpus] == [("GPU-l40-1",), ("GPU-l40-0",), ()]
    assert [sorted(c) for c in node_topology(node.gpus).cliques] == [["GPU-l40-0", "GPU-l40-1"]]


def test_tp2_takes_a_bridged_pair_before_breaking_an_idle_nvswitch_node() -> None:
    s = _state(_nvswitch("nvs"), _pairs("bridged"))
    plan = Planner(s)
    ev = plan.evaluate(make_info(gpu=2))
    assert max(ev.scores, key=lambda n: ev.scores[n]) == "bridged"
    s.apply("default/half", make_assignment("nvs", [(i, GPU_MEM, 100) for i in range(4)]))
    ev4 = plan.evaluate(make_info(gpu=4))
    assert ev4.scores["nvs"] > ev4.scores["bridged"]  # 4 of the 4 idle NVSwitch GPUs: a snug fit


def _term(state: ClusterState, pod: PodInfo) -> dict[str, float]:
    """Each feasible node's topology term: its score less the same node's score with topology off."""
    on = Planner(state).evaluate(pod).scores
    state.config = PlacementConfig(topology=False)
    try:
        off = Planner(state).evaluate(pod).scores
    finally:
        state.config = PlacementConfig()
    return {n: on[n] - off[n] for n in on}


def test_a_tp_pod_fills_a_node_in_use_before_breaking_an_idle_one() -> None:
    """A TP8 needs a whole idle node: a TP4 takes an equally connected set on a node in use first."""
    s = _state(_nvswitch("idle"), _nvswitch("used"), _node("pcie-idle", 8, numa=[0] * 4 + [1] * 4))
    s.apply("default/half", make_assignment("used", [(i, GPU_MEM, 100) for i in range(4)]))
    ev = Planner(s).evaluate(make_info(gpu=4))
    assert max(ev.scores, key=lambda n: ev.scores[n]) == "used"
    term = _term(s, make_info(gpu=4))
    assert term["used"] == pytest.approx(2 * (1 + 0.5 * 4 / 8 + 0.05 * 4 / 4))
    assert term["idle"] == pytest.approx(2 * (1 + 0.5 * 4 / 8 + 0.05 * 4 / 8 - WHOLE_NODE_COST))
    assert term["pcie-idle"] == pytest.approx(2 * (0.25 - WHOLE_NODE_COST))
    tp8 = _term(s, make_info(gpu=8))  # a pod that takes a node whole breaks nothing: NVLink leads as before
    assert set(tp8) == {"idle", "pcie-idle"}
    assert tp8["idle"] == pytest.approx(2 * (0.75 + 0.5 + 0.05)) and tp8["pcie-idle"] == 0


def test_a_one_numa_set_on_an_idle_node_no_longer_beats_a_node_in_use() -> None:
    """Before the whole-node cost an idle PCIe node (4 GPUs on one NUMA node) outscored a used one by 0.5."""
    numa = [0] * 4 + [1] * 4
    s = _state(_node("idle", 8, numa=numa), _node("used", 8, numa=numa))
    s.apply("default/spread", make_assignment("used", [(i, GPU_MEM, 100) for i in (0, 1, 4, 5)]))
    term = _term(s, make_info(gpu=4))
    assert term == pytest.approx({"used": 0.0, "idle": 2 * (0.25 - WHOLE_NODE_COST)})  # across NUMA vs one NUMA


def test_breaking_an_idle_nvswitch_node_for_a_tp2_weighs_less_than_a_bridged_pair_in_use() -> None:
    s = _state(_nvswitch("nvs"), _pairs("bridged"))
    s.apply("default/one", make_assignment("bridged", [(0, GPU_MEM, 100)]))
    term = _term(s, make_info(gpu=2))
    assert term["bridged"] == pytest.approx(2 * (1 + 0.5 + 0.05))
    assert term["nvs"] == pytest.approx(2 * (1 + 0.5 * 2 / 8 + 0.05 * 2 / 8 - WHOLE_NODE_COST))
    assert term["bridged"] - term["nvs"] > 2  # more than the policy's whole range: the pair in use wins


def test_flat_nodes_score_alike_idle_or_in_use() -> None:
    """openb's nodes have no topology: the term is one constant whether a node is idle or not."""
    s = _state(_node("idle", 8), _node("used", 8))
    s.apply("default/one", make_assignment("used", [(0, GPU_MEM // 2, 10)]))
    assert s.nodes["idle"].topology.flat and s.nodes["used"].topology.flat
    assert _term(s, make_info(gpu=2)) == pytest.approx({"idle": 2 * 0.25, "used": 2 * 0.25})


def test_a_node_without_links_has_no_cliques_and_no_peers() -> None:
    """The link-less shortcut (most nodes) gives what the clique search gives: nothing, for every GPU."""
    for gpus in (_node("n", 8).gpus, _node("n", 4, numa=[0, 0, 1, 1]).gpus):
        topo = node_topology(gpus)
        assert topo.cliques == () and topo.member == {}
        assert topo.peers == {g.uuid: frozenset() for g in gpus}
        assert _maximal_cliques(topo.peers) == []
    stray = GpuDevice(uuid="x", index=0, model="H100", memory_mib=GPU_MEM, nvlink_peers=("elsewhere",))
    assert node_topology((stray,)).peers == {"x": frozenset()}
