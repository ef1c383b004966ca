"""The cold-path shortcuts decide exactly what the full fit and score decide.

A one-slice pod's fit goes through `vgpu.fit._fit_one` with a per-shape memo (and, for a state-only GPU order such
as fgd's, one GPU per distinct state); the fgd-family score reuses the growth the GPU order computed; the role
score keeps each GPU's headroom term per node version. Each is checked here against the uncached full path
(`Planner.evaluate_node`, `fit_node` without a memo, the fragmentation model from scratch) on random clusters where
GPU states repeat, holders carry P/D roles, some GPUs are unhealthy or cordoned and some nodes have NVLink.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from tests.conftest import make_assignment, make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.devices import Cordon, NodeInventory
from vgpu.fit import NodePlacement, ShapeMemo, fit_node
from vgpu.placement.fgd import Fgd
from vgpu.placement.frag import FragModel
from vgpu.placement.gpushare import MILLI, frees_after, host_after
from vgpu.placement.role_score import free_after
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, HostUse, NodeState

FILLS = (0, 25, 50, 75)  # a few fill levels, so GPU states repeat on a node and across nodes
SHAPES: list[dict[str, object]] = [
    {"gpumem_percentage": 20, "gpucores": 20},
    {"gpumem_percentage": 10, "gpucores": 10},
    {"role": "prefill", "model": "m", "gpumem_percentage": 25, "gpucores": 40},
    {"role": "decode", "model": "m", "gpumem_percentage": 20, "gpucores": 20},
    {"role": "decode", "model": "x", "gpumem": 4000, "gpucores": 0},
    {"gpumem_percentage": 100, "gpucores": 100},
    {"gpu": 2, "gpumem_percentage": 30, "gpucores": 30},  # the full path, for comparison
]


def policy_config(policy: str) -> PlacementConfig:
    """`policy`, or `node+gpu`: a node policy with a cluster GPU policy override (`--gpu-policy`)."""
    node, _, gpu = policy.partition("+")
    return PlacementConfig(node_policy=node, gpu_policy=gpu or None)


def _inventory(name: str, rng: random.Random) -> NodeInventory:
    inv = make_node(name, 8, split=4, unhealthy=(3,) if rng.random() < 0.1 else ())
    if rng.random() < 0.3:  # NVLink pairs: the role order then also prefers a counterpart's peers
        gpus = tuple(
            dataclasses.replace(g, nvlink_peers=(f"{name}-g{g.index ^ 1}",), numa=g.index // 4) for g in inv.gpus
        )
        inv = dataclasses.replace(inv, gpus=gpus)
    if rng.random() < 0.1:
        inv = dataclasses.replace(inv, cordon=Cordon(frozenset({f"{name}-g0"})))
    return inv


def _cluster(seed: int, policy: str, nodes: int = 24) -> ClusterState:
    rng = random.Random(seed)
    state = ClusterState(policy_config(policy))
    for n in range(nodes):
        name = f"n{n:02d}"
        state.upsert_node(_inventory(name, rng))
        for i in range(8):
            fill = rng.choice(FILLS)
            if fill:
                role = rng.choice([Role.DECODE, Role.PREFILL, Role.PREFILL_DECODE])
                mem = 81920 * fill // 100
                a = make_assignment(name, [(i, mem, fill)], role=role, model=rng.choice(["m", "x", None]))
                state.apply(f"bg/{name}-{i}", a, HostUse())
    return state


def _fresh(p: Planner, pod: PodInfo, names: list[str]) -> Evaluation:
    out = Evaluation()
    for name in names:
        r = p.evaluate_node(name, pod)  # no shape memo: the full fit
        if r.failure is None:
            out.feasible[name] = r
        elif r.failure.unresolvable:
            out.unresolvable[name] = r.failure.reason
        else:
            out.failed[name] = r.failure.reason
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["default", "fgd", "fragaware-gpusteps", "random", "binpack", "bestfit"])
def test_memoised_evaluation_matches_the_full_fit_through_binds(seed: int, policy: str) -> None:
    state = _cluster(seed, policy)
    p = Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    for step in range(12):
        for pod in pods:
            p.observe(pod)
            names = list(state.nodes)
            ev = p.evaluate(pod)
            fresh = _fresh(p, pod, names)
            assert {n: (r.placement, r.score) for n, r in ev.feasible.items()} == {
                n: (r.placement, r.score) for n, r in fresh.feasible.items()
            }
            assert ev.failed == fresh.failed
            assert ev.unresolvable == fresh.unresolvable
        pod = make_info(f"b{step}", **rng.choice(SHAPES))  # type: ignore[arg-type]
        best = p.evaluate(pod).best()
        if best is not None and best[1].placement is not None:
            state.apply(pod.key, best[1].placement.assignment(pod))


@pytest.mark.parametrize("seed", range(3))
def test_fit_with_a_shape_memo_is_the_fit_without(seed: int) -> None:
    state = _cluster(seed, "default", nodes=40)
    policy = Fgd()
    for kw in SHAPES:
        policy.observe(make_info("w", **kw))  # type: ignore[arg-type]
    sizes = []
    for i, kw in enumerate(SHAPES):
        pod = make_info(f"s{i}", **kw)  # type: ignore[arg-type]
        memo = ShapeMemo()
        for node in state.nodes.values():
            rank = policy.node_gpu_rank(node, pod)
            fast = fit_node(node, pod, state.config, rank, memo)
            assert fast == fit_node(node, pod, state.config, policy.node_gpu_rank(node, pod))
        sizes.append(len(memo.slots))
    # One-slice shapes use the memo, and GPU states repeat: far fewer entries than GPUs. Two-slice ones do not.
    assert all(0 < n < 4 * len(state.nodes) for n in sizes[:-1]) and sizes[-1] == 0


@pytest.mark.parametrize("seed", range(3))
def test_the_reused_growth_is_the_fragmentation_model_s(seed: int) -> None:
    state = _cluster(seed, "fgd", nodes=40)
    policy = Fgd()
    reused = 0
    for kw in SHAPES:
        pod = make_info("s", **kw)  # type: ignore[arg-type]
        policy.observe(pod)
        for node in state.nodes.values():
            fit = fit_node(node, pod, state.config, policy.node_gpu_rank(node, pod))
            if not isinstance(fit, NodePlacement):
                continue
            got = policy.delta(node, fit, pod)
            reused += policy._ranked_delta(node, fit, pod) is not None
            cpu, mem = host_after(node, pod)
            model = policy.model
            assert got == model.frag(node, frees_after(node, fit), cpu, mem) - model.node_frag(node)
    assert reused > 0


def test_free_after_keeps_per_gpu_terms_per_node_version() -> None:
    state = ClusterState()
    state.upsert_node(make_node("n", 4))
    node = state.nodes["n"]
    pod = make_info("p", gpumem_percentage=50, gpucores=50)
    fit = fit_node(node, pod, state.config, lambda u, m, c, p: 0.0)
    assert isinstance(fit, NodePlacement)
    assert free_after(node, fit) == pytest.approx(3.5)
    state.apply("a/b", fit.assignment(pod))
    assert free_after(node, fit) == pytest.approx(3.0)  # the kept terms moved with the node version


# -- node classes: nodes in equal states evaluated once (vgpu.planner._Shared) --------------------------------------

CLASS_SHAPES: list[dict[str, object]] = [
    *SHAPES,
    {"role": "prefill", "model": "x", "gpumem_percentage": 50, "gpucores": 50},
    {"gpumem": 20000, "gpucores": 30, "annotations": {"vgpu.io/use-gpu-models": "H100"}},  # a model filter: per node
]


def _pattern(rng: random.Random) -> list[list[tuple[int, Role, str | None]]]:
    """A node fill: per GPU, the slices held (percent of the card, role, model)."""
    out = []
    for _ in range(8):
        slices = []
        for _k in range(rng.choice((0, 0, 1, 1, 2, 3))):
            model = rng.choice(["default/m", "default/x", None])  # make_info's pods are in namespace default
            slices.append((rng.choice((10, 20, 25)), rng.choice(list(Role)), model))
        out.append(slices)
    return out


def _class_cluster(seed: int, policy: str, *, patterns: int, nodes: int = 48, host: bool = False) -> ClusterState:
    """Nodes drawn from a few fills, each copy with its GPUs in a shuffled order (equal states at other indices), so
    most nodes share a class with others; some with a cordon, an unhealthy GPU, NVLink pairs or host room tracked."""
    rng = random.Random(seed)
    fills = [_pattern(rng) for _ in range(patterns)]
    state = ClusterState(policy_config(policy))
    for n in range(nodes):
        name = f"n{n:02d}"
        variant = rng.randrange(6)
        inv = make_node(
            name,
            8,
            split=4,
            unhealthy=(2,) if variant == 1 else (),
            cpu_milli=12000 if host and variant == 2 else 0,
            host_memory_mib=65536 if host and variant == 2 else 0,
        )
        if variant == 3:
            gpus = tuple(
                dataclasses.replace(g, nvlink_peers=(f"{name}-g{g.index ^ 1}",), numa=g.index // 4) for g in inv.gpus
            )
            inv = dataclasses.replace(inv, gpus=gpus)
        if variant == 4:
            inv = dataclasses.replace(inv, cordon=Cordon(frozenset({f"{name}-g5"})))
        state.upsert_node(inv)
        fill = fills[rng.randrange(patterns)]
        order = list(range(8))
        if rng.random() < 0.7:
            rng.shuffle(order)
        for pos, slices in enumerate(fill):
            for k, (pct, role, model) in enumerate(slices):
                a = make_assignment(name, [(order[pos], 81920 * pct // 100, pct)], role=role, model=model)
                if state.check(a) is None:
                    cpu = rng.choice((0, 300, 1500)) if host else 0  # host use apart from the GPU states
                    state.apply(f"bg/{name}-{pos}-{k}", a, HostUse(cpu_milli=cpu, memory_mib=4096 * k))
        if rng.random() < 0.3:  # a pod with no GPU slice: a (role, model) on the node that no GPU state shows
            a = dataclasses.replace(make_assignment(name, []), containers=(), role=Role.PREFILL, model="default/m")
            state.apply(f"bg/{name}-cpu", a, HostUse())
    return state


def _same(ev: Evaluation, fresh: Evaluation) -> None:
    assert {n: (r.placement, r.score) for n, r in ev.feasible.items()} == {
        n: (r.placement, r.score) for n, r in fresh.feasible.items()
    }
    assert ev.failed == fresh.failed
    assert ev.unresolvable == fresh.unresolvable


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("patterns", [3, 40])  # many identical nodes; nearly all distinct
@pytest.mark.parametrize(
    "policy",
    [
        "default",
        "fgd",
        "fragaware-gpusteps",
        "fragaware-wg100",
        "random",
        "binpack",
        "spread",
        "bestfit",
        "dotprod",
        "gpu-packing",
        "gpu-clustering",
        "default+binpack",
        "binpack+spread",
    ],
)
def test_node_classes_decide_what_each_node_decides(seed: int, patterns: int, policy: str) -> None:
    """Every node's placement (its own GPU UUID), score to the last bit and failure reason, through binds and
    releases, as the uncached full path gives it; the default policy relearns along the way."""
    state = _class_cluster(seed, policy, patterns=patterns, host=seed % 2 == 1)
    p = Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(CLASS_SHAPES)]  # type: ignore[arg-type]
    if seed % 2:  # host asks: the class key holds host use, and a node without room fails before any GPU check
        pods = [
            dataclasses.replace(pod, cpu_milli=2000 * (i % 3), memory_mib=8192 * (i % 2)) for i, pod in enumerate(pods)
        ]
    placed: list[str] = []
    for step in range(8):
        for pod in pods:
            p.observe(pod)
            ev = p.evaluate(pod)
            _same(ev, _fresh(p, pod, list(state.nodes)))
            assert p.priorities(ev) == p.priorities(_fresh_scored(p, pod, list(state.nodes)))
        pod = dataclasses.replace(pods[rng.randrange(len(pods))], name=f"b{step}", uid=f"uid-b{step}")
        best = p.evaluate(pod).best()
        if best is not None and best[1].placement is not None:
            state.apply(pod.key, best[1].placement.assignment(pod))
            placed.append(pod.key)
        if step % 3 == 2 and placed:
            state.release(placed.pop(0))


def _fresh_scored(p: Planner, pod: PodInfo, names: list[str]) -> Evaluation:
    out = _fresh(p, pod, names)
    out.scores = {n: r.score for n, r in out.feasible.items()}
    return out


def test_a_class_is_evaluated_once_and_ties_go_to_each_node_s_lowest_index() -> None:
    """Many identical nodes cost one full evaluation each class; where GPUs of two states rank equal, each node names
    its own lowest-index one of them (not the first node's index)."""
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(30):
        name = f"n{n:02d}"
        state.upsert_node(make_node(name, 4, split=4))
        # GPU a holds a decode of model m, GPU b a prefill of model x: equal free share, different states.
        a, b = (0, 3) if n % 2 else (3, 0)
        state.apply(f"bg/{name}-d", make_assignment(name, [(a, 20480, 25)], role=Role.DECODE, model="m"))
        state.apply(f"bg/{name}-p", make_assignment(name, [(b, 20480, 25)], role=Role.PREFILL, model="x"))
        for g in (1, 2):
            state.apply(f"bg/{name}-f{g}", make_assignment(name, [(g, 81920, 100)]))
    p = Planner(state)
    pod = make_info("s", gpumem_percentage=25, gpucores=25)
    fits: list[int] = []
    real = fit_node

    def counting(*args: object, **kw: object) -> object:
        fits.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    import vgpu.planner as planner_mod

    planner_mod.fit_node = counting  # type: ignore[assignment]
    try:
        ev = p.evaluate(pod)
    finally:
        planner_mod.fit_node = real
    assert len(fits) == 1  # one class: all 30 nodes hold the same multiset of GPU states
    chosen = {n: r.placement.containers[0].devices[0].index for n, r in ev.feasible.items() if r.placement}
    assert len(chosen) == 30 and set(chosen.values()) == {0}  # each node's own lowest index, 0 on both halves
    _same(ev, _fresh(p, pod, list(state.nodes)))


def test_nvlink_tells_equal_states_apart() -> None:
    """Flat and NVLink nodes in the same GPU states are not one class: on the NVLink node a decode goes next to its
    prefill's NVLink peer, on the flat one to the lowest index."""
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(6):
        name = f"n{n}"
        inv = make_node(name, 4, split=4)
        if n % 2:
            peer = {0: 3, 3: 0, 1: 2, 2: 1}
            gpus = tuple(dataclasses.replace(g, nvlink_peers=(f"{name}-g{peer[g.index]}",)) for g in inv.gpus)
            inv = dataclasses.replace(inv, gpus=gpus)
        state.upsert_node(inv)
        state.apply(f"bg/{name}", make_assignment(name, [(0, 73728, 90)], role=Role.PREFILL, model="default/m"))
    p = Planner(state)
    pod = make_info("d", role="decode", model="m", gpumem_percentage=20, gpucores=20)
    ev = p.evaluate(pod)
    chosen = {n: r.placement.containers[0].devices[0].index for n, r in ev.feasible.items() if r.placement}
    assert chosen == {f"n{n}": 3 if n % 2 else 1 for n in range(6)}
    _same(ev, _fresh(p, pod, list(state.nodes)))


def _frag_by_sums(model: FragModel, node: NodeState, sig: tuple[int, ...], cpu_free: int, mem_free: int) -> float:
    """`FragModel.frag_sorted` as it was written before prefix sums: every sum over the GPUs taken one by one."""
    gpu = node.gpus[0]
    idle = sum(sig)
    out = 0.0
    if idle:
        full = sum(1 for f in sig if f >= MILLI)
        for p, cpu, mem, count, milli, models in model._tasks_on(gpu):
            if (
                count == 0
                or cpu > cpu_free
                or mem > mem_free
                or (models is not None and gpu.device.model not in models)
                or (milli >= MILLI and full < count)
                or sig[-1] < milli
            ):
                out += p * idle
            elif milli >= MILLI:
                out += p * (idle - full * MILLI)
            else:
                out += p * sum(f for f in sig if f < milli)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_frag_by_prefix_sums_is_the_frag_summed_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    fgd = Fgd()
    for kw in [*SHAPES, *CLASS_SHAPES]:
        for _ in range(rng.randint(1, 5)):
            fgd.observe(dataclasses.replace(make_info("w", **kw), cpu_milli=rng.choice([0, 500, 4000])))  # type: ignore[arg-type]
    model = fgd.model
    node = _cluster(seed, "fgd", nodes=1).nodes["n00"]
    choices = [0, 1, 5, 100, 250, 499, 500, 501, 750, 999, 1000]
    for _ in range(400):
        sig = tuple(sorted(rng.choice(choices) for _ in range(rng.randint(1, 8))))
        cpu, mem = rng.choice([0, 1000, 10**6]), rng.choice([0, 10**6])
        assert model.frag_sorted(node, sig, cpu, mem) == _frag_by_sums(model, node, sig, cpu, mem)
