"""Cluster-dependent admission checks: can any node, ever, hold what a container asks for?

`check_capacity` is pure and takes an `InventorySummary` — the distinct GPU shapes of the cluster's
nodes — so it is the same function whichever inventory source fed it (static settings or the
`vgpu.io/node-inventory` annotations). It answers "never fits", not "does not fit now": current usage
is the extender's business, and a pod that merely has to wait must be admitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vgpu import annotations as ann
from vgpu.config import ResourceNames
from vgpu.devices import GpuDevice
from vgpu.errors import RequestError
from vgpu.requests import PodRequest
from vgpu.topology import node_topology

ANY_MODEL = "*"


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One node's GPUs as (model, memory MiB), largest first, and the most of them that are all NVLink peers
    (None: not known); nodes with equal shapes collapse."""

    gpus: tuple[tuple[str, int], ...]
    nvlink: int | None = None

    @classmethod
    def of(cls, gpus: Iterable[GpuDevice]) -> NodeShape:
        devices = tuple(gpus)
        linked = max((len(c) for c in node_topology(devices).cliques), default=1)
        return cls(tuple(sorted(((g.model, g.memory_mib) for g in devices), key=lambda t: (-t[1], t[0]))), linked)

    def memories(self, models: frozenset[str] | None) -> list[int]:
        return [mem for model, mem in self.gpus if models is None or model in models or model == ANY_MODEL]


@dataclass(frozen=True, slots=True)
class InventorySummary:
    nodes: frozenset[NodeShape]

    @classmethod
    def from_nodes(cls, nodes: Iterable[Sequence[GpuDevice]]) -> InventorySummary:
        return cls(frozenset(NodeShape.of(gpus) for gpus in nodes if gpus))

    @classmethod
    def static(cls, *, max_gpu_memory_mib: int, max_gpus_per_node: int) -> InventorySummary:
        """A stand-in node with the largest GPUs and the most of them, of any model."""
        return cls(frozenset({NodeShape(((ANY_MODEL, max_gpu_memory_mib),) * max_gpus_per_node)}))

    @property
    def max_gpu_memory_mib(self) -> int:
        return max((mem for node in self.nodes for _, mem in node.gpus), default=0)

    @property
    def max_gpus_per_node(self) -> int:
        return max((len(node.gpus) for node in self.nodes), default=0)


def check_capacity(
    request: PodRequest,
    summary: InventorySummary,
    names: ResourceNames = ResourceNames(),
    gpu_models: frozenset[str] | None = None,
    *,
    require_nvlink: bool = False,
) -> RequestError | None:
    """The first container that no node of the cluster could ever hold, as a RequestError. With `require_nvlink`
    (vgpu.io/require-nvlink), a multi-GPU container also needs a node with that many NVLink peers, where every
    node's links are known (a static summary knows none)."""
    where = f" of model {', '.join(sorted(gpu_models))}" if gpu_models else ""
    shapes = [m for node in summary.nodes if (m := node.memories(gpu_models))]
    for c in request.containers:
        if not shapes:
            return RequestError(
                container=c.container,
                resource=f"annotation {ann.POD_USE_GPU_MODELS}",
                value=",".join(sorted(gpu_models or ())),
                allowed="GPU models present in the cluster: "
                + ", ".join(sorted({model for node in summary.nodes for model, _ in node.gpus})),
            )
        most = max(len(m) for m in shapes)
        if c.count > most:
            return RequestError(
                container=c.container,
                resource=names.count,
                value=c.count,
                allowed=f"1..{most} (the most GPUs{where} on any node)",
            )
        linked = [node.nvlink for node in summary.nodes]
        if require_nvlink and c.count > 1 and None not in linked:
            peers = max(n for n in linked if n is not None)
            if c.count > peers:
                return RequestError(
                    container=c.container,
                    resource=names.count,
                    value=c.count,
                    allowed=f"1..{peers} with {ann.POD_REQUIRE_NVLINK} (the most GPUs of any node that are all NVLink peers)",
                )
        if c.memory_mib is None:
            continue
        largest = max(max(m) for m in shapes)
        if c.memory_mib > largest:
            return RequestError(
                container=c.container,
                resource=names.memory,
                value=c.memory_mib,
                allowed=f"1..{largest} MiB (the largest GPU{where} in the cluster)",
            )
        best = max(sum(1 for mem in m if mem >= c.memory_mib) for m in shapes)
        if best < c.count:
            return RequestError(
                container=c.container,
                resource=f"{names.count}+{names.memory}",
                value={names.count: c.count, names.memory: c.memory_mib},
                allowed=f"at most {best} vGPUs of {c.memory_mib} MiB{where} on one node",
            )
    return None
