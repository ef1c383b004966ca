"""Pure mutators: `(pod, context) -> list[PatchOp]`, each one concern, each idempotent.

Idempotent means: applying a mutator's ops and running it again yields no ops — the webhook is
registered with `reinvocationPolicy: IfNeeded` and may see its own output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu import annotations as ann
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.requests import PodRequest, parse_container
from vgpu.roles import RoleDecision
from webhook import labels
from webhook.config import DEFAULT_SCHEDULER
from webhook.patch import PatchOp, pointer, remove_keys, set_entries

# Written by the extender at bind time; on a new pod they can only be copies of another pod's.
STALE_ANNOTATIONS = (ann.POD_ASSIGNMENT, ann.POD_BIND_PHASE, ann.POD_BIND_TIME)


@dataclass(frozen=True, slots=True)
class MutationContext:
    """What the mutators need, computed once per review."""

    request: PodRequest
    role: RoleDecision
    names: ResourceNames = ResourceNames()
    defaults: RequestDefaults = RequestDefaults()
    scheduler_name: str = "vgpu-scheduler"
    override_default_scheduler: bool = True
    apply_default_count: bool = True
    strip_stale_annotations: bool = True


Mutator = Callable[[Mapping[str, Any], MutationContext], list[PatchOp]]


def stamp_labels(pod: Mapping[str, Any], ctx: MutationContext) -> list[PatchOp]:
    """Role and slice labels; our labels that no longer apply (copied specs) are removed."""
    wanted = labels.slice_labels(ctx.request, ctx.role)
    return set_entries(pod, ("metadata", "labels"), wanted) + remove_keys(
        pod, ("metadata", "labels"), labels.stale(wanted)
    )


def route_scheduler(pod: Mapping[str, Any], ctx: MutationContext) -> list[PatchOp]:
    """Send the pod to our scheduler, unless the user chose another (non-default) scheduler."""
    spec = pod.get("spec")
    current = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    if current == ctx.scheduler_name:
        return []
    if current in (None, "") or (current == DEFAULT_SCHEDULER and ctx.override_default_scheduler):
        return [{"op": "add", "path": "/spec/schedulerName", "value": ctx.scheduler_name}]
    return []


def default_count(pod: Mapping[str, Any], ctx: MutationContext) -> list[PatchOp]:
    """Write the default vGPU count into containers that name a slice but not a count.

    Kubelet only asks a device plugin for devices of resources in a container's limits, so a container
    with `gpumem` alone would never get a GPU. Written to limits and requests, as defaulting would have.
    """
    if not ctx.apply_default_count:
        return []
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return []
    count = ctx.names.count
    value = str(ctx.defaults.count)
    ops: list[PatchOp] = []
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping) or parse_container(container, ctx.names, ctx.defaults) is None:
            continue
        res = container.get("resources")
        if not isinstance(res, Mapping):
            res_path = pointer("spec", "containers", i, "resources")
            ops.append({"op": "add", "path": res_path, "value": {"limits": {count: value}, "requests": {count: value}}})
            continue
        if any(isinstance(res.get(s), Mapping) and count in res[s] for s in ("limits", "requests")):
            continue
        for section in ("limits", "requests"):
            ops += set_entries(pod, ("spec", "containers", i, "resources", section), {count: value})
    return ops


def strip_stale_annotations(pod: Mapping[str, Any], ctx: MutationContext) -> list[PatchOp]:
    """Drop bind-time annotations copied from another pod, which would make the extender misread it."""
    if not ctx.strip_stale_annotations:
        return []
    return remove_keys(pod, ("metadata", "annotations"), STALE_ANNOTATIONS)


MUTATORS: tuple[Mutator, ...] = (stamp_labels, route_scheduler, default_count, strip_stale_annotations)


def mutate(pod: Mapping[str, Any], ctx: MutationContext) -> list[PatchOp]:
    """All mutators' ops, in a fixed order; they touch disjoint paths."""
    return [op for mutator in MUTATORS for op in mutator(pod, ctx)]
