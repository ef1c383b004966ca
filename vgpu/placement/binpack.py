"""binpack: fill the fullest node and GPU first, keeping whole GPUs free for big requests."""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.base import FULLEST_FIRST, share_after
from vgpu.pod import PodInfo
from vgpu.state import NodeState


class Binpack:
    name = "binpack"
    epoch = 0
    # The score and the GPU order read only the GPUs' states (`share_after` sums exactly), so the planner may score
    # a node class once (vgpu.planner).
    class_scored = True
    gpu_rank = FULLEST_FIRST

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return share_after(node, placement)

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> Binpack:
    return Binpack()
