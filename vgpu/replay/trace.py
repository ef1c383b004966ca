"""openb trace rows and their mapping onto the core's resource model.

A GPU is 1000 milli. Every openb GPU becomes a `GpuDevice` of `GPU_MEMORY_MIB` (one size for every model:
requests are fractions, and one size makes the milli mapping exact). A sharing pod (`gpu_milli < 1000`)
asks for `memory_percentage = cores = gpu_milli / 10` when gpu_milli is a multiple of 10 (the path real
pods use); otherwise it takes the milli-precision path `memory_mib = gpu_milli * GPU_MEMORY_MIB / 1000`
with `cores = gpu_milli // 10`, where memory is exact and the floored cores can never bind first.
`split_count` is `SPLIT_COUNT` so the sharer limit never binds (the paper has none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpu.devices import GpuDevice, NodeInventory
from vgpu.pod import PodInfo
from vgpu.requests import ContainerRequest, PodRequest

MILLI = 1000
GPU_MEMORY_MIB = 100_000  # 100 MiB per milli: exact for every gpu_milli
SPLIT_COUNT = 1000  # >= the most slices a GPU can hold (1 milli each): no sharer limit, as in the paper
NAMESPACE = "openb"


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class PodRow:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] | None = None

    @property
    def gpu_demand_milli(self) -> int:
        """GPU the pod asks for, in milli: what `arrived`/`allocated` add up."""
        if self.num_gpu == 0:
            return 0
        return self.gpu_milli if self.gpu_milli < MILLI else self.num_gpu * MILLI


def _int(row: Mapping[str, str], key: str) -> int:
    raw = (row.get(key) or "0").strip()
    return int(float(raw)) if raw else 0


def _spec(raw: str | None) -> frozenset[str] | None:
    text = (raw or "").strip()
    if not text or text.lower() == "nan":
        return None
    return frozenset(m.strip() for m in text.split("|") if m.strip()) or None


def parse_nodes(rows: Iterable[Mapping[str, str]]) -> list[NodeRow]:
    """Rows of `openb_node_list_*.csv` (columns sn,cpu_milli,memory_mib,gpu,model); CPU-only nodes kept."""
    return [
        NodeRow(r["sn"], _int(r, "cpu_milli"), _int(r, "memory_mib"), _int(r, "gpu"), (r.get("model") or "").strip())
        for r in rows
    ]


def parse_pods(rows: Iterable[Mapping[str, str]]) -> list[PodRow]:
    """Rows of `openb_pod_list_*.csv`; `gpu_spec` is optional (the multigpu files lack it)."""
    out: list[PodRow] = []
    for r in rows:
        num_gpu, milli = _int(r, "num_gpu"), _int(r, "gpu_milli")
        if num_gpu > 1 and milli != MILLI:
            raise ValueError(f"pod {r['name']}: {num_gpu} GPUs of {milli} milli; only 1-GPU pods may share")
        if num_gpu == 1 and not 0 < milli <= MILLI:
            raise ValueError(f"pod {r['name']}: gpu_milli {milli} not in 1..1000")
        out.append(
            PodRow(r["name"], _int(r, "cpu_milli"), _int(r, "memory_mib"), num_gpu, milli, _spec(r.get("gpu_spec")))
        )
    return out


def to_inventory(row: NodeRow) -> NodeInventory:
    gpus = tuple(
        GpuDevice(
            uuid=f"{row.name}-gpu{i}", index=i, model=row.model, memory_mib=GPU_MEMORY_MIB, split_count=SPLIT_COUNT
        )
        for i in range(row.gpus)
    )
    return NodeInventory(name=row.name, gpus=gpus, cpu_milli=row.cpu_milli, memory_mib=row.memory_mib)


def to_request(row: PodRow) -> PodRequest:
    if row.num_gpu == 0:
        return PodRequest(())
    if row.gpu_milli >= MILLI:
        req = ContainerRequest("main", row.num_gpu, None, 100, 100, 1)
    elif row.gpu_milli % 10 == 0:
        req = ContainerRequest("main", 1, None, row.gpu_milli // 10, row.gpu_milli // 10, 1)
    else:
        req = ContainerRequest("main", 1, row.gpu_milli * (GPU_MEMORY_MIB // MILLI), None, row.gpu_milli // 10, 1)
    return PodRequest((req,))


def to_pod_info(row: PodRow, key: str) -> PodInfo:
    """`key` must be unique per arrival (inflation repeats rows)."""
    return PodInfo(
        namespace=NAMESPACE,
        name=key,
        uid=key,
        request=to_request(row),
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        gpu_models=row.gpu_spec,
    )
