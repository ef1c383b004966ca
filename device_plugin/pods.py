"""What the device manager needs to know about pods, independent of where it comes from.

PodRecord is read from the apiserver (device_plugin.kube) or from an in-memory fake in tests; KubeletView
is read from the kubelet's PodResources API (device_plugin.podresources). Both sides are Protocols so the
manager is tested without sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vgpu import annotations as ann
from vgpu.errors import CodecError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str = "Pending"
    deleting: bool = False
    bind_phase: ann.BindPhase | None = None
    bind_time: str = ""
    assignment: ann.Assignment | None = None
    # For the watchdog/telemetry: container ID (runtime prefix stripped) -> name, pod IP and labels.
    container_ids: tuple[tuple[str, str], ...] = ()
    pod_ip: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    # The pod as JSON, trimmed to what Allocate checks the assignment against (vgpu.assignment_check) and the
    # runtime priority it hands out (vgpu.priority.runtime_priority):
    # {"spec": {"priority", "containers"/"initContainers": [{"name", "resources"}]}}.
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def trimmed_spec(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Only the containers' names and resources (what vgpu.requests reads) and spec.priority; nothing else kept."""
    spec = pod.get("spec") or {}
    out: dict[str, Any] = {}
    priority = spec.get("priority") if isinstance(spec, Mapping) else None
    if isinstance(priority, int) and not isinstance(priority, bool):
        out["priority"] = priority
    for section in ("containers", "initContainers"):
        items = spec.get(section) if isinstance(spec, Mapping) else None
        if isinstance(items, list):
            out[section] = [
                {"name": c.get("name"), "resources": c.get("resources") or {}} for c in items if isinstance(c, Mapping)
            ]
    return {"spec": out}


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """Build a PodRecord from a pod as JSON; a malformed annotation leaves assignment/bind_phase None (logged)."""
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    assignment: ann.Assignment | None = None
    bind_phase: ann.BindPhase | None = None
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        if ann.POD_ASSIGNMENT in annotations:
            assignment = ann.decode_assignment(annotations[ann.POD_ASSIGNMENT])
        if ann.POD_BIND_PHASE in annotations:
            bind_phase = ann.decode_bind_phase(annotations[ann.POD_BIND_PHASE])
    except CodecError as exc:
        log.warning("pod %s: ignoring unreadable vGPU annotation: %s", key, exc)
    status = pod.get("status") or {}
    container_ids = tuple(
        (str(cs["containerID"]).split("://", 1)[-1], str(cs.get("name", "")))
        for cs in status.get("containerStatuses") or []
        if cs.get("containerID")
    )
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        bind_phase=bind_phase,
        bind_time=str(annotations.get(ann.POD_BIND_TIME, "")),
        assignment=assignment,
        container_ids=container_ids,
        pod_ip=str(status.get("podIP") or ""),
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
        spec=trimmed_spec(pod),
    )


@dataclass(frozen=True, slots=True)
class KubeletView:
    """From PodResources List: the pods the kubelet knows and the device IDs of our resource per container."""

    pods: frozenset[str]
    devices: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


class PodSource(Protocol):
    """The apiserver as the device plugin uses it (implemented by device_plugin.kube.KubePodSource)."""

    def list_node_pods(self, *, node: str) -> list[PodRecord]: ...
    def patch_pod_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...
    def patch_node_annotations(self, *, node: str, annotations: Mapping[str, str | None]) -> None: ...


class KubeletPods(Protocol):
    """The kubelet's PodResources API; view() returns None when it cannot be reached."""

    def view(self, *, resource: str) -> KubeletView | None: ...
