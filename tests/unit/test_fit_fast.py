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
from vgpu.placement.gpushare import frees_after, host_after
from vgpu.placement.role_score import free_after
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, HostUse

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
    state = ClusterState(PlacementConfig(node_policy=policy))
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
