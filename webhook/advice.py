"""Warnings (AdmissionReview `warnings`) for specs that are legal but probably not what the user meant.

kubectl prints each one as `Warning: ...`; keep them short and actionable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu.roles import ROLE_LABEL, Role
from webhook.config import DEFAULT_SCHEDULER
from webhook.mutators import STALE_ANNOTATIONS, MutationContext

_KNOWN_ROLE_VALUES = {r.value for r in Role} | {"both"}


def _meta(pod: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _args_text(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    parts: list[str] = []
    for c in containers if isinstance(containers, list) else []:
        if isinstance(c, Mapping):
            for key in ("command", "args"):
                value = c.get(key)
                if isinstance(value, list):
                    parts.extend(str(v) for v in value)
    return " ".join(parts)


def pod_warnings(pod: Mapping[str, Any], ctx: MutationContext) -> list[str]:
    """Warnings for a vGPU pod that is about to be admitted."""
    out: list[str] = []
    role_label = _meta(pod, "labels").get(ROLE_LABEL)
    if role_label == "both":
        out.append(f"{ROLE_LABEL}=both is deprecated; use prefill-decode")
    elif role_label is not None and role_label not in _KNOWN_ROLE_VALUES:
        out.append(
            f"{ROLE_LABEL}={role_label!r} is not a known role; using {ctx.role.role.value} (from {ctx.role.source})"
        )
    if ctx.role.source == "default" and "kv_both" in _args_text(pod):
        out.append("kv_role kv_both does not say prefill or decode; treated as prefill-decode; set llm-d.ai/role")
    for c in ctx.request.containers:
        defaulted = c.memory_mib is None and c.memory_percentage == ctx.defaults.memory_percentage
        if defaulted and not _asks(pod, c.container, ctx.names.memory_percentage):
            out.append(
                f"container {c.container!r}: no {ctx.names.memory} or {ctx.names.memory_percentage}: "
                f"each vGPU takes {c.memory_percentage}% of its GPU's memory (default)"
            )
        if c.cores == 0 and ctx.role.role.does_prefill:
            out.append(
                f"container {c.container!r}: {ctx.names.cores}=0 (best effort) on a {ctx.role.role.value} pod: "
                "no SM reservation for compute-bound work"
            )
    spec = pod.get("spec")
    scheduler = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    if scheduler not in (None, "", ctx.scheduler_name) and (
        scheduler != DEFAULT_SCHEDULER or not ctx.override_default_scheduler
    ):
        out.append(f"schedulerName {scheduler!r} is not {ctx.scheduler_name!r}: vGPU slices will not be placed")
    if ctx.strip_stale_annotations:
        stale = [key for key in STALE_ANNOTATIONS if key in _meta(pod, "annotations")]
        if stale:
            out.append(f"removed annotations copied from another pod: {', '.join(stale)}")
    return out


def _asks(pod: Mapping[str, Any], container: str, resource: str) -> bool:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for c in containers if isinstance(containers, list) else []:
        if isinstance(c, Mapping) and str(c.get("name") or "<unnamed>") == container:
            res = c.get("resources")
            if isinstance(res, Mapping):
                return any(isinstance(res.get(s), Mapping) and resource in res[s] for s in ("limits", "requests"))
    return False
