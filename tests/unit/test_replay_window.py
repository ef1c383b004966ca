"""The replay's kube-scheduler window (`percentage`): how many nodes kube-scheduler sends the extender
(`numFeasibleNodesToFind`), which ones (its own filters, from where its last walk stopped), and that the window is
all that changes."""

from __future__ import annotations

import random

import pytest

from vgpu.config import PlacementConfig
from vgpu.planner import Planner
from vgpu.pod import PodInfo
from vgpu.replay.engine import kube_fits, kube_window, nodes_to_find, replay
from vgpu.replay.trace import NodeRow, PodRow, to_inventory, to_pod_info
from vgpu.state import ClusterState, HostUse


@pytest.mark.parametrize(
    ("percentage", "nodes", "want"),
    [
        (0, 50, 50),  # under 100 nodes: every one
        (0, 100, 100),  # 50 % of 100 is 50, raised to the 100 floor
        (0, 1000, 420),  # 50 - 1000 / 125 = 42 %
        (0, 1213, 497),  # the openb cluster: 41 %
        (0, 5000, 500),  # 10 %
        (0, 5625, 281),  # the 5 % floor
        (0, 10_000, 500),
        (10, 1213, 121),
        (5, 1213, 100),  # 60, raised to the 100 floor
        (100, 1213, 1213),
    ],
)
def test_nodes_to_find_is_kube_schedulers(percentage: int, nodes: int, want: int) -> None:
    assert nodes_to_find(percentage, nodes) == want


@pytest.mark.parametrize("percentage", [-1, 101])
def test_nodes_to_find_refuses_what_kube_scheduler_does_not_take(percentage: int) -> None:
    with pytest.raises(ValueError, match="allowed 0 \\(adaptive\\) to 100"):
        nodes_to_find(percentage, 1000)


def _state(rows: list[NodeRow]) -> ClusterState:
    state = ClusterState(PlacementConfig())
    for row in rows:
        state.upsert_node(to_inventory(row))
    return state


def _pod(cpu: int = 1000, models: frozenset[str] | None = None, milli: int = 500) -> PodInfo:
    return to_pod_info(PodRow("p", cpu, 1024, 1, milli, models), "p-0")


def test_kube_fits_reads_host_room_and_gpu_models() -> None:
    state = _state([NodeRow("n0", 4000, 8192, 2, "G2"), NodeRow("n1", 4000, 8192, 2, "T4")])
    assert kube_fits(state.nodes["n0"], _pod())
    assert not kube_fits(state.nodes["n0"], _pod(cpu=5000))
    assert not kube_fits(state.nodes["n0"], _pod(models=frozenset({"T4"})))
    assert kube_fits(state.nodes["n1"], _pod(models=frozenset({"T4"})))


def test_the_window_skips_what_kube_scheduler_filters_out_and_moves_on_by_what_it_checked() -> None:
    rows = [NodeRow(f"n{i}", 4000, 8192, 1, "G2") for i in range(6)]
    state = _state(rows)
    hog = to_pod_info(PodRow("hog", 4000, 1024, 1, 100), "hog-0")
    placement = Planner(state).evaluate(hog, ["n2"]).feasible["n2"].placement
    assert placement is not None
    state.apply(hog.key, placement.assignment(hog), HostUse(4000, 1024))
    order = [f"n{i}" for i in range(6)]
    window, start = kube_window(state, order, 1, _pod(), 3)
    assert window == ["n1", "n3", "n4"] and start == 5  # n2 has no CPU left: checked, not sent
    window, start = kube_window(state, order, start, _pod(), 3)
    assert window == ["n5", "n0", "n1"] and start == 2  # it wraps around the list
    # Fewer nodes pass than wanted: every one that does, after one full walk.
    window, start = kube_window(state, order, 4, _pod(), 10)
    assert sorted(window) == ["n0", "n1", "n3", "n4", "n5"] and start == 4


def _trace(seed: int) -> tuple[list[NodeRow], list[PodRow]]:
    rng = random.Random(seed)
    nodes = [NodeRow(f"n{i:03d}", 64_000, 262_144, rng.choice([2, 4, 8]), "G2") for i in range(150)]
    pods = [
        PodRow(f"p{i:04d}", 2000, 4096, *rng.choice([(1, 1000), (2, 1000), (1, 250), (1, 500), (1, 700)]))
        for i in range(400)
    ]
    return nodes, pods


def test_a_window_of_every_node_decides_as_the_whole_cluster() -> None:
    nodes, pods = _trace(1)
    whole = replay(nodes, pods, "default", 42)
    windowed = replay(nodes, pods, "default", 42, percentage=100)
    assert windowed.allocated == whole.allocated and windowed.failed == whole.failed
    assert whole.names_per_pod == 150 and windowed.names_per_pod <= 150


def test_a_narrow_window_asks_about_fewer_nodes_and_places_otherwise() -> None:
    nodes, pods = _trace(2)
    whole = replay(nodes, pods, "default", 42)
    windowed = replay(nodes, pods, "default", 42, percentage=5)  # 150 nodes: the 100-node floor
    assert windowed.percentage == 5 and windowed.names_per_pod <= 100
    assert windowed.arrived == whole.arrived  # the same arrivals, only the choices differ
    assert windowed.allocated != whole.allocated
