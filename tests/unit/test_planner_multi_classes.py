"""Node classes for pods of several slices (`vgpu.planner._share_multi`): a node of a known class takes the class's
answer on its own GPUs, and that decides exactly what the node's own full fit and score decide.

Every node's placement (GPU UUIDs and their order), score to the last bit and failure reason is compared with the
uncached `Planner.evaluate_node` on random clusters where the same fills sit at shuffled GPU indices, through binds,
releases and relearns; some nodes have NVLink pairs, GPUs on two NUMA nodes, a cordon, an unhealthy GPU or host room
tracked, and some pods ask for GPU models or NVLink peers.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import vgpu.planner as planner_mod
from tests.conftest import make_assignment, make_container, make_info, make_node
from tests.unit.test_fit_fast import _fresh, _pattern, _same, policy_config
from vgpu.config import PlacementConfig
from vgpu.devices import Cordon
from vgpu.fit import NodePlacement
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, HostUse

MULTI: list[dict[str, object]] = [
    {"gpu": 2, "gpumem_percentage": 30, "gpucores": 30},
    {"gpu": 2, "gpumem_percentage": 20, "gpucores": 20, "role": "decode", "model": "m"},
    {"gpu": 3, "gpumem_percentage": 10, "gpucores": 10, "role": "prefill", "model": "x"},
    {"gpu": 2, "gpumem_percentage": 100, "gpucores": 100},
    {"gpu": 4, "gpumem_percentage": 100, "gpucores": 100},
    {"gpu": 8, "gpumem_percentage": 100, "gpucores": 100},
    {"gpu": 2, "gpumem_percentage": 50, "gpucores": 50, "annotations": {"vgpu.io/require-nvlink": "true"}},
    {"gpu": 2, "gpumem": 20000, "gpucores": 30, "annotations": {"vgpu.io/use-gpu-models": "H100"}},
    {"gpumem_percentage": 20, "gpucores": 20},  # one slice, beside them on the same planner
]


def _two_containers(name: str, role: str | None, model: str | None) -> PodInfo:
    """Two containers, one slice each: the second's choice sees the first's slice (a GPU may then be full)."""
    containers = [
        make_container("a", gpumem_percentage=25, gpucores=40),
        make_container("b", gpumem_percentage=50, gpucores=50),
    ]
    return make_info(name, role=role, model=model, containers=containers)


def _pods() -> list[PodInfo]:
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(MULTI)]  # type: ignore[arg-type]
    pods.append(_two_containers("c0", None, None))
    pods.append(_two_containers("c1", "prefill", "m"))
    pods.append(
        make_info(
            "c2",
            role="decode",
            model="x",
            containers=[make_container("a", gpu=2, gpumem_percentage=20), make_container("b", gpumem_percentage=10)],
        )
    )
    return pods


def _cluster(seed: int, policy: str, *, patterns: int, nodes: int = 40) -> ClusterState:
    """A few fills, each copy at shuffled GPU indices (equal states elsewhere), so most nodes share a class; fills
    leave whole GPUs empty often enough for the whole-card pods. Variants: an unhealthy GPU, host room tracked,
    NVLink pairs on two NUMA nodes, two NUMA nodes without NVLink, a cordon."""
    rng = random.Random(seed)
    fills = []
    for _ in range(patterns):
        fill = _pattern(rng)
        for g in rng.sample(range(8), rng.randrange(0, 7)):
            fill[g] = []
        fills.append(fill)
    state = ClusterState(policy_config(policy))
    for n in range(nodes):
        name = f"n{n:02d}"
        variant = rng.randrange(8)
        host = variant == 2
        inv = make_node(
            name,
            8,
            split=4,
            unhealthy=(2,) if variant == 1 else (),
            cpu_milli=12000 if host else 0,
            host_memory_mib=65536 if host else 0,
        )
        if variant in (3, 4):
            peers = variant == 3
            gpus = tuple(
                dataclasses.replace(g, nvlink_peers=(f"{name}-g{g.index ^ 1}",) if peers else (), numa=g.index // 4)
                for g in inv.gpus
            )
            inv = dataclasses.replace(inv, gpus=gpus)
        if variant == 5:
            inv = dataclasses.replace(inv, cordon=Cordon(frozenset({f"{name}-g5"})))
        state.upsert_node(inv)
        order = list(range(8))
        if rng.random() < 0.7:
            rng.shuffle(order)
        for pos, slices in enumerate(fills[rng.randrange(patterns)]):
            for k, (pct, role, model) in enumerate(slices):
                a = make_assignment(name, [(order[pos], 81920 * pct // 100, pct)], role=role, model=model)
                if state.check(a) is None:
                    cpu = rng.choice((0, 300, 1500)) if host else 0
                    state.apply(f"bg/{name}-{pos}-{k}", a, HostUse(cpu_milli=cpu, memory_mib=4096 * k))
    return state


def _scored(ev: Evaluation) -> Evaluation:
    ev.scores = {n: r.score for n, r in ev.feasible.items()}
    return ev


def _exact(ev: Evaluation, fresh: Evaluation) -> None:
    """`_same`, and each score's float to the last bit (its repr)."""
    _same(ev, fresh)
    assert {n: repr(r.score) for n, r in ev.feasible.items()} == {n: repr(r.score) for n, r in fresh.feasible.items()}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("patterns", [3, 30])  # many identical nodes; nearly all distinct
@pytest.mark.parametrize(
    "policy", ["default", "fgd", "fragaware-gpusteps", "binpack", "spread", "bestfit", "gpu-packing", "fgd+spread"]
)
def test_multi_slice_classes_decide_what_each_node_decides(seed: int, patterns: int, policy: str) -> None:
    """Through binds of the pods themselves (so nodes move between classes), releases and the default policy's
    relearns: every pod's evaluation over every node equals the uncached full path's, to the bit."""
    state = _cluster(seed, policy, patterns=patterns)
    p = Planner(state)
    rng = random.Random(seed)
    pods = _pods()
    if seed % 2:  # host asks: a node without room fails before any GPU is looked at
        pods = [
            dataclasses.replace(pod, cpu_milli=3000 * (i % 3), memory_mib=8192 * (i % 2)) for i, pod in enumerate(pods)
        ]
    placed: list[str] = []
    for step in range(6):
        for pod in pods:
            p.observe(pod)
            ev = p.evaluate(pod)
            names = list(state.nodes)
            _exact(ev, _fresh(p, pod, names))
            assert p.priorities(ev) == p.priorities(_scored(_fresh(p, pod, names)))
        for b in range(3):
            pod = dataclasses.replace(pods[rng.randrange(len(pods))], name=f"b{step}-{b}", uid=f"uid-b{step}-{b}")
            best = p.evaluate(pod).best()
            if best is not None and best[1].placement is not None:
                state.apply(pod.key, best[1].placement.assignment(pod))
                placed.append(pod.key)
        if step % 2 and placed:
            state.release(placed.pop(0))


def _full_fits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes `fit_node` runs on from here on (the planner's calls)."""
    seen: list[str] = []
    real = planner_mod.fit_node

    def counted(node, pod, config, rank, memo=None):  # type: ignore[no-untyped-def]
        seen.append(node.name)
        return real(node, pod, config, rank, memo)

    monkeypatch.setattr(planner_mod, "fit_node", counted)
    return seen


def _identical(nodes: int, slots: list[tuple[int, int, Role, str | None]], *, shuffle: bool) -> ClusterState:
    """`nodes` nodes of 8 GPUs, each holding `slots` ((gpu, percent, role, model)), at GPU indices rotated per node
    when `shuffle`."""
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(nodes):
        name = f"n{n:02d}"
        state.upsert_node(make_node(name, 8, split=4))
        for k, (g, pct, role, model) in enumerate(slots):
            at = (g + 3 * n) % 8 if shuffle else g
            state.apply(
                f"bg/{name}-{k}", make_assignment(name, [(at, 81920 * pct // 100, pct)], role=role, model=model)
            )
    return state


def test_a_class_of_identical_nodes_is_fitted_once_and_each_node_names_its_own_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """30 nodes holding the same slices at other GPU indices: one full fit per multi-slice pod, each node's own
    GPUs in the fit's order (a state's GPUs lowest index first), the same as the node's own full fit."""
    slots = [(0, 50, Role.DECODE, "default/m"), (1, 100, Role.PREFILL_DECODE, None)]
    state = _identical(30, slots, shuffle=True)
    p = Planner(state)
    fits = _full_fits(monkeypatch)
    # (The 2 x 20 % decode and 3 x 10 % prefill would put a slice on the half-full GPU or an empty one at the same
    # rank under the pod's own cold model: a tie, fitted per node.)
    for i, kw in enumerate(MULTI[:6]):
        if i in (1, 2):
            continue
        pod = make_info(f"s{i}", **kw)  # type: ignore[arg-type]
        fits.clear()
        ev = p.evaluate(pod)
        assert len(fits) == 1, kw
        _exact(ev, _fresh(p, pod, list(state.nodes)))
        chosen = {
            tuple(d.index for d in r.placement.containers[0].devices) for r in ev.feasible.values() if r.placement
        }
        assert len(chosen) > 1 or (i == 5 and not ev.feasible)  # other GPUs on other nodes; 8 whole cards fit nowhere
    # The first container's 25 % ranks the half-full GPU and an empty one apart, the second's 60 % goes on an empty
    # one only (with 50 % there instead, two states rank equal for it: fitted per node).
    two = make_info(
        "c",
        containers=[
            make_container("a", gpumem_percentage=25, gpucores=40),
            make_container("b", gpumem_percentage=60, gpucores=60),
        ],
    )
    fits.clear()
    ev = p.evaluate(two)
    assert len(fits) == 1
    _exact(ev, _fresh(p, two, list(state.nodes)))


def test_states_that_rank_equal_split_a_class_by_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode of model m and a prefill of model x at the same fill rank equal for a role-less pod (the fgd order
    reads the free share): a 2-slice pod takes one GPU of each, in index order, which differs between the nodes. The
    class splits by the order of those states' GPUs: one full fit for each order, and each node names its own GPUs."""
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(20):
        name = f"n{n:02d}"
        state.upsert_node(make_node(name, 4, split=4))
        a, b = (0, 3) if n % 2 else (3, 0)
        state.apply(f"bg/{name}-d", make_assignment(name, [(a, 20480, 25)], role=Role.DECODE, model="m"))
        state.apply(f"bg/{name}-p", make_assignment(name, [(b, 20480, 25)], role=Role.PREFILL, model="x"))
        for g in (1, 2):
            state.apply(f"bg/{name}-f{g}", make_assignment(name, [(g, 81920, 100)]))
    p = Planner(state)
    pod = make_info("s", gpu=2, gpumem_percentage=25, gpucores=25)
    fits = _full_fits(monkeypatch)
    ev = p.evaluate(pod)
    assert sorted(fits) == ["n00", "n01"]  # one node of each order
    _exact(ev, _fresh(p, pod, list(state.nodes)))
    orders = {tuple(d.index for d in r.placement.containers[0].devices) for r in ev.feasible.values() if r.placement}
    assert orders == {(0, 3)}  # lowest index first on every node, whichever state it holds
    chosen = {n: r.placement.containers[0].devices[0].uuid for n, r in ev.feasible.items() if r.placement}
    assert chosen["n00"] == "n00-g0" and chosen["n01"] == "n01-g0"


def test_numa_nodes_without_nvlink_are_not_shared_with_flat_ones() -> None:
    """The same GPU states on a flat node and on a node with two NUMA nodes: other classes (`choose` picks a set by
    NUMA node there), and each decides as its own full fit does."""
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(6):
        name = f"n{n}"
        inv = make_node(name, 4, split=4)
        if n % 2:
            inv = dataclasses.replace(inv, gpus=tuple(dataclasses.replace(g, numa=g.index // 2) for g in inv.gpus))
        state.upsert_node(inv)
        state.apply(f"bg/{name}", make_assignment(name, [(1, 81920, 100)]))
    flat, numa = state.nodes["n0"], state.nodes["n1"]
    assert flat.class_key != numa.class_key
    p = Planner(state)
    pod = make_info("s", gpu=2, gpumem_percentage=100, gpucores=100)
    ev = p.evaluate(pod)
    _exact(ev, _fresh(p, pod, list(state.nodes)))
    placement = ev.feasible["n1"].placement
    assert isinstance(placement, NodePlacement)
    assert [d.index for d in placement.containers[0].devices] == [2, 3]  # both on the NUMA node with two free


def test_a_one_container_pod_splits_a_tied_class_by_the_states_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs of a decode of model m and one of a prefill of model x, all at 25 %, rank equal for a role-less 2-slice
    pod, which takes the two lowest-index ones: nodes whose GPUs of those states sit in other orders but that take the
    same states in the same order share one fit."""
    layouts = [(0, 1, 2), (0, 2, 3), (1, 2, 3), (1, 3, 0), (2, 3, 0), (3, 0, 1)]  # GPUs of: decode, decode, prefill
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n, (d1, d2, pf) in enumerate(layouts):
        name = f"n{n}"
        state.upsert_node(make_node(name, 4, split=4))
        for k, g in enumerate((d1, d2)):
            state.apply(f"bg/{name}-d{k}", make_assignment(name, [(g, 20480, 25)], role=Role.DECODE, model="m"))
        state.apply(f"bg/{name}-p", make_assignment(name, [(pf, 20480, 25)], role=Role.PREFILL, model="x"))
        full = ({0, 1, 2, 3} - {d1, d2, pf}).pop()
        state.apply(f"bg/{name}-f", make_assignment(name, [(full, 81920, 100)]))
    p = Planner(state)
    pod = make_info("s", gpu=2, gpumem_percentage=25, gpucores=25)
    fits = _full_fits(monkeypatch)
    ev = p.evaluate(pod)
    # The states taken, in order: n0, n1, n2 (m, m); n3, n4 (x, m); n5 (m, x): one full fit for each.
    assert sorted(fits) == ["n0", "n3", "n5"]
    _exact(ev, _fresh(p, pod, list(state.nodes)))


@pytest.mark.parametrize(("percent", "cores"), [(25, 10), (10, 25)])  # memory's share the larger; the SMs'
def test_a_gpu_holding_two_slices_of_the_answer_counts_both_in_each_nodes_headroom(
    monkeypatch: pytest.MonkeyPatch, percent: int, cores: int
) -> None:
    """A prefill of two containers on nodes with one GPU left (at rotated indices): both slices go on it, and
    with 0.5 GPU-equivalents left or more (under the 2.5 cap) each node's score takes its own headroom, which must count the
    GPU's two slices together (`_Shared.flat`), as the node's own full fit does."""
    full = [(g, 100, Role.PREFILL_DECODE, None) for g in range(1, 8)]
    state = _identical(12, full, shuffle=True)
    p = Planner(state)
    pod = make_info(
        "c",
        role="prefill",
        model="m",
        containers=[
            make_container("a", gpumem_percentage=percent, gpucores=cores),
            make_container("b", gpumem_percentage=percent, gpucores=cores),
        ],
    )
    fits = _full_fits(monkeypatch)
    ev = p.evaluate(pod)
    assert len(fits) == 1 and len(ev.feasible) == 12
    for r in ev.feasible.values():
        assert r.placement is not None
        a, b = r.placement.containers
        assert a.devices[0].uuid == b.devices[0].uuid
    _exact(ev, _fresh(p, pod, list(state.nodes)))


def test_a_second_gpu_of_a_state_is_the_nodes_own_in_the_headroom_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill of 2 x 30 % on nodes with two empty GPUs (at rotated indices): it takes both, the second being its
    state's second GPU, and each node's score takes its own headroom (1.4 GPU-equivalents left, under the cap)."""
    full = [(g, 100, Role.PREFILL_DECODE, None) for g in range(2, 8)]
    state = _identical(12, full, shuffle=True)
    p = Planner(state)
    pod = make_info("c", role="prefill", model="m", gpu=2, gpumem_percentage=30, gpucores=30)
    fits = _full_fits(monkeypatch)
    ev = p.evaluate(pod)
    assert len(fits) == 1 and len(ev.feasible) == 12
    for r in ev.feasible.values():
        assert r.placement is not None
        assert len({d.uuid for d in r.placement.containers[0].devices}) == 2
    _exact(ev, _fresh(p, pod, list(state.nodes)))
