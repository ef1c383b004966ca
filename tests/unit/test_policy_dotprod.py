from __future__ import annotations

from tests.unit.policy_helpers import choice, cluster, node, place, pod


def test_least_aligned_free_vector_wins() -> None:
    planner = cluster("dotprod", node("a", cpu=128_000), node("b", cpu=128_000))
    place(planner, "b", pod(0, num_gpu=0, cpu=100_000))
    # Same GPUs free; b has far less free CPU, so its free vector is less aligned with a CPU-heavy ask.
    assert choice(planner, pod(1000, cpu=20_000))[0] == "b"
