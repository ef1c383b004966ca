from __future__ import annotations

from tests.unit.policy_helpers import choice, cluster, node, place, pod


def test_fullest_node_and_tightest_gpu() -> None:
    planner = cluster("bestfit", node("a"), node("b"))
    place(planner, "b", pod(1000))
    place(planner, "b", pod(500), gpu=1)
    assert choice(planner, pod(1000)) == ("b", [2])
    assert choice(planner, pod(300)) == ("b", [1])  # the half-used GPU, not a whole one
