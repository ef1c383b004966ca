"""The only module that talks to the apiserver: keyword-only functions over a CoreV1Api handed in."""

from __future__ import annotations

import json
from collections.abc import Mapping
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
