"""HAMi's pod annotations, read with HAMi's semantics and mapped onto kube-vgpu's own, so HAMi pods run unchanged.

HAMi (Project-HAMi/HAMi) lets a pod pick or avoid GPUs by type and UUID and override the scheduler's policies.
What each key means there, from its source (HAMi v2.4 - v2.6, pkg/device/nvidia/device.go at commit
024910e171ebb5f8e7f872c50cbd37fc4d858031, `checkGPUtype` and `CheckUUID`; pkg/scheduler/policy/constant.go at
0e2a6e47bd21272094221edb955a1b1389ffdd05 for the policy keys and values):

- `nvidia.com/use-gputype` / `nvidia.com/nouse-gputype`: comma-separated; a GPU matches an entry when the entry,
  upper-cased, is a substring of the GPU's upper-cased HAMi type. HAMi's device plugin registers the type as
  "NVIDIA-" + the NVML name (pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go, `getAPIDevices`:
  `fmt.Sprintf("%v-%v", "NVIDIA", Model)`), so "A100" and "NVIDIA-NVIDIA A100" both match an "NVIDIA A100-SXM4-40GB".
  With use-gputype the GPU must match one entry; with nouse-gputype it must match none; both apply together.
- `nvidia.com/use-gpuuuid` / `nvidia.com/nouse-gpuuuid`: comma-separated UUIDs, exact match. When use-gpuuuid is
  set HAMi never reads nouse-gpuuuid (`CheckUUID` returns on the first key it finds); kept here, with a warning.
- `hami.io/node-scheduler-policy`: `binpack` | `spread`; `hami.io/gpu-scheduler-policy`: `binpack` | `spread`
  (newer HAMi also `topology-aware`).

Where kube-vgpu differs, on purpose: entries are trimmed and empty ones dropped (HAMi keeps the spaces, and an
empty entry, as in "A100,", is a substring of every type: it would allow every GPU); a value HAMi does not define
(a policy named `Spread`, a UUID with a space) is refused naming the key and what is allowed, where HAMi falls
back to binpack or simply never matches. Where a pod gives both kube-vgpu's key and HAMi's for the same thing
(`vgpu.io/use-gpu-models` and `nvidia.com/use-gputype`, `vgpu.io/node-policy` and `hami.io/node-scheduler-policy`,
`vgpu.io/gpu-policy` and `hami.io/gpu-scheduler-policy`), kube-vgpu's wins and the webhook says so (`notes`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from vgpu import annotations as ann
from vgpu.devices import GpuDevice
from vgpu.errors import RequestError

USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
USE_GPU_UUID = "nvidia.com/use-gpuuuid"
NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
KEYS = (USE_GPU_TYPE, NOUSE_GPU_TYPE, USE_GPU_UUID, NOUSE_GPU_UUID, NODE_POLICY, GPU_POLICY)
# HAMi pod keys kube-vgpu does not honour: named in a warning, never silently dropped (pkg/device/nvidia/device.go,
# AllocateMode and NumaBind).
UNSUPPORTED = {
    "nvidia.com/vgpu-mode": "kube-vgpu has no per-pod device mode (HAMi-core, MIG, MPS are node settings: docs/enforcement.md)",
    "nvidia.com/numa-bind": "kube-vgpu does not require one NUMA node per pod from this key",
}

# HAMi's policy values and the kube-vgpu names they map to (vgpu.placement.registry: node policies, GPU_POLICIES).
NODE_POLICIES = {"binpack": "binpack", "spread": "spread"}
# `topology-aware` maps to no override: the cluster's GPU order, whose fit already prefers connected GPU sets.
GPU_POLICIES: dict[str, str | None] = {"binpack": "binpack", "spread": "spread", "topology-aware": None}

# An NVML UUID: "GPU-" or "MIG-" then letters, digits and dashes (nvmlDeviceGetUUID). No spaces, commas or the
# device plugin's "::" replica suffix.
GPU_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9-]*$")
UUID_ALLOWED = "comma-separated GPU UUIDs as nvidia-smi -L prints them (GPU-<hex>-..., or MIG-...)"


class AnnotationValueError(RequestError):
    """A pod annotation's value can never be honoured; names the key, the value and what is allowed."""

    def __init__(self, *, key: str, value: str, allowed: str) -> None:
        self.container = ""
        self.resource = f"annotation {key}"
        self.value = value
        self.allowed = allowed
        Exception.__init__(self, f"annotation {key}={value!r} is invalid; allowed: {allowed}")


def hami_type(model: str) -> str:
    """The type string HAMi's device plugin registers for a GPU with this NVML name, upper-cased for matching."""
    return f"NVIDIA-{model}".upper()


@dataclass(frozen=True, slots=True)
class GpuFilter:
    """HAMi's per-GPU selection: type substrings to require/avoid (upper-cased), UUIDs to require/avoid."""

    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] | None = None
    nouse_uuids: frozenset[str] = frozenset()

    def blocker(self, gpu: GpuDevice) -> str | None:
        """The fit's reason key ("model" or "uuid") when this GPU is not allowed, None when it is."""
        if self.use_types is not None or self.nouse_types:
            kind = hami_type(gpu.model)
            if self.use_types is not None and not any(t in kind for t in self.use_types):
                return "model"
            if any(t in kind for t in self.nouse_types):
                return "model"
        if self.use_uuids is not None:
            return None if gpu.uuid in self.use_uuids else "uuid"  # HAMi ignores nouse-gpuuuid then
        return "uuid" if gpu.uuid in self.nouse_uuids else None


@dataclass(frozen=True, slots=True)
class Selection:
    """What a pod's annotations ask of placement once kube-vgpu's and HAMi's keys are merged.

    `overrides` are kube-vgpu's (HAMi's policies mapped in where the pod gave none of ours); `gpu_filter` is HAMi's
    GPU selection (None: none given); `notes` say which given keys were not used, for the webhook's warnings.
    """

    overrides: ann.PodOverrides
    gpu_filter: GpuFilter | None = None
    notes: tuple[str, ...] = ()


def _entries(value: str) -> tuple[str, ...]:
    return tuple(e.strip() for e in value.split(",") if e.strip())


def _uuids(key: str, value: str) -> frozenset[str]:
    entries = _entries(value)
    bad = [e for e in entries if not GPU_UUID.match(e)]
    if bad:
        raise AnnotationValueError(key=key, value=value, allowed=f"{UUID_ALLOWED}; not {', '.join(map(repr, bad))}")
    return frozenset(entries)


def _text(annotations: Mapping[str, object], key: str) -> str | None:
    value = annotations.get(key)
    return value if isinstance(value, str) else None


def select(annotations: Mapping[str, object]) -> Selection:
    """Merge the pod's kube-vgpu and HAMi annotations; AnnotationValueError on a HAMi value HAMi does not define."""
    ours = ann.pod_overrides(annotations)
    raw = {k: v for k in KEYS if (v := _text(annotations, k)) is not None}
    notes = [f"{k} is not honoured: {why}" for k, why in UNSUPPORTED.items() if k in annotations]
    if not raw:
        return Selection(overrides=ours, notes=tuple(notes))

    def dropped_empty(key: str) -> None:
        value = raw[key]
        if any(not e.strip() for e in value.split(",")):
            notes.append(
                f"{key}: empty entries in {value!r} are ignored (HAMi would let an empty entry match every GPU)"
            )

    use_types: tuple[str, ...] | None = None
    if USE_GPU_TYPE in raw:
        dropped_empty(USE_GPU_TYPE)
        if ours.gpu_models is not None:
            notes.append(f"{USE_GPU_TYPE} is ignored: {ann.POD_USE_GPU_MODELS} is set and kube-vgpu's own key wins")
        else:
            use_types = tuple(e.upper() for e in _entries(raw[USE_GPU_TYPE])) or None
    nouse_types: tuple[str, ...] = ()
    if NOUSE_GPU_TYPE in raw:
        dropped_empty(NOUSE_GPU_TYPE)
        nouse_types = tuple(e.upper() for e in _entries(raw[NOUSE_GPU_TYPE]))
    use_uuids = _uuids(USE_GPU_UUID, raw[USE_GPU_UUID]) if USE_GPU_UUID in raw else None
    nouse_uuids = _uuids(NOUSE_GPU_UUID, raw[NOUSE_GPU_UUID]) if NOUSE_GPU_UUID in raw else frozenset()
    if not use_uuids:
        use_uuids = None  # an empty list selects nothing: treated as not given, like the other keys
    elif nouse_uuids:
        notes.append(f"{NOUSE_GPU_UUID} is ignored: {USE_GPU_UUID} is set, and HAMi then reads only that one")
    node_policy = ours.node_policy
    if NODE_POLICY in raw:
        value = raw[NODE_POLICY]
        if value not in NODE_POLICIES:
            raise AnnotationValueError(key=NODE_POLICY, value=value, allowed=" | ".join(NODE_POLICIES))
        if ours.node_policy is not None:
            notes.append(f"{NODE_POLICY} is ignored: {ann.POD_NODE_POLICY} is set and kube-vgpu's own key wins")
        else:
            node_policy = NODE_POLICIES[value]
    gpu_policy = ours.gpu_policy
    if GPU_POLICY in raw:
        value = raw[GPU_POLICY]
        if value not in GPU_POLICIES:
            raise AnnotationValueError(key=GPU_POLICY, value=value, allowed=" | ".join(GPU_POLICIES))
        if ours.gpu_policy is not None:
            notes.append(f"{GPU_POLICY} is ignored: {ann.POD_GPU_POLICY} is set and kube-vgpu's own key wins")
        else:
            gpu_policy = GPU_POLICIES[value]
            if gpu_policy is None:
                notes.append(
                    f"{GPU_POLICY}={value}: kube-vgpu uses the cluster's GPU order, which already prefers "
                    "connected GPU sets for multi-GPU pods"
                )
    gpu_filter = GpuFilter(use_types, nouse_types, use_uuids, nouse_uuids)
    return Selection(
        overrides=ann.PodOverrides(node_policy=node_policy, gpu_policy=gpu_policy, gpu_models=ours.gpu_models),
        gpu_filter=None if gpu_filter == GpuFilter() else gpu_filter,
        notes=tuple(notes),
    )
