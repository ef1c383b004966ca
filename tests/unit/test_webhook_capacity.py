from __future__ import annotations

import pytest

from vgpu.devices import GpuDevice
from vgpu.requests import ContainerRequest, PodRequest
from webhook.capacity import InventorySummary, check_capacity


def _node(name: str, model: str, mem: int, n: int) -> list[GpuDevice]:
    return [GpuDevice(uuid=f"{name}-{i}", index=i, model=model, memory_mib=mem) for i in range(n)]


CLUSTER = InventorySummary.from_nodes([_node("a", "H100", 81559, 4), _node("b", "L40S", 46068, 8)])


def _pod(count: int, mem: int | None = None, pct: int | None = None) -> PodRequest:
    return PodRequest((ContainerRequest("main", count, mem, pct if mem is None else None, None, 1),))


@pytest.mark.parametrize(
    ("request_", "models", "error"),
    [
        (_pod(1, mem=81559), None, None),
        (_pod(1, mem=81560), None, "1..81559 MiB"),
        (_pod(8, pct=100), None, None),
        (_pod(9, pct=10), None, "1..8 (the most GPUs on any node)"),
        (_pod(4, mem=50000), None, None),
        (_pod(5, mem=50000), None, "at most 4 vGPUs of 50000 MiB on one node"),
        (_pod(8, mem=46068), None, None),
        (_pod(5, pct=10), frozenset({"H100"}), "1..4 (the most GPUs of model H100"),
        (_pod(1, mem=50000), frozenset({"L40S"}), "1..46068 MiB (the largest GPU of model L40S"),
        (_pod(1, mem=10), frozenset({"A100"}), "GPU models present in the cluster: H100, L40S"),
    ],
)
def test_check_capacity(request_: PodRequest, models: frozenset[str] | None, error: str | None) -> None:
    got = check_capacity(request_, CLUSTER, gpu_models=models)
    if error is None:
        assert got is None
    else:
        assert got is not None and error in str(got) and "'main'" in str(got)


def test_identical_nodes_collapse_and_static_summary() -> None:
    summary = InventorySummary.from_nodes([_node("a", "H100", 1000, 2), _node("b", "H100", 1000, 2), []])
    assert len(summary.nodes) == 1 and summary.max_gpus_per_node == 2
    static = InventorySummary.static(max_gpu_memory_mib=1000, max_gpus_per_node=2)
    assert (static.max_gpu_memory_mib, static.max_gpus_per_node) == (1000, 2)
    assert check_capacity(_pod(2, mem=1000), static, gpu_models=frozenset({"anything"})) is None
    assert check_capacity(_pod(3, mem=1000), static) is not None
