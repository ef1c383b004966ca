"""GPU and node models refuse impossible devices at construction."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu.devices import DEFAULT_SPLIT_COUNT, GpuDevice, NodeInventory


def test_defaults() -> None:
    g = GpuDevice("GPU-0", 0, "H100", 81920)
    assert (g.cores, g.split_count, g.numa, g.healthy, g.nvlink_peers) == (100, DEFAULT_SPLIT_COUNT, None, True, ())


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"uuid": ""}, "uuid must not be empty"),
        ({"index": -1}, "index must be >= 0"),
        ({"memory_mib": 0}, "memory_mib must be > 0"),
        ({"memory_mib": -5}, "memory_mib must be > 0"),
        ({"cores": 0}, "cores must be 1..100"),
        ({"cores": 101}, "cores must be 1..100"),
        ({"split_count": 0}, "split_count must be >= 1"),
    ],
)
def test_invalid_gpu(kwargs: dict[str, Any], reason: str) -> None:
    args: dict[str, Any] = {"uuid": "GPU-0", "index": 0, "model": "H100", "memory_mib": 81920} | kwargs
    with pytest.raises(ValueError, match=reason):
        GpuDevice(**args)


def test_node_rejects_duplicate_uuids() -> None:
    g = GpuDevice("GPU-0", 0, "H100", 81920)
    with pytest.raises(ValueError, match="node n1: duplicate GPU uuid GPU-0"):
        NodeInventory("n1", (g, GpuDevice("GPU-0", 1, "H100", 81920)))


def test_node_labels_do_not_take_part_in_equality() -> None:
    g = (GpuDevice("GPU-0", 0, "H100", 81920),)
    assert NodeInventory("n", g, labels={"zone": "a"}) == NodeInventory("n", g, labels={"zone": "b"})
    assert NodeInventory("n", g) != NodeInventory("n", g, cpu_milli=1000)
