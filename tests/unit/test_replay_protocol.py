from __future__ import annotations

import pytest

from vgpu.replay.protocol import INFLATE_TO, arrivals, node_order
from vgpu.replay.trace import PodRow

PODS = [PodRow(f"p{i:02d}", 1000, 1024, 1, 100 * (i % 9 + 1)) for i in range(30)] + [
    PodRow("cpu-only", 1000, 1024, 0, 0)
]
CAPACITY = 20_000


def test_same_seed_same_sequence_and_input_order_does_not_matter() -> None:
    assert arrivals(PODS, 42, CAPACITY) == arrivals(list(reversed(PODS)), 42, CAPACITY)


def test_seeds_shuffle_differently() -> None:
    assert [p.name for p in arrivals(PODS, 42, CAPACITY)] != [p.name for p in arrivals(PODS, 43, CAPACITY)]


@pytest.mark.parametrize("seed", [42, 43, 51])
def test_inflation_keeps_every_pod_and_stops_at_the_first_pod_reaching_130_percent(seed: int) -> None:
    seq = arrivals(PODS, seed, CAPACITY)
    assert sorted(p.name for p in seq[: len(PODS)]) == sorted(p.name for p in PODS)
    demand = [p.gpu_demand_milli for p in seq]
    assert sum(demand) >= INFLATE_TO * CAPACITY
    assert sum(demand[:-1]) < INFLATE_TO * CAPACITY
    assert all(p in PODS for p in seq[len(PODS) :])


def test_no_inflation_when_the_trace_already_exceeds_the_target() -> None:
    assert len(arrivals(PODS, 42, 100)) == len(PODS)


def test_cpu_only_trace_is_rejected_instead_of_looping_forever() -> None:
    with pytest.raises(ValueError, match="no GPU"):
        arrivals([PodRow("c", 1, 1, 0, 0)], 42, 1000)


def test_node_order_is_a_fixed_permutation_per_seed() -> None:
    names = [f"n{i}" for i in range(50)]
    assert node_order(names, 42) == node_order(list(reversed(names)), 42)
    assert sorted(node_order(names, 42)) == sorted(names)
    assert node_order(names, 42) != node_order(names, 43)
