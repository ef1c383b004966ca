"""A model pool as the what-if sees it: prefill and decode instances, each a slice (SM share, memory,
TP) at a place (GPU, node, rack). Pure. The link between two instances decides the KV transfer time,
with the bandwidths of `vgpu.perf.params.LINK_GB_S` (same rule as `vgpu.perf.cluster.link`, nodes
assumed NVLink-connected inside).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from vgpu.perf.params import GpuSpec, Link, ModelSpec

Role = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class Instance:
    name: str
    role: Role
    sm_share: float  # share of the GPU's SMs the slice owns (0..1]
    memory_gb: float  # per GPU of the slice
    gpu: str  # GPU id, unique in the cluster
    node: str
    rack: str
    tp: int = 1
    slowdown: float = 1.0  # co-residence slowdown of this slice (vgpu.perf.cluster.GpuView), >= 1


@dataclass(frozen=True, slots=True)
class Pool:
    model: ModelSpec
    gpu: GpuSpec
    instances: tuple[Instance, ...]

    def role(self, role: Role) -> list[Instance]:
        return [i for i in self.instances if i.role == role]

    def check(self) -> None:
        """Raise ValueError naming what is wrong: a pool needs prefill and decode instances with sane slices."""
        for role in ("prefill", "decode"):
            if not self.role(role):
                raise ValueError(f"pool of {self.model.name} has no {role} instance: it needs at least one")
        for i in self.instances:
            if not 0 < i.sm_share <= 1 or i.tp < 1 or i.slowdown < 1:
                raise ValueError(f"instance {i.name}: sm_share must be in (0, 1], tp >= 1, slowdown >= 1")
            if i.memory_gb * i.tp * 0.9 <= self.model.weights_gb:
                raise ValueError(
                    f"instance {i.name}: {i.memory_gb} GB x{i.tp} does not hold {self.model.name}'s "
                    f"{self.model.weights_gb:.0f} GB of weights with room for KV"
                )

    def add(self, role: Role, count: int) -> Pool:
        """The pool with `count` more instances shaped and placed like the role's first (a what-if)."""
        like = self.role(role)[0]
        extra = tuple(replace(like, name=f"{like.name}+{k + 1}", gpu=f"{like.gpu}+{k + 1}") for k in range(count))
        return replace(self, instances=self.instances + extra)

    def colocated(self) -> Pool:
        """The pool with each decode moved onto the node (and rack) of a prefill, round-robin (a what-if)."""
        prefills = self.role("prefill")
        moved: list[Instance] = []
        k = 0
        for i in self.instances:
            if i.role == "decode":
                p = prefills[k % len(prefills)]
                k += 1
                i = replace(i, node=p.node, rack=p.rack)
            moved.append(i)
        return replace(self, instances=tuple(moved))


def link(a: Instance, b: Instance) -> Link:
    if a.gpu == b.gpu:
        return "same-gpu"
    if a.node == b.node:
        return "nvlink"
    return "rack" if a.rack == b.rack else "cross-rack"


LINK_RANK: dict[Link, int] = {"same-gpu": 0, "nvlink": 1, "pcie": 2, "rack": 3, "cross-rack": 4}
