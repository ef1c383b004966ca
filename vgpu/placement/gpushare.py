"""GPU-sharing arithmetic shared by the FGD-paper policies: free milli per GPU, a pod's demand, node views.

A GPU is 1000 milli; a GPU's free milli is the smaller of its free memory and free SM share, so the
policies see the same "fraction of a GPU" that the openb trace and the paper use.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.fit import ByState, NodePlacement
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState

MILLI = 1000
MAX_SPEC_CPU = 128_000  # the paper simulator's normalisers (largest node: 128 cores, 8 GPUs)
MAX_SPEC_GPU = 8 * MILLI


def free_milli(u: GpuUsage) -> int:
    d = u.device
    mem = (d.memory_mib - u.memory_used) * MILLI // d.memory_mib
    cores = (d.cores - u.cores_used) * MILLI // d.cores
    return max(0, min(mem, cores))


def node_frees(node: NodeState) -> tuple[int, ...]:
    """`free_milli` of every GPU of the node, in node GPU order; computed once per node version."""
    memo = node.frees_memo
    if memo is not None and memo[0] == node.version:
        return memo[1]
    out = []
    for u in node.gpus:  # `free_milli` written out: no call per GPU (once a node version, every node a pass orders)
        d = u.device
        mem = (d.memory_mib - u.memory_used) * MILLI // d.memory_mib
        cores = (d.cores - u.cores_used) * MILLI // d.cores
        free = mem if mem < cores else cores
        out.append(free if free > 0 else 0)
    frees = tuple(out)
    node.frees_memo = (node.version, frees)
    return frees


def slice_milli(memory_mib: int, cores: int, u: GpuUsage) -> int:
    """The share of GPU `u` one slice takes, in milli (rounded up: never under-counts)."""
    d = u.device
    return min(MILLI, max(-(-memory_mib * MILLI // d.memory_mib), cores * MILLI // d.cores))


@dataclass(frozen=True, slots=True)
class Demand:
    """A pod's GPU ask as the paper sees it: `count` GPUs of `milli` each (0 GPUs for CPU-only pods)."""

    count: int
    milli: int

    @property
    def total(self) -> int:
        return self.count * self.milli


def pod_demand(pod: PodInfo, node: NodeState) -> Demand:
    """Per-GPU milli measured on the node's first GPU (the request is a fraction, so any GPU will do)."""
    reqs = pod.request.containers
    if not reqs or not node.gpus:
        return Demand(0, 0)
    d = node.gpus[0].device
    count = sum(r.count for r in reqs)
    milli = max(slice_milli(r.memory_on(d.memory_mib), r.cores_on(d.memory_mib), node.gpus[0]) for r in reqs)
    return Demand(count, milli)


def frees_after(node: NodeState, placement: NodePlacement) -> list[int]:
    """Free milli of each GPU of the node once the placement is applied (node GPU order)."""
    taken: dict[str, int] = {}
    for c in placement.containers:
        for s in c.devices:
            taken[s.uuid] = taken.get(s.uuid, 0) + slice_milli(s.memory_mib, s.cores, node.by_uuid[s.uuid])
    out = list(node_frees(node))
    pos = node.positions
    for uuid, t in taken.items():  # the other GPUs keep their free share (never negative: `free_milli`)
        i = pos[uuid]
        out[i] = max(0, out[i] - t)
    return out


def host_after(node: NodeState, pod: PodInfo) -> tuple[int, int]:
    """Free CPU (milli) and host memory (MiB) once the pod is placed; untracked resources count as plenty."""
    inv = node.inventory
    cpu = inv.cpu_milli - node.cpu_used - pod.cpu_milli if inv.cpu_milli else 1 << 40
    mem = inv.memory_mib - node.memory_used - pod.memory_mib if inv.memory_mib else 1 << 40
    return cpu, mem


def host_free(node: NodeState) -> tuple[int, int]:
    inv = node.inventory
    cpu = inv.cpu_milli - node.cpu_used if inv.cpu_milli else 1 << 40
    mem = inv.memory_mib - node.memory_used if inv.memory_mib else 1 << 40
    return cpu, mem


def rank_best_fit(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    """GPU order: the GPU with the least free share first (keeps whole GPUs whole)."""
    return float(free_milli(u))


# `rank_best_fit` as a `StateRank` (the free milli is the state's): the baselines' own GPU order.
BEST_FIT_FIRST = ByState(rank_best_fit)
