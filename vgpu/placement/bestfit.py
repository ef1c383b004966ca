"""bestfit (FGD paper baseline): the node whose free CPU and GPU, after placement, are smallest.

Score `1 - sum_i 0.5 * (free_i - request_i) / max_spec_i` over i in (CPU, GPU), truncated to the paper
simulator's integer 0..100 so ties (broken by the replay's node order) fall where the paper's do.
"""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.gpushare import BEST_FIT_FIRST, MAX_SPEC_CPU, MAX_SPEC_GPU, frees_after, host_after
from vgpu.pod import PodInfo
from vgpu.state import NodeState


class BestFit:
    name = "bestfit"
    epoch = 0
    # The score reads only what `NodeState.class_key` holds and the placement's GPU states, the GPU order only the GPU's
    # state: the planner may score a node class once (vgpu.planner).
    class_scored = True
    gpu_rank = BEST_FIT_FIRST

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        cpu_left, _ = host_after(node, pod)
        cpu_left = min(cpu_left, MAX_SPEC_CPU)
        gpu_left = sum(frees_after(node, placement))
        waste = 0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU
        return int((1.0 - waste) * 100) / 100

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> BestFit:
    return BestFit()
