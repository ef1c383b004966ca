"""spread: prefer the emptiest node and GPU, trading packing for less interference."""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.base import share_after
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState


class Spread:
    name = "spread"
    epoch = 0

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return 1.0 - share_after(node, placement)

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return u.used_share

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> Spread:
    return Spread()
