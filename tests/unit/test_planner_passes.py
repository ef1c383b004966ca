"""What a pass over every node leaves behind: the results of the current policy epoch only, and a call to
`Planner.after_pass` (the extender freezes them there: scheduler_extender.gcpause.settle)."""

from __future__ import annotations

from tests.conftest import make_assignment, make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.planner import Planner, _shape
from vgpu.state import ClusterState, HostUse


def _state(nodes: int = 12) -> ClusterState:
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(nodes):
        state.upsert_node(make_node(f"n{n:02d}", 4, split=4))
        if n % 3:
            state.apply(f"bg/{n}", make_assignment(f"n{n:02d}", [(n % 4, 20480, 25)]), HostUse())
    return state


def _keys_of(p: Planner, shape: object) -> dict[str, int]:
    return {name: sum(1 for k in getattr(p, name) if k[0] == shape) for name in ("_cache", "_memo", "_classes")}


def test_a_relearn_drops_the_older_epoch_s_results() -> None:
    state = _state()
    p = Planner(state)
    pod = make_info("a", gpumem_percentage=20, gpucores=20)
    other = make_info("b", gpumem_percentage=50, gpucores=50)
    p.observe(pod)
    first = p.evaluate(pod)
    assert _keys_of(p, _shape(pod)) == {"_cache": 1, "_memo": 1, "_classes": 1}
    epoch = p.policy("default").epoch
    p.observe(other)  # the default policy relearns: every shape's epoch moves
    assert p.policy("default").epoch != epoch
    second = p.evaluate(pod)
    assert second is not first
    assert _keys_of(p, _shape(pod)) == {"_cache": 1, "_memo": 1, "_classes": 1}
    # The same decisions as a planner that never saw the older epoch.
    fresh = Planner(state)
    fresh.observe(pod)
    fresh.observe(other)
    again = fresh.evaluate(pod)
    assert {n: (r.placement, r.score) for n, r in second.feasible.items()} == {
        n: (r.placement, r.score) for n, r in again.feasible.items()
    }
    assert second.failed == again.failed


def test_after_pass_is_told_each_pass_over_the_nodes_only() -> None:
    state = _state()
    p = Planner(state)
    passes: list[int] = []
    p.after_pass = passes.append
    pod = make_info("a", gpumem_percentage=20, gpucores=20)
    p.observe(pod)
    names = list(state.nodes)
    p.evaluate(pod)
    assert passes == [len(names)]
    p.evaluate(pod)  # memoised: no pass
    p.evaluate(pod, names[:5])  # a subset of the memoised evaluation: no pass
    assert passes == [len(names)]
    state.apply("bg/new", make_assignment("n00", [(0, 20480, 25)]), HostUse())
    p.evaluate(pod)  # one node changed: refreshed in place, no pass
    assert passes == [len(names)]
    p.observe(make_info("b", gpumem_percentage=50, gpucores=50))
    p.evaluate(pod, names[:7])  # a new epoch: a pass over the names asked
    assert passes == [len(names), 7]


def test_classify_works_out_each_node_s_class_as_a_pass_would() -> None:
    """What the extender runs after its lists: each node's class for its current version, the same as the first
    pass would work out lazily."""
    state, lazy = _state(), _state()
    state.classify()
    for name, node in state.nodes.items():
        assert node.class_memo is not None and node.class_memo[0] == node.version
        assert node.class_key == lazy.nodes[name].class_key
    p, q = Planner(state), Planner(lazy)
    pod = make_info("a", gpumem_percentage=20, gpucores=20)
    assert {n: (r.placement, r.score) for n, r in p.evaluate(pod).feasible.items()} == {
        n: (r.placement, r.score) for n, r in q.evaluate(pod).feasible.items()
    }
