"""API Priority and Fairness, asked of the real kube-apiserver: the shipped FlowSchema (deploy/manifests/extender.yaml,
the chart's extender.leaderElection.flowSchema) puts the extender's Lease requests in the built-in leader-election
priority level, as kube-scheduler's are, and no one else's.

The apiserver names the FlowSchema and the priority level it classified a request into in the response headers
X-Kubernetes-PF-FlowSchema-UID and X-Kubernetes-PF-PriorityLevel-UID (kubernetes v1.34.4
staging/src/k8s.io/api/flowcontrol/v1/types.go, ResponseHeaderMatchedFlowSchemaUID and
ResponseHeaderMatchedPriorityLevelConfigurationUID). Requests are made as the extender's
ServiceAccount by impersonation: APF classifies the impersonated user (its filter runs after impersonation in
DefaultBuildHandlerChain, staging/src/k8s.io/apiserver/pkg/server/config.go).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {
    ("ServiceAccount", "vgpu-extender"),
    ("Role", "vgpu-extender-leader-election"),
    ("RoleBinding", "vgpu-extender-leader-election"),
    ("FlowSchema", "vgpu-extender-leader-election"),
}
FS_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
PL_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"


def _shipped_in(namespace: str) -> tuple[list[dict[str, Any]], str]:
    """The manifest's extender ServiceAccount, its Lease RBAC and the FlowSchema, moved from kube-system to a
    namespace of this test (as the chart renders them for its release namespace); the cluster-scoped FlowSchema
    gets a name of its own so it never meets another test's."""
    docs = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy/manifests/extender.yaml").read_text())
        if d and (d["kind"], d["metadata"]["name"]) in SHIPPED
    ]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == SHIPPED
    moved: list[dict[str, Any]] = json.loads(json.dumps(docs).replace('"kube-system"', json.dumps(namespace)))
    name = f"vgpu-extender-leader-election-{namespace}"
    for d in moved:
        if d["kind"] == "FlowSchema":
            d["metadata"]["name"] = name
    return moved, name


def _as(control_plane: ControlPlane, user: str) -> client.CoordinationV1Api:
    api = control_plane.api_client()
    api.set_default_header("Impersonate-User", user)
    return client.CoordinationV1Api(api)


def _classified(call: Any) -> tuple[str, str, int]:
    """(FlowSchema UID, priority level UID, status) of one request, answered or refused."""
    try:
        _, status, headers = call()
    except ApiException as exc:
        headers, status = exc.headers or {}, exc.status
    return headers.get(FS_HEADER, ""), headers.get(PL_HEADER, ""), int(status)


def test_the_extenders_lease_requests_are_served_at_the_leader_election_level(
    control_plane: ControlPlane, namespace: str
) -> None:
    docs, fs_name = _shipped_in(namespace)
    proc = control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, proc.stderr
    admin = control_plane.api_client()
    flow = client.FlowcontrolApiserverV1Api(admin)
    try:
        level = flow.read_priority_level_configuration("leader-election")  # built in: the apiserver made it
        ours = flow.read_flow_schema(fs_name)
        client.CoordinationV1Api(admin).create_namespaced_lease(
            namespace, {"metadata": {"name": "vgpu-extender"}, "spec": {"holderIdentity": ""}}
        )
        extender = _as(control_plane, f"system:serviceaccount:{namespace}:vgpu-extender")

        def get() -> Any:
            return extender.read_namespaced_lease_with_http_info("vgpu-extender", namespace)

        # The apiserver's APF controller picks a new FlowSchema up from its watch, and its RBAC authorizer the new
        # Role and RoleBinding from watches of their own, in either order: wait for both (60 s: a loaded 2-core
        # machine), then every request of the extender's must be classified so. Classification comes before
        # authorization, so a 403 may name our FlowSchema already.
        want = (ours.metadata.uid, level.metadata.uid, 200)
        deadline = time.monotonic() + 60
        seen = _classified(get)
        while seen != want and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = _classified(get)
        assert seen == want, (seen, want)

        lease, _, _ = get()  # a renewal is an update of the Lease it read
        lease.spec.holder_identity = "vgpu-extender-0_e2e"

        def renew() -> Any:
            return extender.replace_namespaced_lease_with_http_info("vgpu-extender", namespace, lease)

        assert _classified(renew) == (ours.metadata.uid, level.metadata.uid, 200)

        # Nobody else's: another ServiceAccount's Lease read (refused by RBAC, classified all the same) and the
        # extender's own pod list stay at the levels they had.
        other = _as(control_plane, f"system:serviceaccount:{namespace}:someone-else")
        fs, pl, status = _classified(lambda: other.read_namespaced_lease_with_http_info("vgpu-extender", namespace))
        assert status == 403 and fs and fs != ours.metadata.uid and pl != level.metadata.uid
        core = client.CoreV1Api(extender.api_client)
        fs, pl, _ = _classified(lambda: core.list_namespaced_pod_with_http_info(namespace))
        assert fs and fs != ours.metadata.uid and pl != level.metadata.uid
    finally:
        flow.delete_flow_schema(fs_name)
