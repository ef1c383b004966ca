"""The shipped admission policy (deploy/manifests/admission-policy.yaml) on a real kube-apiserver, with the shipped
RBAC and the shipped mutating webhook configuration in front of it.

Who acts is real, not a header: the tenant is a client certificate bound to the built-in `edit` ClusterRole in one
namespace; the extender and the device plugins authenticate with ServiceAccount tokens from the TokenRequest API,
the plugins' bound to a pod on their node, so the apiserver itself puts `authentication.kubernetes.io/node-name`
into their user info (k8s.io/kubernetes v1.34.4 pkg/registry/core/serviceaccount/storage/token.go). Every forgery
the issue lists is tried and must fail with the policy's message; the same writes by the owners succeed.

The policies bind cluster-wide (also to the admin the other e2e tests act as), so this module removes them at the
end and waits until they are gone.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from vgpu import annotations as ann
from webhook import certs
from webhook.config import WebhookConfig
from webhook.inventory import NodeAnnotationInventory
from webhook.kube import find_pod
from webhook.main import build_server

from .controlplane import ControlPlane
from .vgpu_stack import inventory

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "manifests" / "admission-policy.yaml"
RBAC_FILES = ("deploy/manifests/extender.yaml", "deploy/device-plugin/daemonset.yaml")
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
WEBHOOK_CONFIG = ROOT / "deploy" / "webhook" / "mutatingwebhookconfiguration.yaml"
GUARD_CONFIG = ROOT / "deploy" / "webhook" / "validatingwebhookconfiguration.yaml"
EXTENDER = "system:serviceaccount:kube-system:vgpu-extender"
PLUGIN = "system:serviceaccount:kube-system:vgpu-device-plugin"
OPT_OUT = {"vgpu.io/webhook": "disabled"}
GPU_POD_SPEC = {
    "containers": [
        {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
}


def _assignment(node: str) -> str:
    whole_card = ann.DeviceSlice(uuid=f"GPU-{node}-0", index=0, memory_mib=81920, cores=100)
    return ann.encode_assignment(
        ann.Assignment(node=node, containers=(ann.ContainerAssignment(name="main", devices=(whole_card,)),))
    )


def _denied(call: Callable[[], Any]) -> str:
    """Run a call that must be refused with 403; return the apiserver's message."""
    with pytest.raises(client.ApiException) as info:
        call()
    assert info.value.status == 403, info.value.body
    return str(json.loads(info.value.body)["message"])


def _core(cp: ControlPlane, *, token: str | None = None, kubeconfig: Path | None = None) -> client.CoreV1Api:
    if kubeconfig is not None:
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(kubeconfig))
    else:
        cfg = client.Configuration(host=cp.server)
        cfg.ssl_ca_cert = str(cp.ca_file)
        cfg.api_key = {"authorization": f"Bearer {token}"}
        api = client.ApiClient(cfg)
    cp._clients.append(api)  # closed with the control plane
    return client.CoreV1Api(api)


@dataclass
class Cluster:
    admin: client.CoreV1Api
    tenant: client.CoreV1Api
    tenant_user: str
    extender: client.CoreV1Api
    plugin_a: client.CoreV1Api
    plugin_b: client.CoreV1Api
    plugin_unbound: client.CoreV1Api  # a token bound to no pod, so to no node (as a legacy Secret token)
    scheduler: client.CoordinationV1Api
    node_a: str
    node_b: str
    ns: str

    def pod(self, name: str, *, labels: dict[str, str] | None = None, **annotations: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations)}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(GPU_POD_SPEC)}

    def tenant_pod(self, name: str) -> Any:
        """A vGPU pod the tenant created (through the webhook), nothing forged."""
        return self.tenant.create_namespaced_pod(self.ns, self.pod(name))

    def bound_pod(self, name: str, node: str) -> Any:
        """A tenant's pod as the extender leaves it: bound to `node` by one Binding carrying the assignment."""
        self.tenant_pod(name)
        annotations = {
            ann.POD_ASSIGNMENT: _assignment(node),
            ann.POD_BIND_PHASE: "allocating",
            ann.POD_BIND_TIME: "1.0",
        }
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, annotations=annotations),
            target=client.V1ObjectReference(kind="Node", name=node),
        )
        self.extender.create_namespaced_pod_binding(name, self.ns, binding, _preload_content=False)
        return self.admin.read_namespaced_pod(name, self.ns)


def _apply(cp: ControlPlane, docs: list[dict[str, Any]]) -> None:
    proc = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, proc.stderr


def aggregate(rbac: client.RbacAuthorizationV1Api, name: str) -> None:
    """Fill an aggregated ClusterRole's rules from the roles its selectors pick, as kube-controller-manager's
    clusterrole-aggregation controller does (there is none here): `edit` is empty until then."""
    role = rbac.read_cluster_role(name)
    rules: list[Any] = []
    for selector in role.aggregation_rule.cluster_role_selectors:
        labels = ",".join(f"{k}={v}" for k, v in (selector.match_labels or {}).items())
        for part in rbac.list_cluster_role(label_selector=labels).items:
            rules += [r for r in part.rules or [] if r not in rules]
    rbac.patch_cluster_role(name, {"rules": [client.ApiClient().sanitize_for_serialization(r) for r in rules]})


def _token(core: client.CoreV1Api, sa: str, pod: Any | None = None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
    return str(core.create_namespaced_service_account_token(sa, "kube-system", {"spec": spec}).status.token)


def _plugin_pod(admin: client.CoreV1Api, name: str, node: str) -> Any:
    """A device plugin pod on `node` (as its DaemonSet makes one): its token is bound to it and so to the node."""
    body = {
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {
            "serviceAccountName": "vgpu-device-plugin",
            "nodeName": node,
            "containers": [{"name": "device-plugin", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    return admin.create_namespaced_pod("kube-system", body)


def _wait(what: str, ok: Callable[[], bool], timeout: float = 60.0) -> None:
    """Admission configuration reaches the apiserver's admission chain asynchronously: poll for the effect (60 s: a
    loaded 2-core machine; it returns as soon as the effect shows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not in effect after {timeout}s")


def _authorized(authz: client.AuthorizationV1Api, user: str, groups: list[str], **attributes: str) -> bool:
    """A SubjectAccessReview: whether the apiserver's authorizer, with the roles and bindings it has loaded so far,
    lets `user` do this."""
    body = {"spec": {"user": user, "groups": groups, "resourceAttributes": attributes}}
    return bool(authz.create_subject_access_review(body).status.allowed)


def _sa_groups() -> list[str]:
    return ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]


def _refusal(call: Callable[[], Any], *, not_yet: bool = False) -> str:
    """The message of a 403, or "" when the call succeeds (or, with `not_yet`, fails otherwise: a probe the policy
    does not refuse yet may go on to fail for another reason, as a Binding to a pod that is not there)."""
    try:
        call()
    except client.ApiException as exc:
        if exc.status == 403:
            return str(json.loads(exc.body)["message"])
        if not not_yet:
            raise
    return ""


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cp = control_plane
    tag = uuid.uuid4().hex[:6]
    admin = _core(cp, kubeconfig=cp.admin_kubeconfig)
    admission = client.AdmissionregistrationV1Api(admin.api_client)
    ns = f"adm-{tag}"
    admin.create_namespace({"metadata": {"name": ns}})
    # The shipped RBAC (ServiceAccounts, roles, bindings) of the extender and the device plugin.
    _apply(
        cp, [d for f in RBAC_FILES for d in yaml.safe_load_all((ROOT / f).read_text()) if d and d["kind"] in RBAC_KINDS]
    )
    # The tenant: the built-in edit role in its namespace only.
    tenant_user = f"tenant-{tag}"
    rbac = client.RbacAuthorizationV1Api(admin.api_client)
    aggregate(rbac, "edit")
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "tenant-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenant_user}],
        },
    )
    node_a, node_b = f"adm-{tag}-a", f"adm-{tag}-b"
    for node in (node_a, node_b):
        cp.add_node(node, {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "80"})
    pod_a = _plugin_pod(admin, f"vgpu-device-plugin-{tag}-a", node_a)
    pod_b = _plugin_pod(admin, f"vgpu-device-plugin-{tag}-b", node_b)

    # The shipped mutating webhook configuration, served in-process (as tests/e2e/test_webhook_e2e.py does), only
    # for this module's namespace: the policy must hold also where the webhook is skipped (the opt-out label).
    pki = certs.write_dev_certs(tmp_path_factory.mktemp("webhook-pki"), ("localhost", "127.0.0.1"))
    inventory = NodeAnnotationInventory(api=_core(cp, kubeconfig=cp.admin_kubeconfig))
    inventory.start()
    assert inventory.wait_synced(60)  # its first node list: 60 s, a loaded 2-core machine, as the webhook e2e
    cfg = WebhookConfig(host="127.0.0.1", port=0, cert_file=str(pki.cert), key_file=str(pki.key))
    server = build_server(
        cfg, inventory, CollectorRegistry(), pods=lambda namespace, name: find_pod(admin, namespace, name)
    ).start()
    hook_doc = yaml.safe_load(WEBHOOK_CONFIG.read_text())
    hook_doc["metadata"] = {"name": f"vgpu-webhook-adm-{tag}"}
    hook = hook_doc["webhooks"][0]
    hook["clientConfig"] = {
        "url": f"https://127.0.0.1:{server.port}/mutate",
        "caBundle": base64.b64encode(pki.ca_cert.read_bytes()).decode(),
    }
    hook["namespaceSelector"]["matchExpressions"].append(
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}
    )
    admission.create_mutating_webhook_configuration(hook_doc)
    # The shipped eviction guard (evict.vgpu.io) from the same server, for this module's namespace only; and the
    # eviction right an admin adds with the ladder's evict step (the shipped ladder has none), here in that namespace.
    guard_doc = yaml.safe_load(GUARD_CONFIG.read_text())
    guard_doc["metadata"] = {"name": f"vgpu-eviction-guard-adm-{tag}"}
    guard_doc["webhooks"] = [w for w in guard_doc["webhooks"] if w["name"] == "evict.vgpu.io"]
    guard_doc["webhooks"][0]["clientConfig"] = {
        "url": f"https://127.0.0.1:{server.port}/validate-eviction",
        "caBundle": base64.b64encode(pki.ca_cert.read_bytes()).decode(),
    }
    guard_doc["webhooks"][0]["namespaceSelector"] = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}]
    }
    admission.create_validating_webhook_configuration(guard_doc)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "plugin-evicts"},
            "rules": [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "plugin-evicts"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "plugin-evicts"},
            "subjects": [{"kind": "ServiceAccount", "name": "vgpu-device-plugin", "namespace": "kube-system"}],
        },
    )

    policy = [d for d in yaml.safe_load_all(POLICY.read_text()) if d]
    _apply(cp, policy)
    c = Cluster(
        admin=admin,
        tenant=_core(cp, kubeconfig=cp.write_kubeconfig(tenant_user)),
        tenant_user=tenant_user,
        extender=_core(cp, token=_token(admin, "vgpu-extender")),
        plugin_a=_core(cp, token=_token(admin, "vgpu-device-plugin", pod_a)),
        plugin_b=_core(cp, token=_token(admin, "vgpu-device-plugin", pod_b)),
        plugin_unbound=_core(cp, token=_token(admin, "vgpu-device-plugin")),
        scheduler=client.CoordinationV1Api(_core(cp, token=_token(admin, "vgpu-scheduler")).api_client),
        node_a=node_a,
        node_b=node_b,
        ns=ns,
    )
    # The apiserver loads policies and their bindings in batches (it refreshes them about once a second,
    # k8s.io/apiserver v0.34 pkg/admission/plugin/policy/generic/policy_source.go): one in effect says nothing of
    # the next, so wait for each one's own refusal (a CI run saw vgpu-node-inventory a refresh behind).
    probe = c.pod("probe", labels=OPT_OUT, **{ann.POD_ASSIGNMENT: "x"})
    probe_binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "no-such-pod", "annotations": {ann.POD_ASSIGNMENT: "x"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_a},
    }
    probes: dict[str, Callable[[], Any]] = {
        "vgpu-pod-protocol": lambda: c.tenant.create_namespaced_pod(ns, probe, dry_run="All"),
        "vgpu-node-inventory": lambda: admin.patch_node(
            node_a, {"metadata": {"annotations": {ann.NODE_INVENTORY: "probe"}}}, dry_run="All"
        ),
        "vgpu-binding-protocol": lambda: admin.create_namespaced_pod_binding(
            "no-such-pod", ns, probe_binding, _preload_content=False, dry_run="All"
        ),
        "vgpu-scheduler-lease": lambda: c.scheduler.create_namespaced_lease(
            "kube-system", _lease(f"probe-{tag}"), dry_run="All"
        ),
    }
    for name, attempt in probes.items():
        _wait(f"the admission policy {name}", lambda: name in _refusal(attempt, not_yet=True))  # noqa: B023
    # The RBAC authorizer loads roles and bindings from watches of its own: the probes above prove the tenant's and
    # vgpu-scheduler's, not the extender's or the device plugin's (their ClusterRoleBinding was created after
    # vgpu-scheduler's), whose writes the tests below expect to pass or to be refused by a policy, never by RBAC.
    authz = client.AuthorizationV1Api(admin.api_client)
    loaded = {
        "the extender's RBAC": lambda: _authorized(
            authz, EXTENDER, _sa_groups(), verb="create", resource="pods", subresource="binding", namespace=ns
        ),
        "the device plugin's RBAC": lambda: _authorized(
            authz, PLUGIN, _sa_groups(), verb="patch", resource="nodes", name=node_a
        ),
        "the tenant's RBAC": lambda: _authorized(
            authz, tenant_user, ["system:authenticated"], verb="patch", resource="pods", namespace=ns
        ),
        "the device plugin's eviction right": lambda: _authorized(
            authz, PLUGIN, _sa_groups(), verb="create", resource="pods", subresource="eviction", namespace=ns
        ),
    }
    for what, check in loaded.items():
        _wait(what, check)
    _wait(
        "the webhook",
        lambda: (
            (c.tenant.create_namespaced_pod(ns, c.pod("probe"), dry_run="All").metadata.labels or {}).get(
                "vgpu.io/managed"
            )
            == "true"
        ),
    )
    # The guard: a dry-run eviction without the pod's UID, refused by the webhook once the apiserver sends it there.
    raw_probe = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "probe", "namespace": ns}}
    _wait(
        "the eviction guard",
        lambda: (
            "evict.vgpu.io"
            in _refusal(
                lambda: c.plugin_a.create_namespaced_pod_eviction("probe", ns, raw_probe, dry_run="All"), not_yet=True
            )
        ),
    )
    try:
        yield c
    finally:
        # The tenant's pods, pending under vgpu-scheduler's name, would otherwise be placed by a later module's
        # kube-scheduler on that module's fresh nodes and fill them (test_extender_e2e saw its two new nodes "GPU
        # memory full" with this module's forged-* pods).
        admin.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        _wait("this module's pods to go", lambda: not admin.list_namespaced_pod(ns).items, timeout=60.0)
        for d in reversed(policy):
            proc = cp.kubectl("delete", d["kind"], d["metadata"]["name"], "--ignore-not-found", check=False)
            assert proc.returncode == 0, proc.stderr
        admission.delete_mutating_webhook_configuration(hook_doc["metadata"]["name"])
        admission.delete_validating_webhook_configuration(guard_doc["metadata"]["name"])
        server.tls.stop()
        server.stop()
        inventory.stop()
        for name, attempt in probes.items():  # each one, as they load: later modules' admin writes these keys
            _wait(f"removing {name}", lambda: name not in _refusal(attempt, not_yet=True))  # noqa: B023
        for pod in (pod_a, pod_b):
            admin.delete_namespaced_pod(pod.metadata.name, "kube-system", grace_period_seconds=0)
        for node in (node_a, node_b):  # the webhook inventories of later tests must not see them
            admin.delete_node(node)


# ---- the tenant: every forgery is refused with a message naming the key, the writer it belongs to and why


def test_forged_assignment_at_create_with_the_opt_out_label_is_denied(cluster: Cluster) -> None:
    c = cluster
    pod = c.pod("forged-create", labels=OPT_OUT, **{ann.POD_ASSIGNMENT: _assignment(c.node_a)})
    msg = _denied(lambda: c.tenant.create_namespaced_pod(c.ns, pod))
    assert "ValidatingAdmissionPolicy 'vgpu-pod-protocol'" in msg
    assert (
        f"vgpu.io/assignment may only be written by the scheduler extender ({EXTENDER}), not by {c.tenant_user}" in msg
    )
    with pytest.raises(client.ApiException):
        c.admin.read_namespaced_pod("forged-create", c.ns)


def test_forged_assignment_at_create_through_the_webhook_never_reaches_the_pod(cluster: Cluster) -> None:
    """Without the opt-out the webhook drops copied bind-time annotations first; the pod is admitted without it."""
    c = cluster
    pod = c.pod(
        "forged-through-webhook", **{ann.POD_ASSIGNMENT: _assignment(c.node_a), ann.POD_BIND_TIME: "9999999999"}
    )
    created = c.tenant.create_namespaced_pod(c.ns, pod)
    assert created.metadata.labels["vgpu.io/managed"] == "true"
    assert ann.POD_ASSIGNMENT not in (created.metadata.annotations or {})
    assert ann.POD_BIND_TIME not in (created.metadata.annotations or {})


def test_forged_assignment_by_patch_after_create_is_denied(cluster: Cluster) -> None:
    c = cluster
    c.tenant_pod("forged-patch")
    patch = {"metadata": {"annotations": {ann.POD_ASSIGNMENT: _assignment(c.node_a)}}}
    msg = _denied(lambda: c.tenant.patch_namespaced_pod("forged-patch", c.ns, patch))
    assert f"vgpu.io/assignment may only be written by the scheduler extender ({EXTENDER})" in msg
    assert "decides which GPU slice the pod gets" in msg
    assert ann.POD_ASSIGNMENT not in (c.admin.read_namespaced_pod("forged-patch", c.ns).metadata.annotations or {})


def test_forged_assignment_by_update_is_denied(cluster: Cluster) -> None:
    c = cluster
    pod = c.tenant_pod("forged-update")
    pod.metadata.annotations = {**(pod.metadata.annotations or {}), ann.POD_ASSIGNMENT: _assignment(c.node_a)}
    msg = _denied(lambda: c.tenant.replace_namespaced_pod("forged-update", c.ns, pod))
    assert (
        f"vgpu.io/assignment may only be written by the scheduler extender ({EXTENDER}), not by {c.tenant_user}" in msg
    )


def test_forged_assignment_by_patch_with_the_opt_out_label_is_denied(cluster: Cluster) -> None:
    c = cluster
    c.tenant.create_namespaced_pod(c.ns, c.pod("forged-opt-out", labels=OPT_OUT))
    patch = {"metadata": {"annotations": {ann.POD_ASSIGNMENT: _assignment(c.node_a), ann.POD_BIND_PHASE: "allocated"}}}
    msg = _denied(lambda: c.tenant.patch_namespaced_pod("forged-opt-out", c.ns, patch))
    assert "vgpu.io/assignment may only be written by the scheduler extender" in msg


def test_far_future_bind_time_is_denied(cluster: Cluster) -> None:
    c = cluster
    pod = c.pod("forged-bind-time", labels=OPT_OUT, **{ann.POD_BIND_TIME: "9999999999"})
    msg = _denied(lambda: c.tenant.create_namespaced_pod(c.ns, pod))
    assert f"vgpu.io/bind-time may only be written by the scheduler extender ({EXTENDER})" in msg
    c.tenant_pod("forged-bind-time")
    patch = {"metadata": {"annotations": {ann.POD_BIND_TIME: "9999999999"}}}
    msg = _denied(lambda: c.tenant.patch_namespaced_pod("forged-bind-time", c.ns, patch))
    assert "for how long it is reserved" in msg


def test_bind_phase_and_violation_by_the_tenant_are_denied(cluster: Cluster) -> None:
    c = cluster
    c.bound_pod("tenant-phase", c.node_a)
    allocated = {"metadata": {"annotations": {ann.POD_BIND_PHASE: "allocated"}}}
    msg = _denied(lambda: c.tenant.patch_namespaced_pod("tenant-phase", c.ns, allocated))
    assert (
        f'vgpu.io/bind-phase "allocated" (only the device plugin ({PLUGIN}) running on the pod\'s node "{c.node_a}"'
        in msg
    )
    failed = {"metadata": {"annotations": {ann.POD_BIND_PHASE: "failed"}}}
    msg = _denied(lambda: c.tenant.patch_namespaced_pod("tenant-phase", c.ns, failed))
    assert f"only the scheduler extender ({EXTENDER}) may set or remove it" in msg
    removed = {"metadata": {"annotations": {ann.POD_BIND_PHASE: None}}}
    _denied(lambda: c.tenant.patch_namespaced_pod("tenant-phase", c.ns, removed))
    violation = {"metadata": {"annotations": {"vgpu.io/violation": "{}"}}}
    msg = _denied(lambda: c.tenant.patch_namespaced_pod("tenant-phase", c.ns, violation))
    assert (
        f'vgpu.io/violation may only be written by the device plugin ({PLUGIN}) running on the pod\'s node "{c.node_a}"'
        in msg
    )


def test_spec_node_name_on_a_vgpu_pod_is_denied(cluster: Cluster) -> None:
    c = cluster
    for labels in ({}, OPT_OUT):
        pod = c.pod("pinned", labels=labels)
        pod["spec"]["nodeName"] = c.node_a
        msg = _denied(lambda pod=pod: c.tenant.create_namespaced_pod(c.ns, pod))
        assert f'spec.nodeName ("{c.node_a}") on a pod that asks for vGPU resources' in msg
        assert "may only be set at create by a node or control-plane identity" in msg
        assert f"not by {c.tenant_user}: it would skip vgpu-scheduler" in msg
    plain = c.pod("pinned-no-gpu")
    plain["spec"]["containers"][0].pop("resources")
    plain["spec"]["nodeName"] = c.node_a
    c.tenant.create_namespaced_pod(c.ns, plain)  # pods without vGPU resources are none of our business


def test_leader_label_by_the_tenant_is_denied(cluster: Cluster) -> None:
    c = cluster
    pod = c.pod("fake-leader", labels={ann.EXTENDER_LEADER_LABEL: "true"})
    msg = _denied(lambda: c.tenant.create_namespaced_pod(c.ns, pod))
    assert f"the label vgpu.io/extender-leader may only be set by the scheduler extender ({EXTENDER})" in msg


def test_forged_node_inventory_is_denied_even_to_cluster_admins(cluster: Cluster) -> None:
    c = cluster
    inv = {"metadata": {"annotations": {ann.NODE_INVENTORY: "forged"}}}
    # The tenant has no rights on nodes at all (RBAC) ...
    msg = _denied(lambda: c.tenant.patch_node(c.node_a, inv))
    assert f'User "{c.tenant_user}" cannot patch resource "nodes"' in msg
    # ... and whoever has (here system:masters) still cannot write the inventory: the policy names the writer.
    msg = _denied(lambda: c.admin.patch_node(c.node_a, inv))
    assert "ValidatingAdmissionPolicy 'vgpu-node-inventory'" in msg
    assert (
        f'vgpu.io/node-inventory of node "{c.node_a}" may only be written by the device plugin ({PLUGIN}) running on that node'
        in msg
    )


def test_only_an_admin_cordons_a_gpu(cluster: Cluster) -> None:
    """vgpu.io/cordoned-gpus is the admin's: not the tenant's (RBAC), not the extender's (RBAC), not the device
    plugin's (the policy: its node updates touch only the inventory keys); the admin's patch goes through."""
    c = cluster
    cordon = {"metadata": {"annotations": {ann.NODE_CORDONED_GPUS: f"GPU-{c.node_a}-0"}}}
    msg = _denied(lambda: c.tenant.patch_node(c.node_a, cordon))
    assert f'User "{c.tenant_user}" cannot patch resource "nodes"' in msg
    msg = _denied(lambda: c.extender.patch_node(c.node_a, cordon))
    assert f'User "{EXTENDER}" cannot patch resource "nodes"' in msg
    msg = _denied(lambda: c.plugin_a.patch_node(c.node_a, cordon))
    assert f"{PLUGIN} may only change the vgpu.io/node-inventory annotations of its own node [{c.node_a}]" in msg
    assert "[vgpu.io/cordoned-gpus]" in msg
    c.admin.patch_node(c.node_a, cordon)
    assert c.admin.read_node(c.node_a).metadata.annotations[ann.NODE_CORDONED_GPUS] == f"GPU-{c.node_a}-0"
    c.admin.patch_node(c.node_a, {"metadata": {"annotations": {ann.NODE_CORDONED_GPUS: None}}})
    assert ann.NODE_CORDONED_GPUS not in (c.admin.read_node(c.node_a).metadata.annotations or {})


# ---- the owners: the same writes succeed, and nothing beyond them


def test_the_extender_writes_assignment_bind_time_and_phase(cluster: Cluster) -> None:
    c = cluster
    c.tenant_pod("by-extender")
    annotations = {
        ann.POD_ASSIGNMENT: _assignment(c.node_a),
        ann.POD_BIND_PHASE: "allocating",
        ann.POD_BIND_TIME: "9999999999",
    }
    c.extender.patch_namespaced_pod("by-extender", c.ns, {"metadata": {"annotations": annotations}})
    c.extender.patch_namespaced_pod("by-extender", c.ns, {"metadata": {"annotations": {ann.POD_REQUEUE: "1.0"}}})
    release = {ann.POD_ASSIGNMENT: None, ann.POD_BIND_PHASE: "failed"}  # KubeBinder.fence
    c.extender.patch_namespaced_pod("by-extender", c.ns, {"metadata": {"annotations": release}})
    got = c.admin.read_namespaced_pod("by-extender", c.ns).metadata.annotations
    assert got[ann.POD_BIND_PHASE] == "failed" and ann.POD_ASSIGNMENT not in got
    # But the extender may not serve a slice (allocated), nor touch anything that is not its protocol.
    msg = _denied(
        lambda: c.extender.patch_namespaced_pod(
            "by-extender", c.ns, {"metadata": {"annotations": {ann.POD_BIND_PHASE: "allocated"}}}
        )
    )
    assert f"refused for {EXTENDER}" in msg
    msg = _denied(
        lambda: c.extender.patch_namespaced_pod("by-extender", c.ns, {"metadata": {"annotations": {"team": "x"}}})
    )
    assert f"{EXTENDER} may only change vgpu.io/ annotations" in msg and "[team]" in msg
    image = {"spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]}}
    _denied(lambda: c.extender.patch_namespaced_pod("by-extender", c.ns, image))


def test_the_node_plugin_marks_its_pods_allocated_and_records_violations(cluster: Cluster) -> None:
    c = cluster
    c.bound_pod("served", c.node_a)
    c.plugin_a.patch_namespaced_pod("served", c.ns, {"metadata": {"annotations": {ann.POD_BIND_PHASE: "allocated"}}})
    c.plugin_a.patch_namespaced_pod("served", c.ns, {"metadata": {"annotations": {"vgpu.io/violation": "{}"}}})
    got = c.admin.read_namespaced_pod("served", c.ns).metadata.annotations
    assert got[ann.POD_BIND_PHASE] == "allocated" and got["vgpu.io/violation"] == "{}"


def test_the_plugin_of_another_node_is_denied(cluster: Cluster) -> None:
    c = cluster
    c.bound_pod("foreign", c.node_a)
    allocated = {"metadata": {"annotations": {ann.POD_BIND_PHASE: "allocated"}}}
    msg = _denied(lambda: c.plugin_b.patch_namespaced_pod("foreign", c.ns, allocated))
    assert f'running on the pod\'s node "{c.node_a}"' in msg and f"refused for {PLUGIN}" in msg
    msg = _denied(
        lambda: c.plugin_b.patch_namespaced_pod(
            "foreign", c.ns, {"metadata": {"annotations": {"vgpu.io/violation": "{}"}}}
        )
    )
    assert "vgpu.io/violation may only be written by the device plugin" in msg
    # Nor may the plugin of the pod's own node change anything else of it, or write the extender's keys.
    image = {"spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]}}
    msg = _denied(lambda: c.plugin_a.patch_namespaced_pod("foreign", c.ns, image))
    assert (
        f"{PLUGIN} may only change vgpu.io/ annotations (bind-phase and violation) of pods on its own node [{c.node_a}]"
        in msg
    )
    assert f'this update of a pod on node "{c.node_a}" changes [] or its spec' in msg
    msg = _denied(
        lambda: c.plugin_a.patch_namespaced_pod(
            "foreign", c.ns, {"metadata": {"annotations": {ann.POD_BIND_TIME: "1"}}}
        )
    )
    assert "vgpu.io/bind-time may only be written by the scheduler extender" in msg


def test_the_extenders_own_kube_calls_pass(cluster: Cluster) -> None:
    """scheduler_extender/kube.py itself, with the extender's token: the Binding carrying the assignment, the requeue
    nudge, the fence, and the leader label on its own pod (kube-system) -- every write the extender makes."""
    from scheduler_extender import kube as ext_kube

    c = cluster
    pod = c.tenant_pod("real-extender")
    binder = ext_kube.KubeBinder(c.extender)
    assignment = ann.decode_assignment(_assignment(c.node_a))
    binder.bind(
        namespace=c.ns,
        name="real-extender",
        uid=pod.metadata.uid,
        version=pod.metadata.resource_version,
        node=c.node_a,
        assignment=assignment,
    )
    got = c.admin.read_namespaced_pod("real-extender", c.ns)
    assert got.spec.node_name == c.node_a and got.metadata.annotations[ann.POD_BIND_PHASE] == "allocating"
    assert ann.decode_assignment(got.metadata.annotations[ann.POD_ASSIGNMENT]) == assignment
    ext_kube.nudge_pod(c.extender, c.ns, "real-extender", pod.metadata.uid)
    # A fence on the version a lost Binding was sent on: the pod is bound (it landed), so it reads False.
    assert (
        binder.fence(namespace=c.ns, name="real-extender", uid=pod.metadata.uid, version=pod.metadata.resource_version)
        is False
    )
    lost = c.tenant_pod("real-extender-lost")  # a Binding lost on this version: the fence's PATCH moves past it
    version = lost.metadata.resource_version
    assert binder.fence(namespace=c.ns, name="real-extender-lost", uid=lost.metadata.uid, version=version) is True
    got = c.admin.read_namespaced_pod("real-extender-lost", c.ns)
    assert got.metadata.annotations[ann.POD_BIND_PHASE] == "failed" and got.metadata.resource_version != version
    with pytest.raises(client.ApiException) as late:  # the lost Binding, arriving now, cannot land
        binder.bind(
            namespace=c.ns,
            name="real-extender-lost",
            uid=lost.metadata.uid,
            version=version,
            node=c.node_a,
            assignment=assignment,
        )
    assert late.value.status == 409
    own = f"vgpu-extender-{c.ns}"
    c.admin.create_namespaced_pod(
        "kube-system", {"metadata": {"name": own}, "spec": {"containers": [{"name": "e", "image": "kube-vgpu"}]}}
    )
    try:
        ext_kube.mark_leader(c.extender, namespace="kube-system", name=own, leading=True)
        assert ext_kube.clear_other_leader_labels(c.extender, namespace="kube-system", own="nobody") == [own]
    finally:
        c.admin.delete_namespaced_pod(own, "kube-system", grace_period_seconds=0)


def test_the_device_plugins_own_kube_calls_pass_on_its_node_only(cluster: Cluster) -> None:
    """device_plugin/kube.py itself, with each plugin's token: its node's pods, bind-phase, violation, inventory,
    events and evictions pass for its own node; the other node's plugin is refused."""
    from device_plugin.kube import KubePodSource

    c = cluster
    c.bound_pod("real-plugin", c.node_a)
    c.bound_pod("real-evicted", c.node_a)
    a, b = KubePodSource(c.plugin_a), KubePodSource(c.plugin_b)
    assert {"real-plugin", "real-evicted"} <= {p.name for p in a.list_node_pods(node=c.node_a)}
    a.patch_pod_annotations(namespace=c.ns, name="real-plugin", annotations={ann.POD_BIND_PHASE: "allocated"})
    a.patch_pod_annotations(namespace=c.ns, name="real-plugin", annotations={"vgpu.io/violation": "{}"})
    a.patch_node_annotations(node=c.node_a, annotations={ann.NODE_INVENTORY: inventory(c.node_a, 2)})
    uid = c.admin.read_namespaced_pod("real-plugin", c.ns).metadata.uid
    a.create_pod_event(namespace=c.ns, pod="real-plugin", uid=uid, reason="VgpuTest", message="from the plugin")
    evicted = c.admin.read_namespaced_pod("real-evicted", c.ns).metadata.uid
    assert a.evict_pod(namespace=c.ns, name="real-evicted", uid=evicted)
    assert c.admin.read_namespaced_pod("real-plugin", c.ns).metadata.annotations[ann.POD_BIND_PHASE] == "allocated"
    with pytest.raises(client.ApiException) as info:
        b.patch_pod_annotations(namespace=c.ns, name="real-plugin", annotations={"vgpu.io/violation": "{}"})
    assert info.value.status == 403
    with pytest.raises(client.ApiException) as info:
        b.patch_node_annotations(node=c.node_a, annotations={ann.NODE_INVENTORY: inventory(c.node_a, 8)})
    assert info.value.status == 403


def test_the_device_plugin_evicts_its_own_nodes_pods_only(cluster: Cluster) -> None:
    """The eviction guard (evict.vgpu.io, webhook/eviction.py) in the real apiserver's admission chain: RBAC lets
    every node's plugin evict, the guard lets it evict only pods on the node bound into its token, of the UID it
    names; a token bound to no node evicts nothing; an admin's evictions never reach the guard."""
    from device_plugin.kube import KubePodSource

    c = cluster
    on_a, on_b = c.bound_pod("evict-on-a", c.node_a), c.bound_pod("evict-on-b", c.node_b)
    a, b = KubePodSource(c.plugin_a), KubePodSource(c.plugin_b)
    msg = _denied(lambda: a.evict_pod(namespace=c.ns, name="evict-on-b", uid=on_b.metadata.uid))
    assert 'admission webhook "evict.vgpu.io" denied the request' in msg
    assert (
        f"kube-vgpu: {PLUGIN} may only evict pods on the node bound into its token: its token is bound to node "
        f"{c.node_a}, and pod {c.ns}/evict-on-b runs on node {c.node_b}"
    ) in msg
    raw = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "evict-on-a", "namespace": c.ns}}
    assert "deleteOptions.preconditions.uid" in _denied(
        lambda: c.plugin_a.create_namespaced_pod_eviction("evict-on-a", c.ns, raw)
    )
    assert f"has UID {on_a.metadata.uid}, not {on_b.metadata.uid}" in _denied(
        lambda: a.evict_pod(namespace=c.ns, name="evict-on-a", uid=on_b.metadata.uid)
    )
    assert "its token carries no node name(s) (authentication.kubernetes.io/node-name)" in _denied(
        lambda: KubePodSource(c.plugin_unbound).evict_pod(namespace=c.ns, name="evict-on-a", uid=on_a.metadata.uid)
    )
    for name in ("evict-on-a", "evict-on-b"):  # refused, so still there and not terminating
        assert c.admin.read_namespaced_pod(name, c.ns).metadata.deletion_timestamp is None
    assert b.evict_pod(namespace=c.ns, name="evict-on-b", uid=on_b.metadata.uid)
    assert a.evict_pod(namespace=c.ns, name="evict-on-a", uid=on_a.metadata.uid)
    for name in ("evict-on-a", "evict-on-b"):  # evicted: deleted or terminating
        with contextlib.suppress(client.ApiException):
            assert c.admin.read_namespaced_pod(name, c.ns).metadata.deletion_timestamp is not None


def test_the_node_plugin_writes_its_own_inventory_only(cluster: Cluster) -> None:
    c = cluster
    real = inventory(c.node_a, 1)  # a valid one: other tests' webhooks read every node's inventory
    inv = {"metadata": {"annotations": {ann.NODE_INVENTORY: real, ann.NODE_INVENTORY_TIME: "now"}}}
    c.plugin_a.patch_node(c.node_a, inv)
    assert c.admin.read_node(c.node_a).metadata.annotations[ann.NODE_INVENTORY] == real
    forged = {"metadata": {"annotations": {ann.NODE_INVENTORY: "forged", ann.NODE_INVENTORY_TIME: "later"}}}
    msg = _denied(lambda: c.plugin_b.patch_node(c.node_a, forged))
    assert f'vgpu.io/node-inventory, vgpu.io/node-inventory-time of node "{c.node_a}" may only be written' in msg
    assert f"by the device plugin ({PLUGIN}) running on that node, not by {PLUGIN} of node(s) [{c.node_b}]" in msg
    msg = _denied(lambda: c.plugin_b.patch_node(c.node_a, {"metadata": {"annotations": {"other": "x"}}}))
    assert f'of its own node [{c.node_b}]; this update is of node "{c.node_a}"' in msg
    msg = _denied(lambda: c.plugin_a.patch_node(c.node_a, {"metadata": {"labels": {"gpu": "fake"}}}))
    assert f"{PLUGIN} may only change the vgpu.io/node-inventory annotations of its own node [{c.node_a}]" in msg
    msg = _denied(lambda: c.plugin_a.patch_node(c.node_a, {"metadata": {"annotations": {"other": "x"}}}))
    assert "this update also changes [other]" in msg
    taint = {"spec": {"unschedulable": True}}
    _denied(lambda: c.plugin_a.patch_node(c.node_a, taint))


def _lease(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-system"}, "spec": {"holderIdentity": "x"}}


def test_the_second_scheduler_writes_its_own_lease_only(cluster: Cluster) -> None:
    """system:kube-scheduler (which vgpu-scheduler is bound to) allows updating the default scheduler's Lease; the
    policy vgpu-scheduler-lease takes that back."""
    c = cluster
    admin = client.CoordinationV1Api(c.admin.api_client)
    for name in ("kube-scheduler", "vgpu-scheduler"):
        try:
            admin.create_namespaced_lease("kube-system", _lease(name))
        except client.ApiException as exc:
            if exc.status != 409:  # a kube-scheduler of an earlier test may hold it already
                raise
    own = c.scheduler.read_namespaced_lease("vgpu-scheduler", "kube-system")
    c.scheduler.replace_namespaced_lease("vgpu-scheduler", "kube-system", own)
    theirs = c.scheduler.read_namespaced_lease("kube-scheduler", "kube-system")  # RBAC allows it ...
    msg = _denied(lambda: c.scheduler.replace_namespaced_lease("kube-scheduler", "kube-system", theirs))  # ... not this
    assert "ValidatingAdmissionPolicy 'vgpu-scheduler-lease'" in msg
    assert (
        "system:serviceaccount:kube-system:vgpu-scheduler may only write its own Lease kube-system/vgpu-scheduler, "
        "not leases kube-system/kube-scheduler"
    ) in msg
    _denied(lambda: c.scheduler.create_namespaced_lease("kube-system", _lease(f"other-{c.ns}")))


def test_a_binding_carrying_vgpu_annotations_is_denied_even_to_cluster_admins(cluster: Cluster) -> None:
    """The apiserver copies a Binding's annotations onto the pod; only the extender may carry vgpu.io/ keys there."""
    c = cluster
    c.tenant_pod("forged-binding")

    def bind(api: client.CoreV1Api, annotations: dict[str, str]) -> Any:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "forged-binding", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": c.node_a},
        }
        # The generated client cannot read the Status a Binding answers with: take the raw response.
        return api.create_namespaced_pod_binding("forged-binding", c.ns, body, _preload_content=False, dry_run="All")

    forged = {ann.POD_ASSIGNMENT: _assignment(c.node_a)}
    _wait("the binding policy", lambda: "vgpu-binding-protocol" in _refusal(lambda: bind(c.admin, forged)))
    msg = _refusal(lambda: bind(c.admin, forged))
    assert "vgpu.io/assignment" in msg and f"only from the scheduler extender ({EXTENDER})" in msg
    assert _refusal(lambda: bind(c.admin, {"team": "x"})) == ""  # a plain Binding by an admin passes
    body_label = lambda: c.admin.create_namespaced_pod_binding(  # noqa: E731
        "forged-binding",
        c.ns,
        {
            "metadata": {"name": "forged-binding", "labels": {"vgpu.io/extender-leader": "true"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": c.node_a},
        },
        _preload_content=False,
        dry_run="All",
    )
    assert "vgpu.io/extender-leader" in _refusal(body_label)
    assert _refusal(lambda: bind(c.extender, forged)) == ""  # the extender's own
    own = {**forged, ann.POD_BIND_PHASE: "allocating", ann.POD_BIND_TIME: "1.0"}  # as KubeBinder.bind sends it
    assert _refusal(lambda: bind(c.extender, own)) == ""
    for extra in ({ann.POD_BIND_PHASE: "allocated"}, {"vgpu.io/violation": "{}"}):  # the device plugin's to write
        msg = _refusal(lambda extra=extra: bind(c.extender, {**forged, **extra}))
        assert "the scheduler extender's Binding may carry vgpu.io/assignment" in msg, msg
    pod = c.admin.read_namespaced_pod("forged-binding", c.ns)  # dry runs: nothing landed
    assert not pod.spec.node_name and ann.POD_ASSIGNMENT not in (pod.metadata.annotations or {})
