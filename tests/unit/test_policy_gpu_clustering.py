from __future__ import annotations

from tests.unit.policy_helpers import choice, cluster, node, place, pod


def test_pods_of_one_kind_cluster_together() -> None:
    planner = cluster("gpu-clustering", node("a"), node("b"), node("c"))
    place(planner, "b", pod(300))
    place(planner, "c", pod(1000))
    assert choice(planner, pod(500))[0] == "b"
    assert choice(planner, pod(1000))[0] == "c"
    assert choice(planner, pod(1000, num_gpu=2))[0] == "a"  # empty beats a node of other kinds
