"""vgpu.simulate: the replay loop places pods through the planner and never over-commits a GPU."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_assignment, make_container, make_node, make_pod
from vgpu.clusterfile import ClusterFileError
from vgpu.planner import Planner
from vgpu.simulate import Placed, Rejected, build_state, place, replay


def _planner(*nodes: str, gpus: int = 2) -> Planner:
    return Planner(build_state([make_node(n, gpus) for n in nodes]))


def test_replay_places_in_order_and_applies_to_the_state() -> None:
    planner = _planner("a", "b")
    pods = [make_pod(f"p{i}", [make_container(gpu=1, gpumem=20000, gpucores=25)]) for i in range(3)]
    result = replay(planner, pods)
    assert [p.pod.name for p in result.placed] == ["p0", "p1", "p2"]
    assert set(planner.state.assignments) == {f"default/p{i}" for i in range(3)}
    for p in result.placed:
        assert planner.state.assignments[p.pod.key] == p.assignment


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (make_pod("bad", [make_container(gpu=1, gpumem_percentage=150)]), "gpumem-percentage"),
        (make_pod("none", [{"name": "c", "image": "x"}]), "asks for no vGPU"),
        (make_pod("huge", [make_container(gpu=1, gpumem=10**6)]), "0/2 nodes fit"),
        (make_pod("many", [make_container(gpu=3, gpumem=100)]), "0/2 nodes fit"),
        (
            make_pod("pol", [make_container(gpu=1)], annotations={"vgpu.io/node-policy": "nope"}),
            "vgpu.io/node-policy",
        ),
    ],
)
def test_replay_rejects_with_a_reason_and_goes_on(pod: dict[str, Any], reason: str) -> None:
    planner = _planner("a", "b")
    ok = make_pod("ok", [make_container(gpu=1, gpumem=1000, gpucores=10)])
    result = replay(planner, [pod, ok])
    assert [p.pod.name for p in result.placed] == ["ok"]
    (rejected,) = result.rejected
    assert rejected.pod_key == f"default/{pod['metadata']['name']}"
    assert reason in rejected.reason


def test_rejection_carries_every_nodes_reason() -> None:
    planner = _planner("a", "b")
    outcome = replay(planner, [make_pod("huge", [make_container(gpu=1, gpumem=10**6)])]).rejected[0]
    assert set(outcome.node_reasons) == {"a", "b"}
    assert all("card too small" in r for r in outcome.node_reasons.values())


def test_place_twice_is_rejected_not_double_counted() -> None:
    planner = _planner("a")
    info = replay(planner, [make_pod("p", [make_container(gpu=1, gpumem=1000, gpucores=10)])]).placed[0].pod
    again = place(planner, info)
    assert isinstance(again, Rejected)
    assert planner.state.totals()["memory_used_mib"] == 1000


@pytest.mark.parametrize(
    ("allocations", "message"),
    [
        ([("d/p", make_assignment("zz", [(0, 10, 10)]))], "allocations.0.assignment.node"),
        ([("d/p", make_assignment("a", [(0, 90000, 10)]))], "allocations.0"),
        (
            [("d/p", make_assignment("a", [(0, 50000, 50)])), ("d/q", make_assignment("a", [(0, 50000, 50)]))],
            "allocations.1",
        ),
    ],
)
def test_build_state_rejects_impossible_allocations(allocations: list[Any], message: str) -> None:
    with pytest.raises(ClusterFileError, match=message):
        build_state([make_node("a")], allocations)


_POD = st.tuples(
    st.integers(1, 2),  # vGPUs
    st.integers(1000, 90000),  # MiB per vGPU
    st.integers(0, 100),  # cores
    st.sampled_from([None, "prefill", "decode", "prefill-decode"]),
    st.sampled_from([None, "m1", "m2"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_POD, max_size=25), st.sampled_from(["binpack", "spread"]))
def test_random_replays_never_exceed_capacity(shapes: list[tuple[Any, ...]], policy: str) -> None:
    from vgpu.config import PlacementConfig

    planner = Planner(build_state([make_node("a"), make_node("b", 4)], config=PlacementConfig(node_policy=policy)))
    pods = []
    for i, (count, mem, cores, role, model) in enumerate(shapes):
        labels = {k: v for k, v in (("llm-d.ai/role", role), ("llm-d.ai/model", model)) if v is not None}
        pods.append(make_pod(f"p{i}", [make_container(gpu=count, gpumem=mem, gpucores=cores)], labels=labels))
    result = replay(planner, pods)
    assert len(result.placed) + len(result.rejected) == len(pods)
    for node in planner.state.nodes.values():
        for u in node.gpus:
            assert u.memory_used <= u.device.memory_mib
            assert u.cores_used <= u.device.cores
            assert u.sharers <= u.device.split_count
            if u.prefill:
                assert u.cores_used <= 100
    assert all(isinstance(p, Placed) for p in result.placed)
