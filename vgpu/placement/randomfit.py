"""random (FGD paper baseline): a uniformly random feasible node and GPU.

Scores are a hash of (pod, node, node version), so a run is reproducible from its pod keys and needs
no seed; `epoch` moves with every observed pod because the score depends on the pod, not its shape.
"""

from __future__ import annotations

import hashlib

from vgpu.fit import NodePlacement
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState


def _unit(*parts: object) -> float:
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class RandomFit:
    name = "random"

    def __init__(self) -> None:
        self._epoch = 0

    @property
    def epoch(self) -> int:
        return self._epoch

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return _unit(pod.key, pod.uid, node.name, node.version)

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return _unit(pod.key, pod.uid, u.device.uuid, u.sharers, u.memory_used)

    def observe(self, pod: PodInfo) -> None:
        self._epoch += 1


def create() -> RandomFit:
    return RandomFit()
