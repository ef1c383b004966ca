"""gpu-clustering (FGD paper baseline): keep pods of one GPU-request kind together on a node.

A pod's kind is `share` (one partial GPU) or `<n>-gpu`. Score tiers on the integer 0..100 scale: nodes
holding only this kind (75..100), several kinds including it (50..75), empty nodes (25..50), other kinds
(0..25); inside a tier the more GPU already used, the higher. CPU-only pods score 0 everywhere.
"""

from __future__ import annotations

from vgpu.fit import NodePlacement
from vgpu.placement.gpushare import MAX_SPEC_GPU, MILLI, free_milli, rank_best_fit, slice_milli
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState


def _kind(count: int, milli: int) -> str:
    return "share" if count == 1 and milli < MILLI else f"{count}-gpu"


def node_kinds(node: NodeState) -> set[str]:
    kinds: set[str] = set()
    for a in node.pods.values():
        slices = a.slices()
        if slices:
            s = slices[0]
            kinds.add(_kind(len(slices), slice_milli(s.memory_mib, s.cores, node.by_uuid[s.uuid])))
    return kinds


# (node holds the pod's kind, only that kind / node empty) -> base of the tier
_TIERS = {(True, True): 75, (True, False): 50, (False, True): 25, (False, False): 0}


class GpuClustering:
    name = "gpu-clustering"
    epoch = 0

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        slices = [s for c in placement.containers for s in c.devices]
        if not slices:
            return 0.0
        kind = _kind(len(slices), slice_milli(slices[0].memory_mib, slices[0].cores, node.by_uuid[slices[0].uuid]))
        kinds = node_kinds(node)
        left = min(MAX_SPEC_GPU, sum(free_milli(u) for u in node.gpus))
        fill = 25 * (MAX_SPEC_GPU - left) // MAX_SPEC_GPU
        base = _TIERS[(kind in kinds, len(kinds) == 1 if kind in kinds else not kinds)]
        return (base + fill) / 100

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return rank_best_fit(u, memory_mib, cores, pod)

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> GpuClustering:
    return GpuClustering()
