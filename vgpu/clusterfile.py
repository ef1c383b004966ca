"""The cluster file: nodes, GPUs and existing allocations as YAML/JSON, for demos, tests and benchmarks.

Parsing takes the already-loaded document (a mapping), so the core stays free of file I/O. Format
(docs/cluster-file.md):

    version: v1
    nodes:
      - name: gpu-a
        cpuMilli: 64000            # optional host capacity, 0 = not tracked
        memoryMiB: 524288
        labels: {topology.kubernetes.io/zone: z1}
        gpus:                      # explicit GPUs ...
          - {uuid: GPU-a-0, index: 0, model: H100-80GB, memoryMiB: 81920, numa: 0, nvlink: [GPU-a-1]}
        gpuTemplate:               # ... or N identical GPUs (uuids GPU-<node>-<i>)
          {count: 8, model: H100-80GB, memoryMiB: 81920, split: 10, nvlink: all}
        cordonedGpus: [GPU-a-0]    # optional: no new slices there (the node's vgpu.io/cordoned-gpus)
    allocations:
      - pod: default/llama-decode-0
        assignment: {node: gpu-a, role: decode, model: default/llama, containers: [...]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from vgpu.annotations import NODE_CORDONED_GPUS, Assignment, assignment_from_obj, assignment_to_obj, gpu_to_obj
from vgpu.cordon import parse_cordon
from vgpu.devices import DEFAULT_SPLIT_COUNT, GpuDevice, NodeInventory
from vgpu.errors import CodecError, VgpuError


class ClusterFileError(VgpuError):
    """The cluster file is malformed; the message names the path of the bad field."""


def _not_bool(value: object) -> object:
    if isinstance(value, bool):  # YAML `yes`/`true` would otherwise read as the integer 1
        raise ValueError("expected an integer, got a boolean")
    return value


_Int = Annotated[int, BeforeValidator(_not_bool)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class GpuSpec(_Model):
    uuid: str = Field(min_length=1)
    index: _Int = Field(ge=0)
    model: str
    memory_mib: _Int = Field(alias="memoryMiB", gt=0)
    cores: _Int = Field(default=100, ge=1, le=100)
    split: _Int = Field(default=DEFAULT_SPLIT_COUNT, ge=1)
    numa: _Int | None = None
    healthy: bool = True
    nvlink: list[str] = Field(default_factory=list)


class GpuTemplate(_Model):
    count: _Int = Field(ge=1, le=64)
    model: str
    memory_mib: _Int = Field(alias="memoryMiB", gt=0)
    cores: _Int = Field(default=100, ge=1, le=100)
    split: _Int = Field(default=DEFAULT_SPLIT_COUNT, ge=1)
    numa_nodes: _Int = Field(default=1, alias="numaNodes", ge=1)
    nvlink: Literal["all", "pairs", "none"] = "none"


def _template_peers(nvlink: str, uuids: list[str], i: int) -> tuple[str, ...]:
    """all: every GPU a peer (an NVSwitch node); pairs: GPUs 0-1, 2-3, ... bridged (PCIe cards with NVLink
    bridges, an odd last GPU alone); none: no NVLink."""
    if nvlink == "all":
        return tuple(u for u in uuids if u != uuids[i])
    if nvlink == "pairs" and (i ^ 1) < len(uuids):
        return (uuids[i ^ 1],)
    return ()


class NodeSpec(_Model):
    name: str = Field(min_length=1)
    cpu_milli: _Int = Field(default=0, alias="cpuMilli", ge=0)
    memory_mib: _Int = Field(default=0, alias="memoryMiB", ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuSpec] = Field(default_factory=list)
    gpu_template: GpuTemplate | None = Field(default=None, alias="gpuTemplate")
    cordoned_gpus: list[str] = Field(default_factory=list, alias="cordonedGpus")

    @model_validator(mode="after")
    def _one_source(self) -> NodeSpec:
        if self.gpus and self.gpu_template is not None:
            raise ValueError("give either 'gpus' or 'gpuTemplate', not both")
        return self


class AllocationSpec(_Model):
    pod: str = Field(pattern=r"^[^/\s]+/[^/\s]+$")
    # The `vgpu.io/assignment` object without its version, decoded by the annotation's own codec.
    assignment: dict[str, Any]


class ClusterFile(_Model):
    version: Literal["v1"] = "v1"
    nodes: list[NodeSpec]
    allocations: list[AllocationSpec] = Field(default_factory=list)


def _inventory(pos: int, spec: NodeSpec) -> NodeInventory:
    if spec.gpu_template is not None:
        t = spec.gpu_template
        uuids = [f"GPU-{spec.name}-{i}" for i in range(t.count)]
        gpus = tuple(
            GpuDevice(
                uuid=uuids[i],
                index=i,
                model=t.model,
                memory_mib=t.memory_mib,
                cores=t.cores,
                split_count=t.split,
                numa=i * t.numa_nodes // t.count,
                nvlink_peers=_template_peers(t.nvlink, uuids, i),
            )
            for i in range(t.count)
        )
    else:
        gpus = tuple(
            GpuDevice(
                uuid=g.uuid,
                index=g.index,
                model=g.model,
                memory_mib=g.memory_mib,
                cores=g.cores,
                split_count=g.split,
                numa=g.numa,
                healthy=g.healthy,
                nvlink_peers=tuple(g.nvlink),
            )
            for g in spec.gpus
        )
    cordon = parse_cordon({NODE_CORDONED_GPUS: ",".join(spec.cordoned_gpus)}, (g.uuid for g in gpus))
    # A hand-written file: an entry that is not a GPU UUID of this node is a typo, not a cordon to keep.
    for what, bad in (("not GPU UUIDs", cordon.malformed), ("not GPUs of this node", cordon.unknown)):
        if bad:
            raise ValueError(f"nodes.{pos}.cordonedGpus: {what}: {', '.join(bad)}")
    return NodeInventory(
        name=spec.name,
        gpus=gpus,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        labels=dict(spec.labels),
        cordon=cordon,
    )


def _assignment(i: int, obj: Mapping[str, Any]) -> Assignment:
    try:
        return assignment_from_obj(obj, strict=True)
    except CodecError as exc:
        reason = exc.reason.removeprefix("assignment: ")
        raise ClusterFileError(f"invalid cluster file: allocations.{i}.assignment: {reason}") from None


def parse_cluster(doc: Mapping[str, Any]) -> tuple[list[NodeInventory], list[tuple[str, Assignment]]]:
    """Inventories and (pod key, assignment) pairs; ClusterFileError on any malformed field."""
    try:
        parsed = ClusterFile.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:10])
        raise ClusterFileError(f"invalid cluster file: {problems}") from None
    names = [n.name for n in parsed.nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ClusterFileError(f"invalid cluster file: duplicate node names {dupes}")
    try:
        nodes = [_inventory(i, n) for i, n in enumerate(parsed.nodes)]
    except ValueError as exc:
        raise ClusterFileError(f"invalid cluster file: {exc}") from None
    return nodes, [(a.pod, _assignment(i, a.assignment)) for i, a in enumerate(parsed.allocations)]


def _cordon_obj(n: NodeInventory) -> dict[str, Any]:
    """The node's cordoned GPUs, only its own: an unknown cordon entry marks no GPU (and the file would refuse it)."""
    own = sorted(g.uuid for g in n.gpus if g.uuid in n.cordoned)
    return {"cordonedGpus": own} if own else {}


def dump_cluster(nodes: list[NodeInventory], allocations: list[tuple[str, Assignment]]) -> dict[str, Any]:
    """The inverse of parse_cluster (explicit GPU lists), for snapshots written by the CLI."""
    return {
        "version": "v1",
        "nodes": [
            {
                "name": n.name,
                "cpuMilli": n.cpu_milli,
                "memoryMiB": n.memory_mib,
                "labels": dict(n.labels),
                "gpus": [gpu_to_obj(g) for g in n.gpus],
                **_cordon_obj(n),
            }
            for n in nodes
        ],
        "allocations": [{"pod": key, "assignment": assignment_to_obj(a)} for key, a in allocations],
    }
