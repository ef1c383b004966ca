"""spread: prefer the emptiest node and GPU, trading packing for less interference."""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.base import EMPTIEST_FIRST, share_after
from vgpu.pod import PodInfo
from vgpu.state import NodeState


class Spread:
    name = "spread"
    epoch = 0
    # The score and the GPU order read only the GPUs' states (`share_after` sums exactly), so the planner may score
    # a node class once (vgpu.planner).
    class_scored = True
    gpu_rank = EMPTIEST_FIRST

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return 1.0 - share_after(node, placement)

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> Spread:
    return Spread()
