"""Physical GPUs and the nodes that hold them, as the device plugin advertises them."""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpu.kubelet_topology import NodePolicy

DEFAULT_SPLIT_COUNT = 10


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU. `cores` is the SM capacity in percent (100 = the whole card)."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    cores: int = 100
    split_count: int = DEFAULT_SPLIT_COUNT
    numa: int | None = None
    healthy: bool = True
    nvlink_peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.uuid:
            raise ValueError("GPU uuid must not be empty")
        if self.index < 0:
            raise ValueError(f"GPU {self.uuid}: index must be >= 0, got {self.index}")
        if self.memory_mib <= 0:
            raise ValueError(f"GPU {self.uuid}: memory_mib must be > 0, got {self.memory_mib}")
        if not 1 <= self.cores <= 100:
            raise ValueError(f"GPU {self.uuid}: cores must be 1..100, got {self.cores}")
        if self.split_count < 1:
            raise ValueError(f"GPU {self.uuid}: split_count must be >= 1, got {self.split_count}")


@dataclass(frozen=True, slots=True)
class Cordon:
    """A node's cordon: GPUs that get no new slice, and the entries that could not be honoured as written
    (`malformed`: not a GPU UUID; `unknown`: not on the node, still cordoned should it appear)."""

    uuids: frozenset[str] = frozenset()
    malformed: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's GPUs plus the host resources placement checks (optional: 0 = not tracked).

    `cordon`: the GPUs the admin took out of service for new slices (vgpu.cordon parses it).
    """

    name: str
    gpus: tuple[GpuDevice, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    # The node's kubelet Topology Manager as the inventory states it (vgpu.kubelet_topology); None: none.
    kubelet: NodePolicy | None = None
    cordon: Cordon = Cordon()

    @property
    def cordoned(self) -> frozenset[str]:
        return self.cordon.uuids

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for gpu in self.gpus:
            if gpu.uuid in seen:
                raise ValueError(f"node {self.name}: duplicate GPU uuid {gpu.uuid}")
            seen.add(gpu.uuid)
