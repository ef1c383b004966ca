"""random (FGD paper baseline): a uniformly random feasible node and GPU.

The node score is a hash of (pod, node), fresh for every pod (`pod_score`, see `PodScored`), so the
highest-scored feasible node is a uniformly random one; a run is reproducible from its pod keys and needs
no seed. The GPU order inside a node is a hash of (node, node version, GPU): it does not depend on the
pod, so the planner keeps node fits cached across pods and only recomputes the cheap per-pod score. It
is still a fresh uniform draw for every placement, because every placement onto a node happens at a new
node version. (Hashing the pod into the fit made every pod re-fit every node: several minutes a seed.)
"""

from __future__ import annotations

import functools
import zlib

from vgpu.fit import GpuRank, NodePlacement
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit value from any integer, the same in every process."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=1 << 16)
def _id(text: str) -> int:
    return _mix(zlib.crc32(text.encode()) | len(text) << 32)


def _unit(a: int, b: int) -> float:
    return _mix(a ^ _mix(b)) / 2**64


class RandomFit:
    name = "random"

    def __init__(self) -> None:
        self._salt = 0
        self._salt_for: PodInfo | None = None

    @property
    def epoch(self) -> int:
        return 0  # nothing is learned; the per-pod draw is `pod_score`

    def _pod_salt(self, pod: PodInfo) -> int:
        if self._salt_for is not pod:  # the planner scores every node for one pod in a row
            self._salt_for = pod
            self._salt = _id(f"{pod.key}|{pod.uid}")
        return self._salt

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return 0.0

    def pod_score(self, node_name: str, pod: PodInfo) -> float:
        return _mix(self._pod_salt(pod) ^ _id(node_name)) / 2**64

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return _unit(_id(u.device.uuid), u.memory_used * 1_000_003 + u.cores_used)

    def node_gpu_rank(self, node: NodeState, pod: PodInfo) -> GpuRank:
        salt = _mix(_id(node.name) ^ node.version)

        def rank(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
            return _unit(salt, _id(u.device.uuid))

        return rank

    def observe(self, pod: PodInfo) -> None:
        return None


def create() -> RandomFit:
    return RandomFit()
