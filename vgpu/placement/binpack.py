"""binpack: fill the fullest node and GPU first, keeping whole GPUs free for big requests."""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.base import share_after
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState


class Binpack:
    name = "binpack"
    epoch = 0

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return share_after(node, placement)

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return -u.used_share

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> Binpack:
    return Binpack()
