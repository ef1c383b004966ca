"""The `vgpu.io/` vocabulary: every annotation and label key kube-vgpu writes or reads, and their codecs.

The components never talk to each other directly: they exchange state through these keys on Node and
Pod objects (docs/annotations.md, whose table a unit test keeps equal to `KEYS`). Every structured value
is versioned JSON so either side can evolve without misreading the other; decoding validates the full
shape and raises CodecError naming the key and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import orjson

from vgpu.devices import GpuDevice
from vgpu.errors import AnnotationError, CodecError
from vgpu.roles import Role

PREFIX = "vgpu.io/"
VERSION = "v1"

# Node annotations, written by the device plugin.
NODE_INVENTORY = PREFIX + "node-inventory"
NODE_INVENTORY_TIME = PREFIX + "node-inventory-time"
# Node annotation the cluster admin writes: GPU UUIDs that get no new slice (vgpu.cordon).
NODE_CORDONED_GPUS = PREFIX + "cordoned-gpus"
# Pod annotations written by the extender at bind time (bind-phase `allocated` by the device plugin).
POD_ASSIGNMENT = PREFIX + "assignment"
POD_BIND_PHASE = PREFIX + "bind-phase"
POD_BIND_TIME = PREFIX + "bind-time"
# Written by the extender on a pending pod when capacity frees: a pod update, which makes kube-scheduler retry it.
POD_REQUEUE = PREFIX + "requeue"
# Written by the device plugin's watchdog on a pod whose slice broke its limits (encode_violation).
POD_VIOLATION = PREFIX + "violation"
# Pod annotations the user writes (pod_overrides parses them).
POD_NODE_POLICY = PREFIX + "node-policy"
POD_GPU_POLICY = PREFIX + "gpu-policy"
POD_USE_GPU_MODELS = PREFIX + "use-gpu-models"
POD_REQUIRE_NVLINK = PREFIX + "require-nvlink"  # "true": a multi-GPU container only on NVLink peers (vgpu.topology)
# "off": the webhook leaves the pod's vLLM / SGLang memory flags as written (vgpu.model_servers).
POD_MODEL_SERVER_SIZING = PREFIX + "model-server-sizing"
MODEL_SERVER_SIZING_OFF = "off"
# Pod labels the webhook stamps: static slice facts llm-d's endpoint picker copies onto its endpoints.
LABEL_MANAGED = PREFIX + "managed"  # "true": the webhook admitted this pod as a vGPU pod
LABEL_ROLE = PREFIX + "role"  # prefill | decode | prefill-decode | encode | encode-prefill | encode-prefill-decode
LABEL_ROLE_SOURCE = PREFIX + "role-source"  # label | sglang-arg | routing-sidecar | kv-transfer-config | default
LABEL_VGPUS = PREFIX + "vgpus"  # total vGPUs of the pod
LABEL_GPUMEM = PREFIX + "gpumem"  # MiB per vGPU (when asked in MiB)
LABEL_GPUMEM_PERCENTAGE = PREFIX + "gpumem-percentage"  # percent of the card per vGPU (asked or defaulted)
LABEL_GPUCORES = PREFIX + "gpucores"  # percent of SMs per vGPU, or "proportional" (= memory share, per card)
LABEL_PRIORITY = PREFIX + "priority"  # 0 high, 1 low
WEBHOOK_LABELS = (
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_ROLE_SOURCE,
    LABEL_VGPUS,
    LABEL_GPUMEM,
    LABEL_GPUMEM_PERCENTAGE,
    LABEL_GPUCORES,
    LABEL_PRIORITY,
)
# Set by the user on a pod or namespace: the webhook configurations' selectors then skip it.
LABEL_WEBHOOK = PREFIX + "webhook"
WEBHOOK_DISABLED = "disabled"
# A label, not an annotation: on the extender's own pod while it leads; its Service selects it (leader election).
EXTENDER_LEADER_LABEL = PREFIX + "extender-leader"
# CRI annotations in the device plugin's Allocate response: which pod and container a slice belongs to.
CRI_POD = PREFIX + "pod"
CRI_CONTAINER = PREFIX + "container"
# Labels of the llm-d file-discovery endpoints the device plugin writes (device_plugin.telemetry.discovery_file).
ENDPOINT_GPU = PREFIX + "gpu"
ENDPOINT_GPU_MEMORY_BYTES = PREFIX + "gpu-memory-bytes"
ENDPOINT_GPU_CORES = PREFIX + "gpu-cores"
ENDPOINT_ROLE = PREFIX + "role"
ENDPOINT_MODEL = PREFIX + "model"

KeyKind = Literal["annotation", "label", "CRI annotation", "endpoint label"]


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the vocabulary: what kind of metadata it is and which objects carry it."""

    name: str
    kind: KeyKind
    on: str


KEYS: tuple[Key, ...] = (
    Key(NODE_INVENTORY, "annotation", "Node"),
    Key(NODE_INVENTORY_TIME, "annotation", "Node"),
    Key(NODE_CORDONED_GPUS, "annotation", "Node"),
    Key(POD_ASSIGNMENT, "annotation", "Pod"),
    Key(POD_BIND_PHASE, "annotation", "Pod"),
    Key(POD_BIND_TIME, "annotation", "Pod"),
    Key(POD_REQUEUE, "annotation", "Pod"),
    Key(POD_VIOLATION, "annotation", "Pod"),
    Key(POD_NODE_POLICY, "annotation", "Pod"),
    Key(POD_GPU_POLICY, "annotation", "Pod"),
    Key(POD_USE_GPU_MODELS, "annotation", "Pod"),
    Key(POD_REQUIRE_NVLINK, "annotation", "Pod"),
    Key(POD_MODEL_SERVER_SIZING, "annotation", "Pod"),
    *(Key(k, "label", "Pod") for k in WEBHOOK_LABELS),
    Key(LABEL_WEBHOOK, "label", "Pod, Namespace"),
    Key(EXTENDER_LEADER_LABEL, "label", "Pod"),
    Key(CRI_POD, "CRI annotation", "container"),
    Key(CRI_CONTAINER, "CRI annotation", "container"),
    Key(ENDPOINT_GPU, "endpoint label", "file-discovery endpoint"),
    Key(ENDPOINT_GPU_MEMORY_BYTES, "endpoint label", "file-discovery endpoint"),
    Key(ENDPOINT_GPU_CORES, "endpoint label", "file-discovery endpoint"),
    Key(ENDPOINT_ROLE, "endpoint label", "file-discovery endpoint"),
    Key(ENDPOINT_MODEL, "endpoint label", "file-discovery endpoint"),
)


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
    # orjson first: a restart decodes one inventory per node and one assignment per pod (tens of thousands), ~5x
    # faster. What it refuses (NaN, numbers out of double range, lone surrogates) goes to the standard library, whose
    # answers and error messages stay the contract.
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
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


def gpu_to_obj(g: GpuDevice) -> dict[str, Any]:
    """One GPU as the inventory writes it; the cluster file's explicit GPU lists use the same fields."""
    return {
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


def encode_inventory(gpus: tuple[GpuDevice, ...] | list[GpuDevice]) -> str:
    return _dumps({"version": VERSION, "gpus": [gpu_to_obj(g) for g in gpus]})


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


_ASSIGNMENT_FIELDS = frozenset({"node", "role", "model", "containers"})
_CONTAINER_FIELDS = frozenset({"name", "devices"})
_SLICE_FIELDS = frozenset({"uuid", "index", "memoryMiB", "cores"})


def assignment_to_obj(a: Assignment) -> dict[str, Any]:
    """The assignment as a JSON object, unversioned: the annotation's body and a cluster file's `assignment`."""
    return {
        "node": a.node,
        "role": a.role.value,
        "model": a.model,
        "containers": [
            {
                "name": c.name,
                "devices": [
                    {"uuid": d.uuid, "index": d.index, "memoryMiB": d.memory_mib, "cores": d.cores} for d in c.devices
                ],
            }
            for c in a.containers
        ],
    }


def encode_assignment(a: Assignment) -> str:
    return _dumps({"version": VERSION, **assignment_to_obj(a)})


def decode_assignment(value: str) -> Assignment:
    return assignment_from_obj(_load(POD_ASSIGNMENT, value))


def _no_unknown(obj: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise CodecError(
            key=POD_ASSIGNMENT, reason=f"{where}: unknown field(s) {unknown}; allowed: {', '.join(sorted(allowed))}"
        )


def assignment_from_obj(obj: Mapping[str, Any], *, strict: bool = False) -> Assignment:
    """The inverse of assignment_to_obj; CodecError naming the field path.

    strict: unknown fields are errors (a hand-written cluster file, where they are typos). The annotation is
    not strict, so an optional field a newer writer adds does not break an older reader (docs/annotations.md).
    """
    key = POD_ASSIGNMENT
    if strict:
        _no_unknown(obj, _ASSIGNMENT_FIELDS, "assignment")
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
        if strict:
            _no_unknown(c, _CONTAINER_FIELDS, where)
        devices: list[DeviceSlice] = []
        for di, d in enumerate(_field(key, c, "devices", list, where)):
            dwhere = f"{where}.devices[{di}]"
            if not isinstance(d, dict):
                raise CodecError(key=key, reason=f"{dwhere}: expected an object")
            if strict:
                _no_unknown(d, _SLICE_FIELDS, dwhere)
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


# --- watchdog violation ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Violation:
    """The watchdog's last finding about a pod's slice: which container on which GPU broke which limits."""

    container: str
    gpu: str
    kinds: tuple[str, ...]
    reason: str
    time: str  # ISO 8601, UTC


def encode_violation(v: Violation) -> str:
    return _dumps(
        {
            "version": VERSION,
            "container": v.container,
            "gpu": v.gpu,
            "kinds": list(v.kinds),
            "reason": v.reason,
            "time": v.time,
        }
    )


def decode_violation(value: str) -> Violation:
    key = POD_VIOLATION
    obj = _load(key, value)
    kinds = _field(key, obj, "kinds", list, "violation")
    if not all(isinstance(k, str) for k in kinds):
        raise CodecError(key=key, reason="violation: field 'kinds' must be a list of strings")
    return Violation(
        container=_field(key, obj, "container", str, "violation"),
        gpu=_field(key, obj, "gpu", str, "violation"),
        kinds=tuple(kinds),
        reason=_field(key, obj, "reason", str, "violation"),
        time=_field(key, obj, "time", str, "violation"),
    )


# --- the user's per-pod overrides ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodOverrides:
    """What a pod's own annotations ask of placement; names are checked where they are resolved."""

    node_policy: str | None = None
    gpu_policy: str | None = None
    gpu_models: frozenset[str] | None = None


def parse_gpu_models(value: str | None) -> frozenset[str] | None:
    """`vgpu.io/use-gpu-models`: comma-separated GPU models; None (any model) when absent or empty."""
    if not value:
        return None
    return frozenset(m.strip() for m in value.split(",") if m.strip()) or None


def require_nvlink(annotations: Mapping[str, object]) -> bool:
    """`vgpu.io/require-nvlink`: "true" holds every multi-GPU container of the pod to GPUs that are all NVLink
    peers; "false", empty or absent leaves it a preference. AnnotationError on any other value."""
    value = annotations.get(POD_REQUIRE_NVLINK)
    if value is None or value in ("", "false"):  # empty reads as absent, like the other vgpu.io/ pod keys
        return False
    if value == "true":
        return True
    raise AnnotationError(key=POD_REQUIRE_NVLINK, value=str(value), allowed='"true" or "false"')


def pod_overrides(annotations: Mapping[str, object]) -> PodOverrides:
    """The per-pod annotations the user writes; values that are not strings (hostile JSON) read as absent."""

    def text(key: str) -> str | None:
        value = annotations.get(key)
        return value if isinstance(value, str) and value else None

    return PodOverrides(
        node_policy=text(POD_NODE_POLICY),
        gpu_policy=text(POD_GPU_POLICY),
        gpu_models=parse_gpu_models(text(POD_USE_GPU_MODELS)),
    )
