"""Least privilege, asked of the real authorizer: the shipped RBAC (every ServiceAccount, role and binding under
deploy/) is applied to a real kube-apiserver (authorization mode Node,RBAC), and SubjectAccessReviews check, for each
ServiceAccount we ship, that every API call its code makes is allowed and that a listed set of rights it must not
have is denied.

"Needed" is read off the code: scheduler_extender/kube.py and sources/kube.py (extender), webhook/inventory.py and
webhook/cert_job.py (webhook and its cert Job), device_plugin/kube.py (device plugin), and the built-in
system:kube-scheduler role for the second scheduler. What RBAC cannot narrow (the device plugin's pods and nodes of
other nodes) the admission policy does; tests/e2e/test_admission_policy_e2e.py shows that part.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from kubernetes import client

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FILES = (
    "deploy/manifests/extender.yaml",
    "deploy/webhook/deployment.yaml",
    "deploy/webhook/cert-job.yaml",
    "deploy/device-plugin/daemonset.yaml",
)
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
NS = "kube-system"
TENANT_NS = "team-a"  # any namespace: the cluster-wide rights reach it, the namespaced ones must not


class Right(NamedTuple):
    verb: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    group: str = ""

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.group + '/' if self.group else ''}{self.resource}{'/' + self.name if self.name else ''}{where}"


NEEDED: dict[str, list[Right]] = {
    "vgpu-extender": [
        Right("list", "nodes"),
        Right("watch", "nodes"),
        Right("list", "pods"),
        Right("watch", "pods"),
        Right("list", "pods", NS),  # the leader clears a stale leader label on its namespace's pods
        Right("get", "pods", TENANT_NS, "p"),  # /bind reads the pod it binds
        Right("patch", "pods", TENANT_NS, "p"),  # requeue nudge, fence; the assignment rides the Binding
        Right("patch", "pods", NS, "vgpu-extender-x"),  # its own leader label
        Right("create", "pods/binding", TENANT_NS, "p"),
        Right("list", "poddisruptionbudgets", group="policy"),  # the preempt verb spares protected pods
        Right("create", "leases", NS, group="coordination.k8s.io"),
        Right("get", "leases", NS, "vgpu-extender", "coordination.k8s.io"),
        Right("update", "leases", NS, "vgpu-extender", "coordination.k8s.io"),
    ],
    # Pods listed: the quota count, and the eviction guard's read of the pod evicted (by field selector).
    "vgpu-webhook": [Right("list", "nodes"), Right("watch", "nodes"), Right("list", "pods", TENANT_NS)],
    "vgpu-webhook-certs": [
        Right("get", "secrets", NS, "vgpu-webhook-tls"),
        Right("create", "secrets", NS),
        Right("update", "secrets", NS, "vgpu-webhook-tls"),
        Right("get", "mutatingwebhookconfigurations", None, "vgpu-webhook", "admissionregistration.k8s.io"),
        Right("patch", "mutatingwebhookconfigurations", None, "vgpu-webhook", "admissionregistration.k8s.io"),
        Right("get", "validatingwebhookconfigurations", None, "vgpu-webhook", "admissionregistration.k8s.io"),
        Right("patch", "validatingwebhookconfigurations", None, "vgpu-webhook", "admissionregistration.k8s.io"),
    ],
    "vgpu-device-plugin": [
        Right("list", "pods"),  # field selector spec.nodeName=<its node>
        Right("patch", "pods", TENANT_NS, "p"),  # bind-phase allocated, violation (its node only: the policy)
        Right("patch", "nodes", None, "gpu-1"),  # its inventory (its node only: the policy)
        Right("create", "events", TENANT_NS),
    ],
    "vgpu-scheduler": [
        Right("get", "leases", NS, "vgpu-scheduler", "coordination.k8s.io"),
        Right("update", "leases", NS, "vgpu-scheduler", "coordination.k8s.io"),
        Right("create", "pods/binding", TENANT_NS, "p"),
        Right("watch", "pods"),
    ],
}

SECRETS = [Right("get", "secrets", NS, "vgpu-extender-tls"), Right("list", "secrets", NS), Right("list", "secrets")]
NOT_ALLOWED: dict[str, list[Right]] = {
    "vgpu-extender": [
        *SECRETS,
        Right("update", "leases", NS, "kube-scheduler", "coordination.k8s.io"),
        Right("update", "leases", NS, "kube-controller-manager", "coordination.k8s.io"),
        Right("update", "leases", NS, "vgpu-scheduler", "coordination.k8s.io"),
        Right("get", "leases", NS, "kube-scheduler", "coordination.k8s.io"),
        Right("delete", "leases", NS, "vgpu-extender", "coordination.k8s.io"),
        Right("patch", "nodes", None, "gpu-1"),
        Right("patch", "nodes/status", None, "gpu-1"),
        Right("create", "pods", TENANT_NS),
        Right("delete", "pods", TENANT_NS, "p"),
        Right("update", "pods", TENANT_NS, "p"),
        Right("create", "pods/eviction", TENANT_NS, "p"),
        Right("create", "pods/exec", TENANT_NS, "p"),
        Right("create", "events", TENANT_NS),
    ],
    "vgpu-webhook": [
        *SECRETS,
        Right("get", "nodes", None, "gpu-1"),
        Right("patch", "nodes", None, "gpu-1"),
        # It lists pods (the quota count) but reads no single pod and changes none.
        Right("get", "pods", TENANT_NS, "p"),
        Right("patch", "pods", TENANT_NS, "p"),
    ],
    "vgpu-webhook-certs": [
        Right("get", "secrets", NS, "vgpu-extender-tls"),
        Right("update", "secrets", NS, "vgpu-extender-tls"),
        Right("list", "secrets", NS),
        Right("get", "secrets", TENANT_NS, "vgpu-webhook-tls"),
        Right("delete", "secrets", NS, "vgpu-webhook-tls"),
        Right("patch", "mutatingwebhookconfigurations", None, "other", "admissionregistration.k8s.io"),
        Right("create", "mutatingwebhookconfigurations", None, None, "admissionregistration.k8s.io"),
        Right("patch", "validatingadmissionpolicies", None, "vgpu-pod-protocol", "admissionregistration.k8s.io"),
    ],
    "vgpu-device-plugin": [
        *SECRETS,
        Right("get", "pods", TENANT_NS, "p"),
        Right("create", "pods", TENANT_NS),
        Right("update", "pods", TENANT_NS, "p"),
        Right("delete", "pods", TENANT_NS, "p"),
        Right("patch", "pods/status", TENANT_NS, "p"),
        Right("create", "pods/exec", TENANT_NS, "p"),
        Right("create", "pods/binding", TENANT_NS, "p"),
        Right("create", "pods/eviction", TENANT_NS, "p"),  # only with the ladder's evict step (docs/security.md)
        Right("get", "nodes", None, "gpu-1"),
        Right("update", "nodes", None, "gpu-1"),
        Right("patch", "nodes/status", None, "gpu-1"),
        Right("delete", "nodes", None, "gpu-1"),
        Right("update", "leases", NS, "vgpu-extender", "coordination.k8s.io"),
        Right("patch", "events", TENANT_NS, "e"),
        Right("patch", "validatingadmissionpolicybindings", None, "vgpu-pod-protocol", "admissionregistration.k8s.io"),
    ],
    "vgpu-scheduler": [
        *SECRETS,
        Right("update", "leases", NS, "vgpu-extender", "coordination.k8s.io"),
        Right("patch", "pods", TENANT_NS, "p"),
    ],
}


@pytest.fixture(scope="module")
def authz(control_plane: ControlPlane) -> Iterator[client.AuthorizationV1Api]:
    docs = [d for f in FILES for d in yaml.safe_load_all((ROOT / f).read_text()) if d and d["kind"] in RBAC_KINDS]
    proc = control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, proc.stderr
    api = control_plane.api_client()
    authz = client.AuthorizationV1Api(api)
    with _rbac_synced(client.RbacAuthorizationV1Api(api), authz):
        yield authz


@contextlib.contextmanager
def _rbac_synced(rbac: client.RbacAuthorizationV1Api, authz: client.AuthorizationV1Api) -> Iterator[None]:
    """Wait until the authorizer has what was just applied, then remove the markers on exit.

    The RBAC authorizer reads Roles, ClusterRoles, RoleBindings and ClusterRoleBindings from four watches of its
    own (k8s.io/kubernetes v1.34.4 plugin/pkg/auth/authorizer/rbac), each in creation order. A marker of each kind,
    created after the shipped objects, for a user of its own: once a SubjectAccessReview for that user passes through
    the marker ClusterRoleBinding and the marker RoleBinding, each of the four watches has delivered every object
    created before its marker. Without this a review right after the apply could be answered from a cache that
    lacks a binding the shipped files just created (and a right the code needs would read as denied)."""
    tag = uuid.uuid4().hex[:8]
    user, name = f"kube-vgpu-e2e-rbac-synced-{tag}", f"kube-vgpu-e2e-rbac-synced-{tag}"
    subjects = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [{**rule, "resourceNames": [f"{tag}-cluster"]}]})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        }
    )
    rbac.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": [{**rule, "resourceNames": [f"{tag}-ns"]}]})
    rbac.create_namespaced_role_binding(
        NS,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects,
        },
    )

    def marker_allowed(resource_name: str) -> bool:
        attrs = {"verb": "get", "resource": "configmaps", "namespace": NS, "name": resource_name}
        body = {"spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": attrs}}
        return bool(authz.create_subject_access_review(body).status.allowed)

    try:
        deadline = time.monotonic() + 60  # a loaded 2-core machine
        while not (marker_allowed(f"{tag}-cluster") and marker_allowed(f"{tag}-ns")):
            assert time.monotonic() < deadline, "the RBAC authorizer never saw the marker roles and bindings"
            time.sleep(0.2)
        yield
    finally:
        rbac.delete_namespaced_role_binding(name, NS)
        rbac.delete_namespaced_role(name, NS)
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def allowed(authz: client.AuthorizationV1Api, sa: str, right: Right) -> bool:
    """A SubjectAccessReview for the ServiceAccount's user and groups, as its token authenticates it."""
    attrs = {"verb": right.verb, "group": right.group}
    resource, _, sub = right.resource.partition("/")
    attrs["resource"] = resource
    if sub:
        attrs["subresource"] = sub
    if right.namespace:
        attrs["namespace"] = right.namespace
    if right.name:
        attrs["name"] = right.name
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{NS}:{sa}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
            "resourceAttributes": attrs,
        },
    }
    return bool(authz.create_subject_access_review(body).status.allowed)


def _cases(table: dict[str, list[Right]]) -> list[tuple[str, Right]]:
    return [(sa, r) for sa, rights in table.items() for r in rights]


@pytest.mark.parametrize(("sa", "right"), _cases(NEEDED), ids=lambda v: str(v))
def test_every_shipped_service_account_may_do_what_its_code_does(
    authz: client.AuthorizationV1Api, sa: str, right: Right
) -> None:
    assert allowed(authz, sa, right), f"{sa} needs to {right}"


@pytest.mark.parametrize(("sa", "right"), _cases(NOT_ALLOWED), ids=lambda v: str(v))
def test_no_shipped_service_account_has_rights_it_does_not_use(
    authz: client.AuthorizationV1Api, sa: str, right: Right
) -> None:
    assert not allowed(authz, sa, right), f"{sa} must not {right}"
