from __future__ import annotations

from tests.unit.policy_helpers import choice, cluster, node, place, pod


def test_shared_gpus_first_then_free_gpus_of_used_nodes_then_empty_nodes() -> None:
    planner = cluster("gpu-packing", node("a"), node("b"), node("c", gpus=8))
    place(planner, "b", pod(1000))
    assert choice(planner, pod(1000))[0] == "b"  # free GPU of a used node beats an empty node
    place(planner, "c", pod(400), gpu=3)
    assert choice(planner, pod(300)) == ("c", [3])  # a shared GPU beats everything
