"""What a placement policy is: a node scorer plus a GPU order, looked up by name in the registry."""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

from vgpu.fit import ByState, GpuRank, NodePlacement
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState


class NodePolicy(Protocol):
    """Scores a feasible node for a pod; higher is better, in [0, 1].

    `epoch` changes whenever the policy's own knowledge changes (e.g. a learned workload), so callers
    may cache scores keyed by (node version, pod shape, epoch).
    """

    name: str

    @property
    def epoch(self) -> int: ...

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float: ...

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        """Order of GPUs inside a node (lower first); a policy may defer to the GPU policy."""
        ...

    def observe(self, pod: PodInfo) -> None:
        """Learn from an arriving pod (its shape), before it is placed."""
        ...


@runtime_checkable
class NodeAwareRank(Protocol):
    """Optional for a policy: its GPU order needs the whole node (e.g. fragmentation after each choice).

    The planner asks for a node-bound rank instead of calling `gpu_rank` whenever the pod's GPU order is
    the policy's own (no gpu-policy override)."""

    def node_gpu_rank(self, node: NodeState, pod: PodInfo) -> GpuRank: ...


@runtime_checkable
class PodScored(Protocol):
    """Optional for a policy: a part of the score drawn afresh for every pod (random), added to `score`.

    The planner keeps node fits and `score` cached per (node version, pod shape, epoch) as usual and only
    recomputes this part per pod, so such a policy's `epoch` need not move with every pod."""

    def pod_score(self, node_name: str, pod: PodInfo) -> float: ...


def used_after(node: NodeState, placement: NodePlacement) -> list[float]:
    """Reserved share of each of the node's GPUs (the larger of memory and SMs) once the placement is applied."""
    added: dict[str, tuple[int, int]] = {}
    for c in placement.containers:
        for d in c.devices:
            m, k = added.get(d.uuid, (0, 0))
            added[d.uuid] = (m + d.memory_mib, k + d.cores)
    out: list[float] = []
    for u in node.gpus:
        m, k = added.get(u.device.uuid, (0, 0))
        dev = u.device
        out.append(max((u.memory_used + m) / dev.memory_mib, (u.cores_used + k) / dev.cores))
    return out


def share_after(node: NodeState, placement: NodePlacement) -> float:
    """Mean reserved share of the node's GPUs once the placement is applied.

    `math.fsum` is exact, so the float does not depend on the GPUs' index order: nodes of one class
    (`NodeState.class_key`) score alike to the bit and the planner may score the class once."""
    if not node.gpus:
        return 0.0
    return math.fsum([min(1.0, used) for used in used_after(node, placement)]) / len(node.gpus)


def _fullest(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return -u.used_share


def _emptiest(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return u.used_share


# The GPU orders of binpack and spread (as node policies and as `--gpu-policy`): the reserved share is the state's.
FULLEST_FIRST = ByState(_fullest)
EMPTIEST_FIRST = ByState(_emptiest)
