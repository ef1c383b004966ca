"""Defence in depth before a slice is served: is this `vgpu.io/assignment` one the extender could have written?

Anyone who may write a pod annotation could otherwise hand themselves any slice of any card. So the device
plugin serves an assignment only if
  1. every container name is a DNS-1123 label and the pod UID a UUID (both reach host paths and logs);
  2. it is for this node and names only this node's GPUs, each healthy;
  3. it matches the pod's own spec: the vGPU-asking app containers, in spec order, each with as many devices as
     vGPUs requested and on each GPU exactly the memory and cores its requests resolve to there — resolved by
     `vgpu.requests`, the code the extender places with, so there is one definition of "what a pod asks";
  4. together with every assignment already held on the node it keeps each GPU within its memory, SM share
     and split count.
Every refusal names the pod, the container and the mismatch (the kubelet shows it on the pod). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu.annotations import Assignment, ContainerAssignment
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.devices import GpuDevice
from vgpu.errors import RequestError, VgpuError
from vgpu.requests import ContainerRequest, parse_pod_request

# Container names are DNS-1123 labels: kubernetes/kubernetes pkg/apis/core/validation/validation.go
# (validateContainers: ValidateDNS1123Label(ctr.Name, ...)) with the format of
# staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go (dns1123LabelFmt, DNS1123LabelMaxLength 63).
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL_MAX = 63
# The apiserver sets metadata.uid itself on create: staging/src/k8s.io/apiserver/pkg/registry/rest/meta.go
# FillObjectMetaSystemFields -> k8s.io/apimachinery/pkg/util/uuid.NewUUID(), the canonical lower-case form.
POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SHOWN = 64


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and DNS1123_LABEL.fullmatch(value) is not None


def is_pod_uid(value: str) -> bool:
    return POD_UID.fullmatch(value) is not None


def shown(value: str) -> str:
    """A user-supplied string as it may appear in a message: quoted, escaped, at most ~64 characters."""
    return repr(value if len(value) <= _SHOWN else value[: _SHOWN - 3] + "...")


class AssignmentRefused(VgpuError):
    """The assignment is not served; the message names the pod, the container (if one) and the mismatch."""

    def __init__(self, *, pod: str, container: str | None, reason: str) -> None:
        self.pod = pod
        self.container = container
        self.reason = reason
        where = f"pod {pod}" + (f" container {shown(container)}" if container is not None else "")
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """This node's GPUs as the device plugin knows them; `unhealthy` maps a uuid to why it is unhealthy."""

    node: str
    gpus: Mapping[str, GpuDevice]
    unhealthy: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Held:
    """An assignment already holding slices on this node (served or allocated)."""

    pod: str
    assignment: Assignment


def check_identity(a: Assignment, *, pod: str, pod_uid: str) -> None:
    """Names and UID are safe to put in paths and messages."""
    if not is_pod_uid(pod_uid):
        raise AssignmentRefused(pod=pod, container=None, reason=f"pod UID {shown(pod_uid)} is not a UUID")
    seen: set[str] = set()
    for c in a.containers:
        if not is_dns1123_label(c.name):
            raise AssignmentRefused(
                pod=pod,
                container=c.name,
                reason="the assignment's container name is not a DNS-1123 label "
                f"([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most {DNS1123_LABEL_MAX} characters)",
            )
        if c.name in seen:
            raise AssignmentRefused(pod=pod, container=c.name, reason="the assignment lists this container twice")
        seen.add(c.name)


def check_gpus(a: Assignment, *, pod: str, node: NodeGpus) -> None:
    """For this node, only its GPUs, each healthy."""
    if a.node != node.node:
        raise AssignmentRefused(
            pod=pod, container=None, reason=f"the assignment is for node {shown(a.node)}, this is node {node.node}"
        )
    for c in a.containers:
        for d in c.devices:
            gpu = node.gpus.get(d.uuid)
            if gpu is None:
                known = ", ".join(sorted(node.gpus)) or "none"
                raise AssignmentRefused(
                    pod=pod,
                    container=c.name,
                    reason=f"GPU {shown(d.uuid)} is not a GPU of node {node.node} (its GPUs: {known})",
                )
            if d.uuid in node.unhealthy:
                raise AssignmentRefused(
                    pod=pod, container=c.name, reason=f"GPU {d.uuid} is unhealthy ({node.unhealthy[d.uuid]})"
                )
            if d.index != gpu.index:
                raise AssignmentRefused(
                    pod=pod,
                    container=c.name,
                    reason=f"the assignment gives GPU {d.uuid} index {d.index}; on this node it is index {gpu.index}",
                )


def _spec_names(pod_spec: Mapping[str, Any], section: str) -> list[str]:
    spec = pod_spec.get("spec") or {}
    items: Sequence[Any] = (spec.get(section) or []) if isinstance(spec, Mapping) else []
    return [str(c.get("name") or "") for c in items if isinstance(c, Mapping)]


def _memory_text(req: ContainerRequest, names: ResourceNames, gpu: GpuDevice) -> str:
    if req.memory_mib is not None:
        return f"{names.memory}={req.memory_mib}"
    return f"{names.memory_percentage}={req.memory_percentage} of {gpu.memory_mib} MiB"


def _cores_text(req: ContainerRequest, names: ResourceNames) -> str:
    if req.cores is not None:
        return f"{names.cores}={req.cores}"
    return "cores in proportion to the memory share"


def check_spec(
    a: Assignment,
    pod_spec: Mapping[str, Any],
    *,
    pod: str,
    gpus: Mapping[str, GpuDevice],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
) -> None:
    """The assignment is what the pod's own requests resolve to on these GPUs (check_gpus first)."""
    try:
        request = parse_pod_request(pod_spec, names, defaults)
    except RequestError as exc:
        raise AssignmentRefused(pod=pod, container=None, reason=f"the pod's vGPU requests are invalid: {exc}") from None
    app = _spec_names(pod_spec, "containers")
    init = set(_spec_names(pod_spec, "initContainers"))
    wanted = {r.container: r for r in request.containers}
    for c in a.containers:
        if c.name not in app:
            what = "an init container" if c.name in init else "not a container of the pod"
            raise AssignmentRefused(
                pod=pod,
                container=c.name,
                reason=f"the assignment names {what} (the pod's containers: {', '.join(app) or 'none'})",
            )
        if c.name not in wanted:
            raise AssignmentRefused(
                pod=pod,
                container=c.name,
                reason=f"the container requests no vGPU ({names.count}) but the assignment gives it "
                f"{len(c.devices)} device(s)",
            )
    assigned = {c.name: c for c in a.containers}
    for r in request.containers:
        if r.container not in assigned:
            raise AssignmentRefused(
                pod=pod,
                container=r.container,
                reason=f"the container requests {r.count} vGPU(s) but the assignment has no entry for it",
            )
    order = [c.name for c in a.containers]
    spec_order = [r.container for r in request.containers]
    if order != spec_order:
        raise AssignmentRefused(
            pod=pod,
            container=None,
            reason=f"the assignment lists containers {order}; the pod spec asks in the order {spec_order}",
        )
    for r in request.containers:
        _check_container(assigned[r.container], r, pod=pod, gpus=gpus, names=names)


def _check_container(
    c: ContainerAssignment, r: ContainerRequest, *, pod: str, gpus: Mapping[str, GpuDevice], names: ResourceNames
) -> None:
    if len(c.devices) != r.count:
        raise AssignmentRefused(
            pod=pod,
            container=c.name,
            reason=f"the assignment gives {len(c.devices)} device(s) but the container requests {r.count} vGPU(s) "
            f"({names.count}={r.count})",
        )
    for d in c.devices:
        gpu = gpus[d.uuid]
        memory, cores = r.memory_on(gpu.memory_mib), r.cores_on(gpu.memory_mib)
        if d.memory_mib != memory:
            raise AssignmentRefused(
                pod=pod,
                container=c.name,
                reason=f"the assignment gives {d.memory_mib} MiB on GPU {d.uuid} but the container's requests "
                f"resolve to {memory} MiB there ({_memory_text(r, names, gpu)})",
            )
        if d.cores != cores:
            raise AssignmentRefused(
                pod=pod,
                container=c.name,
                reason=f"the assignment gives {d.cores}% cores on GPU {d.uuid} but the container's requests "
                f"resolve to {cores}% there ({_cores_text(r, names)})",
            )


@dataclass(slots=True)
class _Use:
    memory_mib: int = 0
    cores: int = 0
    slices: int = 0
    holders: set[str] = field(default_factory=set)


def check_capacity(a: Assignment, held: Iterable[Held], *, pod: str, gpus: Mapping[str, GpuDevice]) -> None:
    """This pod's slices plus every held one stay within each of its GPUs' memory, cores and split count."""
    mine = {d.uuid for d in a.slices()}
    used: dict[str, _Use] = {u: _Use() for u in mine}
    for h in held:
        for d in h.assignment.slices():
            u = used.get(d.uuid)
            if u is None:
                continue
            u.memory_mib += d.memory_mib
            u.cores += d.cores
            u.slices += 1
            u.holders.add(h.pod)
    for c in a.containers:
        for d in c.devices:
            gpu, u = gpus[d.uuid], used[d.uuid]
            over = _over(u, d.memory_mib, d.cores, gpu)
            if over is not None:
                who = ", ".join(sorted(u.holders)[:5]) or "nobody"
                raise AssignmentRefused(
                    pod=pod,
                    container=c.name,
                    reason=f"GPU {d.uuid} would be over-committed: {over} (already held by {u.slices} slice(s) of "
                    f"{who})",
                )
            u.memory_mib += d.memory_mib
            u.cores += d.cores
            u.slices += 1
            u.holders.add(pod)


def _over(u: _Use, memory_mib: int, cores: int, gpu: GpuDevice) -> str | None:
    if u.slices + 1 > gpu.split_count:
        return f"{u.slices} + 1 slices > split count {gpu.split_count}"
    if u.memory_mib + memory_mib > gpu.memory_mib:
        return f"memory {u.memory_mib} + {memory_mib} MiB > {gpu.memory_mib} MiB"
    if u.cores + cores > gpu.cores:
        return f"cores {u.cores} + {cores}% > {gpu.cores}%"
    return None


def check_assignment(
    a: Assignment,
    pod_spec: Mapping[str, Any],
    *,
    pod: str,
    pod_uid: str,
    node: NodeGpus,
    held: Iterable[Held],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
) -> None:
    """Every check above, in order; raises AssignmentRefused at the first violation."""
    check_identity(a, pod=pod, pod_uid=pod_uid)
    check_gpus(a, pod=pod, node=node)
    check_spec(a, pod_spec, pod=pod, gpus=node.gpus, names=names, defaults=defaults)
    check_capacity(a, held, pod=pod, gpus=node.gpus)
