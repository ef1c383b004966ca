"""The admission decision for one pod and the one function that turns it into an AdmissionResponse.

`decide` is pure: request + settings + inventory summary in, `Outcome` out. `build_response` is the
only place that knows the response's wire rules (uid echoed, `patch` and `patchType` both or neither,
`status` on denial, `warnings`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from vgpu import hami
from vgpu.annotations import POD_REQUIRE_NVLINK, require_nvlink
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import AnnotationError, RequestError, UnknownPolicyError
from vgpu.placement import registry
from vgpu.podshape import PodShapeError, check_pod_shape
from vgpu.requests import parse_pod_request
from vgpu.roles import detect_role
from webhook.advice import pod_warnings
from webhook.capacity import InventorySummary, check_capacity
from webhook.config import ModelServerSizing, WebhookConfig
from webhook.model_servers import plan as size_model_servers
from webhook.mutators import MutationContext, mutate
from webhook.patch import PatchOp
from webhook.review import AdmissionRequest, AdmissionResponse, Status

INVENTORY_UNKNOWN = (
    "cluster GPU inventory unknown (no node reports vgpu.io/node-inventory yet): capacity checks skipped"
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The slice of WebhookConfig that admission decisions depend on."""

    names: ResourceNames = ResourceNames()
    defaults: RequestDefaults = RequestDefaults()
    scheduler_name: str = "vgpu-scheduler"
    override_default_scheduler: bool = True
    apply_default_count: bool = True
    strip_stale_annotations: bool = True
    model_server_sizing: ModelServerSizing = "card"

    @classmethod
    def from_config(cls, cfg: WebhookConfig) -> Settings:
        return cls(
            names=cfg.resource_names(),
            defaults=cfg.request_defaults(),
            scheduler_name=cfg.scheduler_name,
            override_default_scheduler=cfg.override_default_scheduler,
            apply_default_count=cfg.apply_default_count,
            strip_stale_annotations=cfg.strip_stale_annotations,
            model_server_sizing=cfg.model_server_sizing,
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    allowed: bool
    ops: tuple[PatchOp, ...] = ()
    code: int = 200
    message: str = ""
    warnings: tuple[str, ...] = ()
    kind: str = "skipped"  # skipped | admitted | mutated | denied | error (for metrics and logs)
    details: dict[str, str] = field(default_factory=dict)


def deny(message: str, *, code: int = 400, kind: str = "denied") -> Outcome:
    return Outcome(allowed=False, code=code, message=message, kind=kind)


def decide(
    request: AdmissionRequest,
    settings: Settings,
    summary: InventorySummary | None,
    *,
    mutating: bool = True,
    inventory_expected: bool = True,
) -> Outcome:
    """Admit, mutate or deny one AdmissionRequest; only Pod CREATEs asking for vGPUs are acted on."""
    pod = request.object
    if request.operation != "CREATE" or request.kind.kind != "Pod" or not isinstance(pod, Mapping):
        return Outcome(allowed=True)
    try:
        check_pod_shape(pod, "object")  # the parsers below assume core/v1 types: name the field that has another
    except PodShapeError as exc:
        return deny(f"invalid Pod: {exc}")
    try:
        pod_request = parse_pod_request(pod, settings.names, settings.defaults)
    except RequestError as exc:
        return deny(str(exc))
    if pod_request.is_empty:
        return Outcome(allowed=True)
    try:
        selection = hami.select(_annotations(pod))  # kube-vgpu's keys, and HAMi's where ours are not given
    except hami.AnnotationValueError as exc:
        return deny(str(exc))
    overrides = selection.overrides
    try:
        registry.check_pod_overrides(overrides)  # production policies only: a pod cannot pick a benchmark experiment
    except UnknownPolicyError as exc:
        return deny(str(exc))
    try:
        nvlink = require_nvlink(_annotations(pod))
    except AnnotationError as exc:
        return deny(str(exc))
    warnings: list[str] = list(selection.notes)  # HAMi keys not used as written, and why
    if summary is not None and summary.nodes:
        error = check_capacity(pod_request, summary, settings.names, overrides.gpu_models, require_nvlink=nvlink)
        if error is not None:
            return deny(str(error))
    elif inventory_expected and mutating:
        warnings.append(INVENTORY_UNKNOWN)
    if nvlink and all(c.count <= 1 for c in pod_request.containers):
        warnings.append(f"{POD_REQUIRE_NVLINK}: no container asks for more than one vGPU, so it has nothing to connect")
    decision = detect_role(pod)
    ctx = MutationContext(
        request=pod_request,
        role=decision,
        names=settings.names,
        defaults=settings.defaults,
        scheduler_name=settings.scheduler_name,
        override_default_scheduler=settings.override_default_scheduler,
        apply_default_count=settings.apply_default_count,
        strip_stale_annotations=settings.strip_stale_annotations,
    )
    if not mutating:
        return Outcome(allowed=True, kind="admitted")
    sized = size_model_servers(pod, pod_request, summary, overrides.gpu_models, settings.model_server_sizing)
    ops = (*mutate(pod, ctx), *sized.ops)
    warnings += pod_warnings(pod, ctx)
    warnings += sized.warnings
    return Outcome(
        allowed=True,
        ops=ops,
        warnings=tuple(warnings),
        kind="mutated" if ops else "admitted",
        details={"role": decision.role.value, "roleSource": decision.source},
    )


def build_response(uid: str, outcome: Outcome) -> AdmissionResponse:
    """The AdmissionResponse for `outcome`; a denial never carries a patch."""
    patch: str | None = None
    patch_type: Literal["JSONPatch"] | None = None
    if outcome.allowed and outcome.ops:
        try:
            ops = orjson.dumps(list(outcome.ops))
        except TypeError:  # a value copied from the pod holds an integer over 64 bits: the standard library writes it
            ops = json.dumps(list(outcome.ops), separators=(",", ":")).encode()
        patch = base64.b64encode(ops).decode("ascii")
        patch_type = "JSONPatch"
    return AdmissionResponse(
        uid=uid,
        allowed=outcome.allowed,
        status=None if outcome.allowed else Status(code=outcome.code, message=outcome.message),
        patch=patch,
        patchType=patch_type,
        warnings=list(outcome.warnings) or None,
    )


def review_dict(uid: str, outcome: Outcome) -> dict[str, Any]:
    """The whole AdmissionReview v1 response body, None fields omitted as the apiserver expects."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": build_response(uid, outcome).model_dump(exclude_none=True),
    }


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, object]:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}
