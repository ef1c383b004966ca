"""The annotation protocol between the device plugin and the extender (docs/annotations.md).

Node annotations are written by the device plugin; pod annotations by the extender at bind time.
Every value is versioned JSON so either side can evolve without misreading the other; decoding
validates the full shape and raises CodecError naming the key and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from vgpu.devices import GpuDevice
from vgpu.errors import CodecError
from vgpu.roles import Role

PREFIX = "vgpu.io/"
NODE_INVENTORY = PREFIX + "node-inventory"
NODE_INVENTORY_TIME = PREFIX + "node-inventory-time"
POD_ASSIGNMENT = PREFIX + "assignment"
POD_BIND_PHASE = PREFIX + "bind-phase"
POD_BIND_TIME = PREFIX + "bind-time"
POD_NODE_POLICY = PREFIX + "node-policy"
POD_GPU_POLICY = PREFIX + "gpu-policy"
# Written by the extender on a pending pod when capacity frees: a pod update, which makes kube-scheduler retry it.
POD_REQUEUE = PREFIX + "requeue"
# A label, not an annotation: on the extender's own pod while it leads; its Service selects it (leader election).
EXTENDER_LEADER_LABEL = PREFIX + "extender-leader"
VERSION = "v1"


class BindPhase(StrEnum):
    """allocating: assignment written, binding not yet confirmed; allocated: bound; failed: released."""

    ALLOCATING = "allocating"
    ALLOCATED = "allocated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class DeviceSlice:
    """A share of one physical GPU handed to one container."""

    uuid: str
    index: int
    memory_mib: int
    cores: int


@dataclass(frozen=True, slots=True)
class ContainerAssignment:
    name: str
    devices: tuple[DeviceSlice, ...]


@dataclass(frozen=True, slots=True)
class Assignment:
    """Which slices of which GPUs on which node a pod holds; the source of truth after restarts."""

    node: str
    containers: tuple[ContainerAssignment, ...]
    role: Role = Role.PREFILL_DECODE
    model: str | None = None

    def slices(self) -> list[DeviceSlice]:
        return [d for c in self.containers for d in c.devices]


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _load(key: str, value: str) -> dict[str, Any]:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise CodecError(key=key, reason=f"not JSON ({exc.msg} at char {exc.pos})", value=value) from None
    if not isinstance(obj, dict):
        raise CodecError(key=key, reason="expected a JSON object", value=value)
    version = obj.get("version")
    if version != VERSION:
        raise CodecError(key=key, reason=f"unsupported version {version!r}; this build reads {VERSION!r}", value=value)
    return obj


def _field(key: str, obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in obj:
        raise CodecError(key=key, reason=f"{where}: missing field {name!r}")
    value = obj[name]
    if isinstance(value, bool) and kind is not bool and (kind is int or (isinstance(kind, tuple) and bool not in kind)):
        raise CodecError(key=key, reason=f"{where}: field {name!r} must be {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        got = type(value).__name__
        raise CodecError(key=key, reason=f"{where}: field {name!r} must be {_kind_name(kind)}, got {got}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


# --- node inventory -------------------------------------------------------------------------------


def encode_inventory(gpus: tuple[GpuDevice, ...] | list[GpuDevice]) -> str:
    return _dumps(
        {
            "version": VERSION,
            "gpus": [
                {
                    "uuid": g.uuid,
                    "index": g.index,
                    "model": g.model,
                    "memoryMiB": g.memory_mib,
                    "cores": g.cores,
                    "split": g.split_count,
                    "numa": g.numa,
                    "healthy": g.healthy,
                    "nvlink": list(g.nvlink_peers),
                }
                for g in gpus
            ],
        }
    )


def decode_inventory(value: str) -> tuple[GpuDevice, ...]:
    key = NODE_INVENTORY
    obj = _load(key, value)
    raw = _field(key, obj, "gpus", list, "inventory")
    gpus: list[GpuDevice] = []
    for i, g in enumerate(raw):
        where = f"gpus[{i}]"
        if not isinstance(g, dict):
            raise CodecError(key=key, reason=f"{where}: expected an object")
        numa = g.get("numa")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int)):
            raise CodecError(key=key, reason=f"{where}: field 'numa' must be int or null")
        peers = g.get("nvlink", [])
        if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
            raise CodecError(key=key, reason=f"{where}: field 'nvlink' must be a list of GPU uuids")
        try:
            gpus.append(
                GpuDevice(
                    uuid=_field(key, g, "uuid", str, where),
                    index=_field(key, g, "index", int, where),
                    model=_field(key, g, "model", str, where),
                    memory_mib=_field(key, g, "memoryMiB", int, where),
                    cores=_field(key, g, "cores", int, where),
                    split_count=_field(key, g, "split", int, where),
                    numa=numa,
                    healthy=_field(key, g, "healthy", bool, where),
                    nvlink_peers=tuple(peers),
                )
            )
        except ValueError as exc:
            raise CodecError(key=key, reason=f"{where}: {exc}") from None
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise CodecError(key=key, reason="duplicate GPU uuid in inventory")
    return tuple(gpus)


# --- pod assignment -------------------------------------------------------------------------------


def encode_assignment(a: Assignment) -> str:
    return _dumps(
        {
            "version": VERSION,
            "node": a.node,
            "role": a.role.value,
            "model": a.model,
            "containers": [
                {
                    "name": c.name,
                    "devices": [
                        {"uuid": d.uuid, "index": d.index, "memoryMiB": d.memory_mib, "cores": d.cores}
                        for d in c.devices
                    ],
                }
                for c in a.containers
            ],
        }
    )


def decode_assignment(value: str) -> Assignment:
    key = POD_ASSIGNMENT
    obj = _load(key, value)
    node = _field(key, obj, "node", str, "assignment")
    if not node:
        raise CodecError(key=key, reason="assignment: 'node' must not be empty")
    role_raw = obj.get("role", Role.PREFILL_DECODE.value)
    try:
        role = Role(role_raw)
    except ValueError:
        allowed = ", ".join(r.value for r in Role)
        raise CodecError(key=key, reason=f"assignment: unknown role {role_raw!r}; allowed: {allowed}") from None
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise CodecError(key=key, reason="assignment: 'model' must be a string or null")
    containers: list[ContainerAssignment] = []
    for ci, c in enumerate(_field(key, obj, "containers", list, "assignment")):
        where = f"containers[{ci}]"
        if not isinstance(c, dict):
            raise CodecError(key=key, reason=f"{where}: expected an object")
        devices: list[DeviceSlice] = []
        for di, d in enumerate(_field(key, c, "devices", list, where)):
            dwhere = f"{where}.devices[{di}]"
            if not isinstance(d, dict):
                raise CodecError(key=key, reason=f"{dwhere}: expected an object")
            mem = _field(key, d, "memoryMiB", int, dwhere)
            cores = _field(key, d, "cores", int, dwhere)
            index = _field(key, d, "index", int, dwhere)
            for name, value, ok, allowed in (
                ("memoryMiB", mem, mem >= 0, ">= 0"),
                ("cores", cores, 0 <= cores <= 100, "0..100"),
                ("index", index, index >= 0, ">= 0"),
            ):
                if not ok:
                    raise CodecError(key=key, reason=f"{dwhere}: field {name!r} must be {allowed}, got {value}")
            uuid = _field(key, d, "uuid", str, dwhere)
            devices.append(DeviceSlice(uuid=uuid, index=index, memory_mib=mem, cores=cores))
        uuids = [d.uuid for d in devices]
        if len(set(uuids)) != len(uuids):
            raise CodecError(key=key, reason=f"{where}: a container's vGPUs must be on distinct GPUs")
        containers.append(ContainerAssignment(name=_field(key, c, "name", str, where), devices=tuple(devices)))
    return Assignment(node=node, containers=tuple(containers), role=role, model=model)


def decode_bind_phase(value: str) -> BindPhase:
    try:
        return BindPhase(value)
    except ValueError:
        allowed = ", ".join(p.value for p in BindPhase)
        raise CodecError(key=POD_BIND_PHASE, reason=f"unknown phase; allowed: {allowed}", value=value) from None
