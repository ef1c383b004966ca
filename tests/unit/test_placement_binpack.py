"""binpack: the fuller node and the fuller GPU win, so whole GPUs stay free for big requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import GPU_MEM, make_assignment, make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.planner import Planner
from vgpu.state import ClusterState


def planner(policy: str = "binpack", **config: object) -> Planner:
    return Planner(ClusterState(PlacementConfig(node_policy=policy, **config)))  # type: ignore[arg-type]


def test_binpack_picks_the_fuller_node() -> None:
    p = planner()
    for name in ("a", "b", "c"):
        p.state.upsert_node(make_node(name, 2))
    p.state.apply("ns/x", make_assignment("b", [(0, 40000, 50)]))
    p.state.apply("ns/y", make_assignment("c", [(1, 10000, 10)]))
    best = p.evaluate(make_info(gpumem=8192)).best()
    assert best is not None and best[0] == "b"


def test_binpack_picks_the_fuller_gpu_inside_the_node() -> None:
    p = planner()
    p.state.upsert_node(make_node("n", 3))
    p.state.apply("ns/x", make_assignment("n", [(0, 10000, 10), (2, 50000, 60)]))
    best = p.evaluate(make_info(gpumem=8192)).best()
    assert best is not None
    assert [d.index for d in best[1].placement.containers[0].devices] == [2]  # type: ignore[union-attr]


def test_binpack_skips_a_fuller_gpu_that_cannot_host_the_slice() -> None:
    p = planner()
    p.state.upsert_node(make_node("n", 3))
    p.state.apply("ns/x", make_assignment("n", [(0, 10000, 10), (2, 80000, 60)]))
    best = p.evaluate(make_info(gpumem=8192)).best()
    assert best is not None
    assert [d.index for d in best[1].placement.containers[0].devices] == [0]  # type: ignore[union-attr]


def test_gpu_policy_override_wins_over_the_node_policy_order() -> None:
    p = planner(gpu_policy="spread")
    p.state.upsert_node(make_node("n", 2))
    p.state.apply("ns/x", make_assignment("n", [(1, 40000, 50)]))
    best = p.evaluate(make_info(gpumem=8192)).best()
    assert best is not None
    assert best[1].placement.containers[0].devices[0].index == 0  # type: ignore[union-attr]
    pod = make_info(gpumem=8192, annotations={"vgpu.io/gpu-policy": "binpack"})
    best = p.evaluate(pod).best()
    assert best is not None and best[1].placement.containers[0].devices[0].index == 1  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60000), st.integers(0, 90)), min_size=2, max_size=6))
def test_binpack_best_node_is_a_fullest_one(usage: list[tuple[int, int]]) -> None:
    """One-GPU nodes with random usage; a small pod fits on all; binpack takes a node of max usage after it."""
    p = planner()
    share = {}
    for i, (mem, cores) in enumerate(usage):
        name = f"n{i}"
        p.state.upsert_node(make_node(name, 1))
        p.state.apply(f"ns/{name}", make_assignment(name, [(0, mem, cores)]))
        share[name] = max((mem + 1000) / GPU_MEM, (cores + 5) / 100)  # dominant share once placed
    best = p.evaluate(make_info(gpumem=1000, gpucores=5)).best()
    assert best is not None
    assert share[best[0]] == max(share.values())
