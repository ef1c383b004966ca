"""The facts placement needs about a pod, extracted once from its Kubernetes JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu import annotations as ann
from vgpu import hami
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import RequestError
from vgpu.quantity import QuantityError, parse_cpu_milli, parse_memory_mib
from vgpu.requests import PodRequest, parse_pod_request
from vgpu.roles import Role, detect_role, model_identity


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    request: PodRequest
    role: Role = Role.PREFILL_DECODE
    role_source: str = "default"
    model: str | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] | None = None
    node_policy: str | None = None
    gpu_policy: str | None = None
    gpu_filter: hami.GpuFilter | None = None  # HAMi's use/nouse-gputype and use/nouse-gpuuuid (vgpu.hami)
    node_name: str | None = None
    require_nvlink: bool = False  # vgpu.io/require-nvlink (vgpu.topology)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def shape_key(self) -> tuple[object, ...]:
        """Everything that decides where this pod may go and how a node scores for it."""
        return (
            self.request.shape,
            self.role,
            self.model,
            self.cpu_milli,
            self.memory_mib,
            self.gpu_models,
            self.node_policy,
            self.gpu_policy,
            self.require_nvlink,
            self.gpu_filter,
        )


# A pod in these phases holds nothing and never runs again (Kubernetes PodPhase).
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def pod_uid(pod: Mapping[str, Any]) -> str:
    """metadata.uid, or "" for an object that carries none (a hand-written /filter body, a file-source pod)."""
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_key(pod: Mapping[str, Any]) -> str:
    """namespace/name, the key the cluster state and the extender's books use; namespace "default" when unset."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def bound_node(pod: Mapping[str, Any]) -> str:
    """spec.nodeName: the node the pod is bound to, "" while it is not bound."""
    return str((pod.get("spec") or {}).get("nodeName") or "")


def is_finished(pod: Mapping[str, Any]) -> bool:
    """The pod ran to completion or failed: its slices are free, whatever its annotations say."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def _host_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    cpu = mem = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = (c.get("resources") or {}) if isinstance(c, Mapping) else {}
        req = res.get("requests") or res.get("limits") or {}
        try:
            if "cpu" in req:
                cpu += parse_cpu_milli(req["cpu"])
            if "memory" in req:
                mem += parse_memory_mib(req["memory"])
        except (QuantityError, ValueError):
            continue  # host resources are kube-scheduler's to validate; we only use them as hints
    return cpu, mem


def pod_info(
    pod: Mapping[str, Any],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
    *,
    track_host_resources: bool = False,
) -> PodInfo:
    """Parse a Kubernetes Pod; raises RequestError on requests (or annotations) that can never be satisfied."""
    meta = pod.get("metadata") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    decision = detect_role(pod)
    cpu, mem = _host_requests(pod) if track_host_resources else (0, 0)
    request = parse_pod_request(pod, names, defaults)
    try:
        selection = hami.select(annotations)  # kube-vgpu's keys, and HAMi's where ours are not given
    except hami.AnnotationValueError:
        if not request.is_empty:
            raise
        selection = hami.Selection(ann.pod_overrides(annotations))  # a pod without vGPUs: HAMi's keys mean nothing
    overrides = selection.overrides
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or meta.get("generateName") or ""),
        uid=str(meta.get("uid") or ""),
        request=request,
        role=decision.role,
        role_source=decision.source,
        model=model_identity(pod),
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_models=overrides.gpu_models,
        node_policy=overrides.node_policy,
        gpu_policy=overrides.gpu_policy,
        gpu_filter=selection.gpu_filter,
        node_name=(pod.get("spec") or {}).get("nodeName") or None,
        require_nvlink=not request.is_empty and ann.require_nvlink(annotations),
        annotations=annotations,
    )


__all__ = ["PodInfo", "RequestError", "pod_info"]
