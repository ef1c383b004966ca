"""The only module that talks to the apiserver: reads, annotation patches, bindings, list+watch.

Functions take the API object and keyword-only arguments; nothing here holds a global client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from vgpu import annotations as ann
from vgpu.annotations import Assignment

log = logging.getLogger(__name__)

ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def _raw(resp: Any) -> dict[str, Any]:
    data = resp.data if hasattr(resp, "data") else resp.read()
    out: dict[str, Any] = orjson.loads(data)
    return out


def get_pod(api: client.CoreV1Api, *, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _raw(api.read_namespaced_pod(name, namespace, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_pod_annotations(
    api: client.CoreV1Api, *, namespace: str, name: str, uid: str, annotations: dict[str, str | None]
) -> None:
    """Merge-patch annotations (None deletes a key); the UID guards against a recreated pod."""
    metadata: dict[str, Any] = {"annotations": annotations}
    if uid:
        metadata["uid"] = uid
    api.patch_namespaced_pod(name, namespace, {"metadata": metadata}, _preload_content=False)


def create_binding(api: client.CoreV1Api, *, namespace: str, name: str, uid: str, node: str) -> None:
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    # _preload_content=False: the generated client cannot deserialise the Status this call returns.
    api.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)


def nudge_pod(
    api: client.CoreV1Api, namespace: str, name: str, uid: str, *, clock: Callable[[], float] = time.time
) -> None:
    """Stamp `vgpu.io/requeue` on a pending pod: a pod update, so kube-scheduler retries it (scheduler_extender.requeue).
    Raises ApiException 404 (gone) or 409 (recreated: the UID precondition failed) like any other error."""
    patch_pod_annotations(api, namespace=namespace, name=name, uid=uid, annotations={ann.POD_REQUEUE: f"{clock():.3f}"})


class KubeBinder:
    def __init__(self, api: client.CoreV1Api, *, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.clock = clock

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return get_pod(self.api, namespace=namespace, name=name)

    def write_assignment(self, *, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        patch_pod_annotations(
            self.api,
            namespace=namespace,
            name=name,
            uid=uid,
            annotations={
                ann.POD_ASSIGNMENT: ann.encode_assignment(assignment),
                ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
                ann.POD_BIND_TIME: f"{self.clock():.3f}",
            },
        )

    def bind(self, *, namespace: str, name: str, uid: str, node: str) -> None:
        create_binding(self.api, namespace=namespace, name=name, uid=uid, node=node)

    def mark_failed(self, *, namespace: str, name: str, uid: str, reason: str) -> None:
        patch_pod_annotations(
            self.api,
            namespace=namespace,
            name=name,
            uid=uid,
            annotations={ann.POD_ASSIGNMENT: None, ann.POD_BIND_PHASE: ann.BindPhase.FAILED.value},
        )


Handler = Callable[[str, dict[str, Any]], None]
Replacer = Callable[[list[dict[str, Any]]], None]


class Reflector:
    """List, then watch from the list's resourceVersion; relist on 410 Gone or any watch failure."""

    def __init__(
        self,
        *,
        name: str,
        list_call: Callable[..., Any],
        replace: Replacer,
        handle: Handler,
        field_selector: str | None = None,
        on_synced: Callable[[], None] = lambda: None,
        watch_timeout_s: int = 300,
    ) -> None:
        self.name = name
        self.list_call = list_call
        self.replace = replace
        self.handle = handle
        self.field_selector = field_selector
        self.on_synced = on_synced
        self.watch_timeout_s = watch_timeout_s
        self.stopped = threading.Event()
        self.relists = 0
        self._watch: watch.Watch | None = None

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    def _list(self) -> str:
        raw = _raw(self.list_call(_preload_content=False, **self._kwargs()))
        self.replace(list(raw.get("items") or []))
        self.relists += 1
        return str((raw.get("metadata") or {}).get("resourceVersion") or "")

    def run(self) -> None:
        backoff = 0.2
        while not self.stopped.is_set():
            try:
                rv = self._list()
                self.on_synced()
                backoff = 0.2
                while not self.stopped.is_set():
                    rv = self._watch_once(rv)
                    if not rv:
                        break  # 410: relist
            except Exception as exc:
                if self.stopped.is_set():
                    return
                log.warning("reflector error; relisting", extra={"reflector": self.name, "error": str(exc)})
                self.stopped.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _watch_once(self, rv: str) -> str:
        w = watch.Watch()
        self._watch = w
        stream = w.stream(
            self.list_call,
            resource_version=rv,
            timeout_seconds=self.watch_timeout_s,
            allow_watch_bookmarks=True,
            deserialize=False,
            **self._kwargs(),
        )
        for event in stream:
            if self.stopped.is_set():
                w.stop()
                return rv
            kind = event.get("type")
            obj = event.get("object") or event.get("raw_object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    log.info("watch expired (410); relisting", extra={"reflector": self.name})
                    return ""
                raise RuntimeError(f"watch error: {obj.get('message')}")
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if kind == "BOOKMARK":
                continue
            self.handle(str(kind), obj)
        return rv

    def stop(self) -> None:
        self.stopped.set()
        if self._watch is not None:
            self._watch.stop()
