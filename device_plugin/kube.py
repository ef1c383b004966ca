"""The only module that talks to the apiserver: keyword-only functions over a CoreV1Api handed in."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client as k8s

from device_plugin.pods import PodRecord, pod_record


def list_node_pods(*, api: k8s.CoreV1Api, node: str, timeout_s: float = 5.0) -> list[PodRecord]:
    """A fresh (quorum) LIST of the pods bound to `node`: annotations written before the binding are visible."""
    resp = api.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=timeout_s
    )
    body: dict[str, Any] = json.loads(cast(Any, resp).data)
    return [pod_record(item) for item in body.get("items") or []]


def patch_pod_annotations(
    *, api: k8s.CoreV1Api, namespace: str, name: str, annotations: Mapping[str, str | None], timeout_s: float = 5.0
) -> None:
    """Merge-patch annotations (None deletes a key)."""
    api.patch_namespaced_pod(
        name=name,
        namespace=namespace,
        body={"metadata": {"annotations": dict(annotations)}},
        _request_timeout=timeout_s,
    )


def patch_node_annotations(
    *, api: k8s.CoreV1Api, node: str, annotations: Mapping[str, str | None], timeout_s: float = 5.0
) -> None:
    api.patch_node(name=node, body={"metadata": {"annotations": dict(annotations)}}, _request_timeout=timeout_s)


def create_pod_event(
    *,
    api: k8s.CoreV1Api,
    namespace: str,
    pod: str,
    uid: str,
    reason: str,
    message: str,
    event_type: str = "Warning",
    component: str = "vgpu-watchdog",
    timeout_s: float = 5.0,
) -> None:
    """A core/v1 Event on the pod (shown by `kubectl describe pod` and `kubectl get events`)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"generateName": f"{pod}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod, "uid": uid},
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    api.create_namespaced_event(namespace=namespace, body=cast(Any, body), _request_timeout=timeout_s)


def evict_pod(*, api: k8s.CoreV1Api, namespace: str, name: str, uid: str, timeout_s: float = 5.0) -> bool:
    """POST pods/eviction (policy/v1) of the pod with this UID (deleteOptions.preconditions: no other pod of the name,
    and the webhook's eviction guard refuses an eviction without it); False when a PodDisruptionBudget refuses it
    (HTTP 429)."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
    try:
        api.create_namespaced_pod_eviction(
            name=name, namespace=namespace, body=cast(Any, body), _request_timeout=timeout_s
        )
    except k8s.ApiException as exc:
        if exc.status == 429:
            return False
        raise
    return True


class KubePodSource:
    """PodSource over a CoreV1Api (built by main from in-cluster or kubeconfig settings)."""

    def __init__(self, api: k8s.CoreV1Api, *, timeout_s: float = 5.0) -> None:
        self.api = api
        self.timeout_s = timeout_s

    def list_node_pods(self, *, node: str) -> list[PodRecord]:
        return list_node_pods(api=self.api, node=node, timeout_s=self.timeout_s)

    def patch_pod_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        patch_pod_annotations(
            api=self.api, namespace=namespace, name=name, annotations=annotations, timeout_s=self.timeout_s
        )

    def patch_node_annotations(self, *, node: str, annotations: Mapping[str, str | None]) -> None:
        patch_node_annotations(api=self.api, node=node, annotations=annotations, timeout_s=self.timeout_s)

    def create_pod_event(
        self, *, namespace: str, pod: str, uid: str, reason: str, message: str, event_type: str = "Warning"
    ) -> None:
        create_pod_event(
            api=self.api,
            namespace=namespace,
            pod=pod,
            uid=uid,
            reason=reason,
            message=message,
            event_type=event_type,
            timeout_s=self.timeout_s,
        )

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> bool:
        return evict_pod(api=self.api, namespace=namespace, name=name, uid=uid, timeout_s=self.timeout_s)
