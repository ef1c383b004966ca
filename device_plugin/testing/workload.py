"""Pods as the extender would place them on one node, for tests and demos: each with a pod spec whose requests
resolve to exactly its assignment, and all of them together within every GPU's memory, cores and split."""

from __future__ import annotations

import random
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

from device_plugin.pods import PodRecord
from vgpu import annotations as ann
from vgpu.devices import GpuDevice

MEMORY_CHOICES_MIB = (2048, 4096, 8192)
CORES_CHOICES = (0, 5, 10)


@dataclass(frozen=True, slots=True)
class PlacedPod:
    name: str
    uid: str
    assignment: ann.Assignment

    def containers(self) -> list[dict[str, Any]]:
        return spec_containers(self.assignment)

    def record(self, *, namespace: str, node: str, bind_time: str) -> PodRecord:
        """As the device plugin reads it from the apiserver: bind-phase allocating, on `node`."""
        return PodRecord(
            namespace=namespace,
            name=self.name,
            uid=self.uid,
            node=node,
            bind_phase=ann.BindPhase.ALLOCATING,
            bind_time=bind_time,
            assignment=self.assignment,
            spec={"spec": {"containers": self.containers()}},
        )


def spec_containers(a: ann.Assignment, image: str = "registry.invalid/vllm:1") -> list[dict[str, Any]]:
    """Pod spec containers whose requests resolve to the assignment (explicit gpumem and gpucores)."""
    return [
        {
            "name": c.name,
            "image": image,
            "resources": {
                "limits": {
                    "nvidia.com/gpu": str(len(c.devices)),
                    "nvidia.com/gpumem": str(c.devices[0].memory_mib),
                    "nvidia.com/gpucores": str(c.devices[0].cores),
                }
            },
        }
        for c in a.containers
    ]


def pod_uid(seed: int, i: int) -> str:
    return str(uuidlib.UUID(int=random.Random(seed * 1_000_003 + i).getrandbits(128), version=4))


def placed_pods(
    gpus: tuple[GpuDevice, ...] | list[GpuDevice],
    n: int,
    seed: int,
    *,
    node: str,
    max_containers: int = 2,
    max_count: int = 2,
) -> list[PlacedPod]:
    """n pods with 1..max_containers GPU containers of 1..max_count vGPUs, least-used GPUs first, never over
    a GPU's memory, cores or split count (raises ValueError when the node cannot hold them)."""
    rng = random.Random(seed)
    used = {g.uuid: [0, 0, 0] for g in gpus}  # memory, cores, slices
    by_uuid = {g.uuid: g for g in gpus}
    out: list[PlacedPod] = []
    for i in range(n):
        containers = []
        for c in range(1 if max_containers == 1 or rng.random() < 0.8 else max_containers):
            count = 1 if max_count == 1 or rng.random() < 0.8 else max_count
            memory, cores = rng.choice(MEMORY_CHOICES_MIB), rng.choice(CORES_CHOICES)

            def fits(u: str, memory: int = memory, cores: int = cores) -> bool:
                m, k, s = used[u]
                g = by_uuid[u]
                return m + memory <= g.memory_mib and k + cores <= g.cores and s + 1 <= g.split_count

            room = [u for u in used if fits(u)]
            if len(room) < count:
                raise ValueError(f"pod {i}: the node cannot hold {count} more slice(s) of {memory} MiB/{cores}%")
            chosen = sorted(room, key=lambda u: (used[u][2], rng.random()))[:count]
            rng.shuffle(chosen)
            for u in chosen:
                used[u][0] += memory
                used[u][1] += cores
                used[u][2] += 1
            devices = tuple(ann.DeviceSlice(u, by_uuid[u].index, memory, cores) for u in chosen)
            containers.append(ann.ContainerAssignment(f"c{c}", devices))
        out.append(PlacedPod(f"pod-{i:02d}", pod_uid(seed, i), ann.Assignment(node=node, containers=tuple(containers))))
    return out
