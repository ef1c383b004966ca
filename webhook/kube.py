"""The webhook's only contact with the Kubernetes client library: the Node watch, the cert Job's Secret read, and
the pod lists of the quota count and the eviction guard.

Everything else takes the API objects as arguments, so the admission logic and its tests never load the
client (the import-linter contracts in pyproject.toml keep it that way).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException


def node_watch() -> Any:
    """A fresh watch for `NodeAnnotationInventory`'s list + watch loop."""
    return watch.Watch()  # type: ignore[no-untyped-call]


def read_secret(core: Any, *, namespace: str, name: str) -> Any | None:
    """The Secret, or None when it does not exist (404); other API errors propagate."""
    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def list_namespace_pods(core: Any, namespace: str) -> list[dict[str, Any]]:
    """The namespace's pods as plain JSON (camelCase keys, as admission sees pods), for the quota count."""
    resp = core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=(3.05, 5))
    items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
    return items


def find_pod(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod `namespace/name` as plain JSON, or None when there is none: one list of the namespace by field selector
    (`metadata.name`), the right the quota count already has, so the eviction guard needs no `get`. `name` must be a
    checked pod name (webhook.eviction.is_pod_name): it goes into the selector."""
    resp = core.list_namespaced_pod(
        namespace, field_selector=f"metadata.name={name}", _preload_content=False, _request_timeout=(3.05, 5)
    )
    items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
    return next((p for p in items if (p.get("metadata") or {}).get("name") == name), None)
