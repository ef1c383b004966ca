from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from vgpu.placement import registry
from vgpu.requests import parse_pod_request
from vgpu.roles import Role, RoleDecision
from webhook.admission import INVENTORY_UNKNOWN, Outcome, Settings, build_response, decide, review_dict
from webhook.capacity import InventorySummary
from webhook.mutators import MutationContext, route_scheduler
from webhook.review import AdmissionRequest, AdmissionReview
from webhook.testing import make_review


def _pod(scheduler: str | None = None, **limits: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": "p"}, "spec": spec}


def _request(pod: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> AdmissionRequest:
    review = make_review(pod, operation=operation)
    review["request"]["kind"]["kind"] = kind
    parsed = AdmissionReview.model_validate(review).request
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("outcome", "has_patch", "has_status"),
    [
        (Outcome(allowed=True), False, False),
        (Outcome(allowed=True, ops=({"op": "add", "path": "/a", "value": 1},)), True, False),
        (Outcome(allowed=False, code=400, message="no", ops=({"op": "add", "path": "/a", "value": 1},)), False, True),
    ],
)
def test_build_response_wire_rules(outcome: Outcome, has_patch: bool, has_status: bool) -> None:
    body = review_dict("the-uid", outcome)
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == "the-uid" and resp["allowed"] is outcome.allowed
    assert ("patch" in resp) is has_patch and ("patchType" in resp) is has_patch
    if has_patch:
        assert resp["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(resp["patch"])) == list(outcome.ops)
    assert ("status" in resp) is has_status
    if has_status:
        assert resp["status"] == {"code": 400, "message": "no"}
    assert build_response("x", Outcome(allowed=True, warnings=("w",))).warnings == ["w"]


@pytest.mark.parametrize(
    ("operation", "kind"), [("UPDATE", "Pod"), ("DELETE", "Pod"), ("CONNECT", "Pod"), ("CREATE", "Deployment")]
)
def test_only_pod_creates_are_acted_on(operation: str, kind: str) -> None:
    bad = _pod(**{"nvidia.com/gpumem-percentage": "500"})
    got = decide(_request(bad, operation, kind), Settings(), None)
    assert got.allowed and not got.ops


@pytest.mark.parametrize(
    ("current", "override", "expected"),
    [
        (None, True, "vgpu-scheduler"),
        ("", True, "vgpu-scheduler"),
        ("default-scheduler", True, "vgpu-scheduler"),
        ("default-scheduler", False, "default-scheduler"),
        ("volcano", True, "volcano"),
        ("vgpu-scheduler", True, "vgpu-scheduler"),
    ],
)
def test_route_scheduler(current: str | None, override: bool, expected: str) -> None:
    pod = _pod(current, **{"nvidia.com/gpu": "1"})
    ctx = MutationContext(
        request=parse_pod_request(pod), role=RoleDecision(Role.DECODE, "label"), override_default_scheduler=override
    )
    ops = route_scheduler(pod, ctx)
    got = ops[0]["value"] if ops else current
    assert got == expected


def test_custom_scheduler_name_and_no_default_count() -> None:
    settings = Settings(scheduler_name="my-sched", apply_default_count=False)
    got = decide(_request(_pod("default-scheduler", **{"nvidia.com/gpumem": "100"})), settings, None)
    assert {"op": "add", "path": "/spec/schedulerName", "value": "my-sched"} in got.ops
    assert not any("resources" in op["path"] for op in got.ops)


def test_inventory_unknown_is_a_warning_only_when_expected() -> None:
    req = _request(_pod(**{"nvidia.com/gpumem": "999999"}))
    assert INVENTORY_UNKNOWN in decide(req, Settings(), None).warnings
    assert INVENTORY_UNKNOWN in decide(req, Settings(), InventorySummary(frozenset())).warnings
    assert INVENTORY_UNKNOWN not in decide(req, Settings(), None, inventory_expected=False).warnings
    small = InventorySummary.static(max_gpu_memory_mib=1000, max_gpus_per_node=1)
    denied = decide(req, Settings(), small)
    assert not denied.allowed and "1..1000 MiB" in denied.message


def test_validate_mode_checks_but_never_patches() -> None:
    ok = decide(_request(_pod(**{"nvidia.com/gpu": "1"})), Settings(), None, mutating=False)
    assert ok.allowed and not ok.ops and not ok.warnings
    bad = decide(_request(_pod(**{"nvidia.com/gpucores": "101"})), Settings(), None, mutating=False)
    assert not bad.allowed and "nvidia.com/gpucores" in bad.message


def test_custom_resource_names() -> None:
    from vgpu.config import ResourceNames

    names = ResourceNames(count="example.com/vgpu", memory="example.com/vmem")
    got = decide(_request(_pod(**{"example.com/vmem": "100"})), Settings(names=names), None)
    assert {"op": "add", "path": "/spec/containers/0/resources/limits/example.com~1vgpu", "value": "1"} in got.ops


def _with_annotations(annotations: dict[str, Any], **limits: str) -> dict[str, Any]:
    pod = _pod(**limits)
    pod["metadata"]["annotations"] = annotations
    return pod


@pytest.mark.parametrize("mutating", [True, False])
@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"vgpu.io/node-policy": "fragaware-s2000"},
            "annotation vgpu.io/node-policy: placement policy 'fragaware-s2000' is a benchmark experiment, not a "
            f"production policy; allowed: {', '.join(registry.production_names())}",
        ),
        (
            {"vgpu.io/node-policy": "tetris"},
            f"annotation vgpu.io/node-policy: unknown placement policy 'tetris'; "
            f"allowed: {', '.join(registry.production_names())}",
        ),
        (
            {"vgpu.io/gpu-policy": "random"},
            "annotation vgpu.io/gpu-policy: unknown GPU policy 'random'; allowed: binpack, spread",
        ),
    ],
)
def test_a_vgpu_pod_naming_a_policy_it_may_not_use_is_denied(
    annotations: dict[str, str], message: str, mutating: bool
) -> None:
    """Denied at admission, naming the annotation and the allowed values: the extender would refuse it on every node."""
    pod = _with_annotations(annotations, **{"nvidia.com/gpu": "1"})
    got = decide(_request(pod), Settings(), None, mutating=mutating)
    assert not got.allowed and got.code == 400 and not got.ops
    assert got.message == message


@pytest.mark.parametrize(
    "annotations",
    [
        {"vgpu.io/node-policy": "spread", "vgpu.io/gpu-policy": "binpack"},
        {"vgpu.io/node-policy": "default"},
        {},
    ],
)
def test_production_policies_and_absent_annotations_are_admitted(annotations: dict[str, Any]) -> None:
    pod = _with_annotations(annotations, **{"nvidia.com/gpu": "1"})
    assert decide(_request(pod), Settings(), None).allowed


@pytest.mark.parametrize(
    ("pod", "path"),
    [
        (
            {"metadata": {"annotations": {"vgpu.io/node-policy": 7}}},
            "object.metadata.annotations['vgpu.io/node-policy']",
        ),
        ({"metadata": []}, "object.metadata"),
        ({"spec": {"containers": {}}}, "object.spec.containers"),
        ({"spec": {"containers": ["x"]}}, "object.spec.containers[0]"),
        ({"spec": {"containers": [{"resources": {"limits": []}}]}}, "object.spec.containers[0].resources.limits"),
        ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": {}}}}]}}, "object.spec.containers[0]"),
        ({"spec": {"containers": [{"args": [1]}]}}, "object.spec.containers[0].args[0]"),
        ({"metadata": {"labels": {"a": None}}}, "object.metadata.labels['a']"),
        ({"status": {"phase": 3}}, "object.status.phase"),
    ],
)
def test_a_pod_with_a_field_of_the_wrong_type_is_denied_naming_it(pod: dict[str, Any], path: str) -> None:
    """core/v1 would never decode such a pod; the parsers must not meet it (an AttributeError was a 500 denial)."""
    got = decide(_request(pod), Settings(), None)
    assert not got.allowed and got.code == 400 and got.kind == "denied"
    assert got.message.startswith(f"invalid Pod: {path}")


def test_a_pod_without_vgpus_is_not_checked() -> None:
    pod = _with_annotations({"vgpu.io/node-policy": "fragaware-wg100"})
    assert decide(_request(pod), Settings(), None).allowed
