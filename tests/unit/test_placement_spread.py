"""spread: the emptier node and the emptier GPU win, trading packing for less interference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import GPU_MEM, make_assignment, make_info, make_node
from tests.unit.test_placement_binpack import planner


def test_spread_picks_the_emptier_node() -> None:
    p = planner("spread")
    for name in ("a", "b", "c"):
        p.state.upsert_node(make_node(name, 2))
    p.state.apply("ns/x", make_assignment("a", [(0, 40000, 50)]))
    p.state.apply("ns/y", make_assignment("b", [(1, 10000, 10)]))
    p.state.apply("ns/z", make_assignment("c", [(0, 20000, 20), (1, 20000, 20)]))
    best = p.evaluate(make_info(gpumem=8192)).best()
    assert best is not None and best[0] == "b"


def test_spread_picks_the_emptier_gpu_inside_the_node() -> None:
    p = planner("spread")
    p.state.upsert_node(make_node("n", 3))
    p.state.apply("ns/x", make_assignment("n", [(0, 30000, 30), (1, 10000, 10), (2, 50000, 60)]))
    best = p.evaluate(make_info(gpumem=8192)).best()
    assert best is not None
    assert [d.index for d in best[1].placement.containers[0].devices] == [1]  # type: ignore[union-attr]


def test_spread_spreads_a_multi_gpu_container_over_the_emptiest_gpus() -> None:
    p = planner("spread")
    p.state.upsert_node(make_node("n", 4))
    p.state.apply("ns/x", make_assignment("n", [(0, 30000, 30), (1, 1000, 1), (2, 50000, 60), (3, 2000, 2)]))
    best = p.evaluate(make_info(gpu=2, gpumem=8192)).best()
    assert best is not None
    assert sorted(d.index for d in best[1].placement.containers[0].devices) == [1, 3]  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60000), st.integers(0, 90)), min_size=2, max_size=6))
def test_spread_best_node_is_an_emptiest_one(usage: list[tuple[int, int]]) -> None:
    p = planner("spread")
    share = {}
    for i, (mem, cores) in enumerate(usage):
        name = f"n{i}"
        p.state.upsert_node(make_node(name, 1))
        p.state.apply(f"ns/{name}", make_assignment(name, [(0, mem, cores)]))
        share[name] = max((mem + 1000) / GPU_MEM, (cores + 5) / 100)  # dominant share once placed
    best = p.evaluate(make_info(gpumem=1000, gpucores=5)).best()
    assert best is not None
    assert share[best[0]] == min(share.values())
