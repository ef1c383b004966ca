"""A split class's answers by picks (`vgpu.planner.Planner._picks`) for pods of several containers: a node whose GPU
order is new to its class takes the answer of a node whose containers took the same GPUs (state, which of that
state), instead of a full fit. The picks simulate `fit_node`'s choice per container, earlier containers' slices judged
with the GPU; a wrong simulation would hand a node another node's GPUs, so every node's decision is compared with the
uncached `Planner.evaluate_node` (random clusters with NVLink, NUMA, cordon, unhealthy and host-room nodes, several
seeds, binds and releases in between), and the planner must have kept answering by picks in every split class (its
check against each full fit turns them off where they disagree).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import vgpu.planner as planner_mod
from tests.conftest import make_assignment, make_container, make_info, make_node
from tests.unit.test_fit_fast import _fresh
from tests.unit.test_planner_multi_classes import _cluster, _exact, _full_fits, _scored
from vgpu.config import PlacementConfig
from vgpu.planner import Planner
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState


def _pods() -> list[PodInfo]:
    """Pods of several containers whose later containers may or may not share a GPU with the earlier ones: a 60 %
    slice leaves no room for a 50 % one; three 30 % slices fill a card; a best-effort (no cores) slice first."""

    def pod(name: str, *specs: dict[str, int], role: str | None = None, model: str | None = None) -> PodInfo:
        return make_info(
            name,
            role=role,
            model=model,
            containers=[make_container(chr(ord("a") + i), **s) for i, s in enumerate(specs)],
        )

    return [
        pod("p0", {"gpumem_percentage": 25, "gpucores": 40}, {"gpumem_percentage": 50, "gpucores": 50}),
        pod("p1", {"gpumem_percentage": 60, "gpucores": 30}, {"gpumem_percentage": 50, "gpucores": 30}),
        pod("p2", *[{"gpumem_percentage": 30, "gpucores": 30}] * 3, role="prefill", model="m"),
        pod("p3", {"gpu": 2, "gpumem_percentage": 20, "gpucores": 20}, {"gpumem_percentage": 10}, role="decode"),
        pod("p4", {"gpumem_percentage": 25, "gpucores": 0}, {"gpumem_percentage": 25, "gpucores": 25}),
        pod("p5", {"gpumem_percentage": 100, "gpucores": 100}, {"gpumem_percentage": 30, "gpucores": 30}),
    ]


def _split_classes(p: Planner) -> list[planner_mod._Shared]:
    return [s for classes in p._classes.values() for s in classes.values() if s.split is not None]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("patterns", [3, 8])
@pytest.mark.parametrize("policy", ["default", "fgd", "fragaware-gpusteps"])
def test_answers_by_picks_decide_what_each_node_decides(seed: int, patterns: int, policy: str) -> None:
    state = _cluster(seed, policy, patterns=patterns, nodes=80)
    p = Planner(state)
    rng = random.Random(seed)
    pods = _pods()
    if seed % 2:  # host asks: a node without room fails before any GPU is looked at
        pods = [dataclasses.replace(pod, cpu_milli=3000 * (i % 3)) for i, pod in enumerate(pods)]
    placed: list[str] = []
    for step in range(4):
        for pod in pods:
            p.observe(pod)
            ev = p.evaluate(pod)
            names = list(state.nodes)
            _exact(ev, _fresh(p, pod, names))
            assert p.priorities(ev) == p.priorities(_scored(_fresh(p, pod, names)))
        for b in range(4):
            pod = dataclasses.replace(pods[rng.randrange(len(pods))], name=f"b{step}-{b}", uid=f"uid-b{step}-{b}")
            best = p.evaluate(pod).best()
            if best is not None and best[1].placement is not None:
                state.apply(pod.key, best[1].placement.assignment(pod))
                placed.append(pod.key)
        if step % 2 and placed:
            state.release(placed.pop(0))
    splits = [s for s in _split_classes(p) if s.ranks is None]
    assert splits, "no split class for a pod of several containers: the test checks nothing"
    assert all(s.steps is not None for s in splits), "picks disagreed with a full fit"


def test_random_clusters_answer_some_nodes_by_picks() -> None:
    """On the clusters above, some nodes of split classes take an answer by picks (their interleaving was new, their
    picks were not): the path under test is taken."""
    shared = 0
    for seed in range(4):
        state = _cluster(seed, "default", patterns=3, nodes=80)
        p = Planner(state)
        for pod in _pods():
            ev = p.evaluate(pod)
            _exact(ev, _fresh(p, pod, list(state.nodes)))
        for s in _split_classes(p):
            if s.splits is not None and s.by_picks is not None:  # a full fit makes a new answer; picks reuse one
                shared += len(s.splits) - len(set(map(id, s.splits.values())))
    assert shared > 0


def test_nodes_that_take_the_same_gpus_share_one_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two decodes of model m and a prefill of model x at 25 % and an empty card, all of which rank equal for the
    first container (25 %) of a role-less pod of a 25 % and a 60 % container: it takes GPU 0, the second takes by its
    own order. Eight nodes hold the four GPUs in eight orders; what the pod takes depends only on which state GPU 0 is
    in (m, x or empty), so three full fits, where splitting by the order of the states would need eight."""
    layouts = [(0, 1, 2), (0, 2, 1), (0, 3, 2), (1, 2, 0), (1, 3, 0), (3, 1, 0), (2, 0, 3), (3, 2, 1)]
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n, (d1, d2, pf) in enumerate(layouts):
        name = f"n{n}"
        state.upsert_node(make_node(name, 4, split=4))
        for k, g in enumerate((d1, d2)):
            state.apply(f"bg/{name}-d{k}", make_assignment(name, [(g, 20480, 25)], role=Role.DECODE, model="m"))
        state.apply(f"bg/{name}-p", make_assignment(name, [(pf, 20480, 25)], role=Role.PREFILL, model="x"))
    pod = make_info(
        "s",
        containers=[
            make_container("a", gpumem_percentage=25, gpucores=25),
            make_container("b", gpumem_percentage=60, gpucores=60),
        ],
    )
    p = Planner(state)
    fits = _full_fits(monkeypatch)
    ev = p.evaluate(pod)
    fitted = sorted(fits)
    _exact(ev, _fresh(p, pod, list(state.nodes)))
    kinds = {f"n{n}": "x" if pf == 0 else "m" if 0 in (d1, d2) else "empty" for n, (d1, d2, pf) in enumerate(layouts)}
    assert fitted == sorted({kinds[n]: n for n in reversed(list(state.nodes))}.values()) == ["n0", "n3", "n7"]
    assert len(ev.feasible) == len(layouts)
    for r in ev.feasible.values():
        assert r.placement is not None and r.placement.containers[0].devices[0].index == 0
