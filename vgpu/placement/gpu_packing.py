"""gpu-packing (FGD paper baseline): share partly used GPUs first, then free GPUs of used nodes, then empty nodes.

Tiers on the paper simulator's integer 0..100 scale: a placement only on already shared GPUs scores
100 - (their free % summed)/10 (>= 50); one that must take fully free GPUs of a used node scores
50 - (GPUs taken) (>= 33); an empty node scores 33 - its GPU count. CPU-only pods score 0 everywhere.
"""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.gpushare import BEST_FIT_FIRST, MILLI, free_milli
from vgpu.pod import PodInfo
from vgpu.state import NodeState


class GpuPacking:
    name = "gpu-packing"
    epoch = 0
    # The score reads only what `NodeState.class_key` holds and the placement's GPU states, the GPU order only the GPU's
    # state: the planner may score a node class once (vgpu.planner).
    class_scored = True
    gpu_rank = BEST_FIT_FIRST

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        if not pod.request.containers:
            return 0.0
        frees = [free_milli(u) for u in node.gpus]
        fully_free = sum(f == MILLI for f in frees)
        if fully_free == len(frees):
            return max(33 - fully_free, fully_free) / 100
        used = [free_milli(node.by_uuid[s.uuid]) for c in placement.containers for s in c.devices]
        whole_taken = sum(f == MILLI for f in used)
        if whole_taken:
            return max(50 - whole_taken, 33) / 100
        free_pct = sum(f * 100 // MILLI for f in used)
        return max(100 - free_pct // 10, 50) / 100

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> GpuPacking:
    return GpuPacking()
