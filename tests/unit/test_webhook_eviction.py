"""The eviction guard (webhook.eviction, `/validate-eviction`): a node's device plugin evicts its own node's pods only.

Reviews are built as the apiserver sends them for `POST pods/<name>/eviction` (admission.k8s.io/v1: kind
policy/v1 Eviction, resource pods, subResource eviction, the user's extra with the node a bound token carries)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from webhook.admission import Settings
from webhook.eviction import NODE_NAME_EXTRA, decide_eviction, is_pod_name
from webhook.metrics import WebhookMetrics
from webhook.review import AdmissionRequest
from webhook.server import Reviewer, create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

PLUGIN = "system:serviceaccount:kube-system:vgpu-device-plugin"
POD_UID = "0b6a1f2e-0000-4000-8000-00000000000a"


def _request(
    *,
    name: str = "vllm-0",
    namespace: str = "team-a",
    nodes: list[str] | None = None,
    uid: str | None = POD_UID,
    sub: str | None = "eviction",
    operation: str = "CREATE",
) -> dict[str, Any]:
    eviction: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    if uid is not None:
        eviction["deleteOptions"] = {"preconditions": {"uid": uid}}
    extra = {NODE_NAME_EXTRA: nodes} if nodes is not None else {}
    return {
        "uid": "r1",
        "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": sub,
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": PLUGIN, "extra": extra},
        "object": eviction,
    }


def _pod(node: str | None, uid: str = POD_UID, name: str = "vllm-0") -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid}, "spec": spec}


class Pods:
    """A lookup that records what it was asked."""

    def __init__(self, pod: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.pod, self.error, self.asked = pod, error, []  # type: list[tuple[str, str]]

    def __call__(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append((namespace, name))
        if self.error is not None:
            raise self.error
        return self.pod


def _decide(pods: Pods | None, **kw: Any) -> Any:
    return decide_eviction(AdmissionRequest.model_validate(_request(**kw)), pods)


def test_own_nodes_pod_is_evicted() -> None:
    pods = Pods(_pod("gpu-a"))
    out = _decide(pods, nodes=["gpu-a"])
    assert out.allowed and out.kind == "admitted" and pods.asked == [("team-a", "vllm-0")]


def test_another_nodes_pod_is_refused_naming_both_nodes() -> None:
    out = _decide(Pods(_pod("gpu-b")), nodes=["gpu-a"])
    assert not out.allowed and out.code == 403
    assert f"{PLUGIN} may only evict pods on the node bound into its token" in out.message
    assert "bound to node gpu-a, and pod team-a/vllm-0 runs on node gpu-b" in out.message


def test_unbound_pod_is_refused() -> None:
    out = _decide(Pods(_pod(None)), nodes=["gpu-a"])
    assert not out.allowed and "pod team-a/vllm-0 is on no node yet" in out.message


@pytest.mark.parametrize("nodes", [None, [], [""], ["gpu-a", "gpu-b"]])
def test_a_token_without_exactly_one_node_is_refused_without_a_lookup(nodes: list[str] | None) -> None:
    pods = Pods(_pod("gpu-a"))
    out = _decide(pods, nodes=nodes)
    assert not out.allowed and out.code == 403 and NODE_NAME_EXTRA in out.message
    assert pods.asked == []


@pytest.mark.parametrize("uid", [None, ""])
def test_an_eviction_without_the_pods_uid_is_refused(uid: str | None) -> None:
    pods = Pods(_pod("gpu-a"))
    out = _decide(pods, nodes=["gpu-a"], uid=uid)
    assert not out.allowed and "deleteOptions.preconditions.uid" in out.message and pods.asked == []


def test_a_uid_of_another_pod_is_refused() -> None:
    out = _decide(Pods(_pod("gpu-a", uid="other")), nodes=["gpu-a"])
    assert not out.allowed and f"has UID other, not {POD_UID}" in out.message


@pytest.mark.parametrize("name", ["a,metadata.namespace=x", "A", "x" * 254, "-a", "a..b"])
def test_names_that_are_not_pod_names_never_reach_the_selector(name: str) -> None:
    pods = Pods(_pod("gpu-a"))
    out = _decide(pods, nodes=["gpu-a"], name=name)
    assert not out.allowed and "is not a pod's namespace and name" in out.message and pods.asked == []
    assert not is_pod_name(name) and is_pod_name("vllm-0.decode")


@pytest.mark.parametrize("namespace", ["", "team/a", "../kube-system", "a.b", "x" * 64])
def test_namespaces_that_are_not_namespaces_never_reach_the_read(namespace: str) -> None:
    pods = Pods(_pod("gpu-a"))
    out = _decide(pods, nodes=["gpu-a"], namespace=namespace)
    assert not out.allowed and "is not a pod's namespace and name" in out.message and pods.asked == []


def test_a_missing_pod_passes_to_the_apiservers_own_not_found() -> None:
    assert _decide(Pods(None), nodes=["gpu-a"]).allowed


def test_no_apiserver_access_or_a_failed_read_refuses_and_says_why() -> None:
    out = _decide(None, nodes=["gpu-a"])
    assert not out.allowed and out.code == 500 and "no apiserver access" in out.message
    out = _decide(Pods(error=RuntimeError("connection refused")), nodes=["gpu-a"])
    assert not out.allowed and out.kind == "error" and "connection refused" in out.message


@pytest.mark.parametrize(("sub", "op"), [(None, "CREATE"), ("status", "CREATE"), ("eviction", "UPDATE")])
def test_other_requests_are_not_the_guards(sub: str | None, op: str) -> None:
    pods = Pods(_pod("gpu-b"))
    assert _decide(pods, nodes=["gpu-a"], sub=sub, operation=op).allowed and pods.asked == []


def test_the_route_answers_a_review_and_counts_it() -> None:
    registry = CollectorRegistry()

    class _Inv:
        expected = False

        def summary(self) -> None:
            return None

        def ready(self) -> bool:
            return True

    pods = Pods(_pod("gpu-b"))
    reviewer = Reviewer(Settings(), _Inv(), WebhookMetrics(registry), pods=pods)  # type: ignore[arg-type]
    client = TestClient(create_app(reviewer))
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": _request(nodes=["gpu-a"])}
    r = client.post("/validate-eviction", json=review)
    assert r.status_code == 200
    resp = r.json()["response"]
    assert resp["uid"] == "r1" and resp["allowed"] is False and resp["status"]["code"] == 403
    assert "runs on node gpu-b" in resp["status"]["message"]
    pods.pod = _pod("gpu-a")
    assert client.post("/validate-eviction", json=review).json()["response"] == {"uid": "r1", "allowed": True}
    counted = {
        o: registry.get_sample_value("vgpu_webhook_reviews_total", {"endpoint": "validate-eviction", "outcome": o})
        for o in ("denied", "admitted")
    }
    assert counted == {"denied": 1.0, "admitted": 1.0}
