"""dotprod (FGD paper baseline, Tetris-style): the node whose free (CPU, GPU) vector is least aligned with the ask.

Both vectors are normalised by the paper simulator's maximum node spec (128 cores, 8 GPUs); the GPU
component of the node is the free share of the GPUs the pod would take. Score `1 - dot / 2`, truncated
to the simulator's integer 0..100.
"""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.gpushare import BEST_FIT_FIRST, MAX_SPEC_CPU, MAX_SPEC_GPU, free_milli, host_free, pod_demand
from vgpu.pod import PodInfo
from vgpu.state import NodeState


class DotProd:
    name = "dotprod"
    epoch = 0
    # The score reads only what `NodeState.class_key` holds and the placement's GPU states, the GPU order only the GPU's
    # state: the planner may score a node class once (vgpu.planner).
    class_scored = True
    gpu_rank = BEST_FIT_FIRST

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        cpu_free, _ = host_free(node)
        cpu_free = min(cpu_free, MAX_SPEC_CPU)
        gpu_free = sum(free_milli(node.by_uuid[s.uuid]) for c in placement.containers for s in c.devices)
        want = pod_demand(pod, node)
        dot = (cpu_free / MAX_SPEC_CPU) * (pod.cpu_milli / MAX_SPEC_CPU) + (gpu_free / MAX_SPEC_GPU) * (
            want.total / MAX_SPEC_GPU
        )
        return int((1.0 - dot / 2) * 100) / 100

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> DotProd:
    return DotProd()
