"""The only module that talks to the apiserver: reads, annotation patches, bindings, list+watch.

Functions take the API object and keyword-only arguments; nothing here holds a global client.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from scheduler_extender import assignment_memo
from scheduler_extender.deadline import remaining
from scheduler_extender.gcpause import paused_gc
from scheduler_extender.leader import Conflict, LeaseRecord
from scheduler_extender.threadnames import name_os_thread
from vgpu import annotations as ann
from vgpu.annotations import Assignment

log = logging.getLogger(__name__)

ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"

# The typed client other modules annotate with, so that only this module imports `kubernetes`
# (the import-linter contract in pyproject.toml; sources/kube.py and main.py are the other adapters).
CoreApi = client.CoreV1Api

# Connections kept to the apiserver. The client's default is cpu_count * 5 (kubernetes-client 37.0.2,
# kubernetes/client/configuration.py, connection_pool_maxsize), 10 on two cores; binds run on up to 32 threads
# (scheduler_extender.app.BIND_THREADS) next to two watches, the requeuer, the election and /preempt's PDB list, so
# under load every bind past the tenth opened a new TLS connection and urllib3 threw it away afterwards ("Connection
# pool is full, discarding connection"): handshakes were the bind's largest CPU cost in benchmarks/scale.py.
POOL_SIZE = 48


def core_api() -> client.CoreV1Api:
    """CoreV1Api on the default configuration (load_kube_config / load_incluster_config), its pool sized POOL_SIZE,
    each request's head and body sent in one write (`one_write_pools`)."""
    conf = client.Configuration.get_default_copy()
    conf.connection_pool_maxsize = POOL_SIZE
    api = client.ApiClient(conf)
    one_write_pools(api)
    return client.CoreV1Api(api)


class _OneWrite:
    """A request's head and its bytes body in one `send`. urllib3 2.x (`HTTPConnection.request`, urllib3/connection.py)
    sends the head (http.client's `_send_output`: one `send`) and then each body chunk apart: two TLS records and two
    `sendall` calls for every Binding (`post_json`'s body is bytes), and two reads for the apiserver. Here the head is
    held until the body's one chunk comes and both go out together; in-process over TLS to a local server a bind's CPU
    on its thread was 388-439 against 407-536 us (four interleaved pairs of 3 x 1,000). A request without a bytes body
    (GET, watch, the client's own calls, which send text) is sent as urllib3 sends it. The bytes sent are the same."""

    _held_head: bytes | None = None
    _one_body: bytes | None = None

    def request(  # urllib3.connection.HTTPConnection.request, same arguments
        self, method: str, url: str, body: Any = None, headers: Any = None, **kwargs: Any
    ) -> None:
        self._one_body = body if isinstance(body, bytes) and body and not kwargs.get("chunked") else None
        sent = False
        try:
            super().request(method, url, body=body, headers=headers, **kwargs)  # type: ignore[misc]
            sent = True
        finally:
            head, self._held_head, self._one_body = self._held_head, None, None
            if head is not None and sent:  # no body chunk came after all: the head alone
                super().send(head)  # type: ignore[misc]

    def send(self, data: Any) -> None:
        body = self._one_body
        if body is not None:
            if self._held_head is None:
                self._held_head = bytes(data)  # the head: _send_output's one send
                return
            head, self._held_head, self._one_body = self._held_head, None, None
            if data is body:  # urllib3 sends a bytes body as itself (urllib3/util/request.py body_to_chunks)
                data = head + body
            else:
                super().send(head)  # type: ignore[misc]
        super().send(data)  # type: ignore[misc]


class _OneWriteHTTPConnection(_OneWrite, urllib3.connection.HTTPConnection):
    pass


class _OneWriteHTTPSConnection(_OneWrite, urllib3.connection.HTTPSConnection):
    pass


class _OneWriteHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _OneWriteHTTPConnection


class _OneWriteHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _OneWriteHTTPSConnection


def one_write_pools(api: client.ApiClient) -> None:
    """The client's pool manager makes its pools of `_OneWrite` connections (a proxy manager is left as it is)."""
    manager = api.rest_client.pool_manager
    if type(manager) is urllib3.PoolManager:
        manager.pool_classes_by_scheme = {"http": _OneWriteHTTPPool, "https": _OneWriteHTTPSPool}


@dataclass(frozen=True, slots=True)
class CallTimeouts:
    """Timeouts of the apiserver calls (settings `apiserver_*_seconds`, docs/extender.md "Timeouts and deadlines").

    Every call carries `_request_timeout`: urllib3's (connect, read) timeouts, the read one per socket read. Inside a
    request's deadline (scheduler_extender.deadline) a call gets what is left of it, at most `call_s`; otherwise
    `call_s`. Lists (the reflectors' relists, the pods a new leader learns from) read every active pod: `list_s`.
    Watches: the apiserver ends each after `timeoutSeconds` (Reflector.watch_timeout_s); the client gives up on a
    watch that sent nothing (not even a bookmark) for `watch_read_slack_s` longer, so a dropped connection that
    never closed is noticed instead of blocking the reflector forever.
    """

    call_s: float = 10.0
    connect_s: float = 3.0
    list_s: float = 60.0
    watch_read_slack_s: float = 30.0


_timeouts = CallTimeouts()


def configure_timeouts(timeouts: CallTimeouts) -> None:
    """Set once by main, before the first call, from the settings; the defaults hold until then (tests, tools)."""
    global _timeouts
    _timeouts = timeouts


def call_timeouts() -> CallTimeouts:
    return _timeouts


def _timeout(default_s: float | None = None) -> tuple[float, float]:
    """(connect, read) for the next call: the request's remaining deadline, or `default_s` (the call timeout)."""
    t = _timeouts
    left = remaining(t.call_s if default_s is None else default_s)
    return (min(t.connect_s, left), left)


def _version(raw: dict[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("resourceVersion") or "")


def _raw(resp: Any) -> dict[str, Any]:
    data = resp.data if hasattr(resp, "data") else resp.read()
    out: dict[str, Any] = orjson.loads(data)
    return out


def _done(resp: Any) -> None:
    """Read an answer nothing looks at to its end, so its connection goes back to the pool. A raw response
    (`_preload_content=False`) keeps its connection until its body is read (urllib3 2.x, urllib3/response.py
    `HTTPResponse.read` releases it once the body is complete): one left unread is dropped with the object, and the
    next call opens a new TLS connection - a handshake per bind, for the extender and the apiserver alike
    (benchmarks/scale.py). The call succeeded (its status said so); a body that cannot be read closes the
    connection instead."""
    with contextlib.suppress(Exception):  # the status already answered the call; urllib3 closes a broken connection
        resp.read()
    resp.release_conn()


def get_pod(api: client.CoreV1Api, *, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _raw(api.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=_timeout()))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_pod_annotations(
    api: client.CoreV1Api,
    *,
    namespace: str,
    name: str,
    uid: str,
    annotations: dict[str, str | None],
    resource_version: str = "",
) -> str:
    """Merge-patch annotations (None deletes a key); the UID guards against a recreated pod, a resourceVersion
    (when given) against any change since it was read: a late write then fails with 409 instead of overwriting
    newer state. Returns the pod's resourceVersion after the patch."""
    metadata: dict[str, Any] = {"annotations": annotations}
    if uid:
        metadata["uid"] = uid
    if resource_version:
        metadata["resourceVersion"] = resource_version
    resp = api.patch_namespaced_pod(
        name, namespace, {"metadata": metadata}, _preload_content=False, _request_timeout=_timeout()
    )
    return _version(_raw(resp))


def create_binding(
    api: client.CoreV1Api,
    *,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    resource_version: str = "",
    annotations: dict[str, str] | None = None,
) -> None:
    """POST pods/binding, carrying `annotations` for the pod. What the apiserver does with it (k8s.io/kubernetes
    v1.34.4 pkg/registry/core/pod/storage/storage.go, BindingREST.Create -> assignPod -> setPodNodeAndMetadata):

    - metadata.uid and metadata.resourceVersion are kept from the request
      (PreserveRequestObjectMetaSystemFieldsOnSubresourceCreate) and become storage.Preconditions of the pod's
      GuaranteedUpdate, checked against etcd's current pod (a stale cached copy is read again first: k8s.io/apiserver
      v0.34.4 pkg/storage/etcd3/store.go). A mismatch is InvalidObj, which storeerr.InterpretUpdateError answers
      409 Conflict; so are a pod bound already, one being deleted and one with scheduling gates (assignPod turns
      any error without a status into a Conflict). A late Binding therefore never binds a pod that changed.
    - In the same update: spec.nodeName, the PodScheduled condition, and every annotation of the Binding set on
      the pod (added or overwritten; none removed). Its labels are copied only with the feature gate
      PodTopologyLabelsAdmission (alpha, off by default in 1.34; pkg/features/kube_features.go), so the assignment
      travels as annotations only. Admission sees a CREATE of pods/binding, not a pod UPDATE: the admission
      policy vgpu-binding-protocol (deploy/manifests/admission-policy.yaml) guards these keys there.
    """
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    if resource_version:
        metadata["resourceVersion"] = resource_version
    if annotations:
        metadata["annotations"] = annotations
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    post_json(api, f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding", body)


def post_json(api: client.CoreV1Api, path: str, body: dict[str, Any]) -> None:
    """POST `body` as JSON to `path` on the client's own connection pool, its answer read and the connection
    released (`_done`); a status outside 2xx raises the ApiException subclass the client's call raises.

    Not the generated `create_namespaced_pod_binding`: kubernetes-client 37.0.2 validates every argument with
    pydantic (`validate_call`, the body into a V1Binding model), serialises it back through
    `sanitize_for_serialization` and the standard library's json, and builds its headers per call - about a
    millisecond a bind on the bind thread (benchmarks/scale.py). What the call sends is kept
    (kubernetes/client/api_client.py `param_serialize`, rest.py `RESTClientObject.request`, api/core_v1_api.py
    `_create_namespaced_pod_binding_serialize`): the configured host, the client's default headers (User-Agent),
    its BearerToken auth (refreshed by the configuration as before), Accept JSON, (connect, read) timeouts, and an
    SSLError answered as ApiException(status=0); Content-Type JSON is said, where the generated call left it out."""
    ac = api.api_client
    headers: dict[str, str] = {
        **ac.default_headers,
        "Accept": "application/json",
        "Content-Type": "application/json",
    }
    if ac.cookie:
        headers["Cookie"] = ac.cookie
    ac.update_params_for_auth(headers, [], ["BearerToken"], path, "POST", body)
    connect, read = _timeout()
    try:
        raw = ac.rest_client.pool_manager.request(
            "POST",
            ac.configuration.host + path,
            body=orjson.dumps(body),
            timeout=urllib3.Timeout(connect=connect, read=read),
            headers=headers,
            preload_content=False,
        )
    except urllib3.exceptions.SSLError as exc:
        raise ApiException(status=0, reason=f"{type(exc).__name__}\n{exc}") from None
    if not 200 <= raw.status <= 299:
        resp = RESTResponse(raw)
        try:
            resp.read()
        finally:
            raw.release_conn()
        ApiException.from_response(http_resp=resp, body=None, data=None)  # raises
    _done(raw)


def nudge_pod(
    api: client.CoreV1Api, namespace: str, name: str, uid: str, *, clock: Callable[[], float] = time.time
) -> None:
    """Stamp `vgpu.io/requeue` on a pending pod: a pod update, so kube-scheduler retries it (scheduler_extender.requeue).
    Raises ApiException 404 (gone) or 409 (recreated: the UID precondition failed) like any other error."""
    patch_pod_annotations(api, namespace=namespace, name=name, uid=uid, annotations={ann.POD_REQUEUE: f"{clock():.3f}"})


class KubeBinder:
    """The Binder over the apiserver: one Binding per bind, carrying the assignment, conditional on the UID and
    resourceVersion /bind took the pod at; a fence is a PATCH conditional on the version a lost Binding was sent on.
    Holds no state: the versions travel with the calls."""

    def __init__(self, api: client.CoreV1Api, *, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.clock = clock

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return get_pod(self.api, namespace=namespace, name=name)

    def bind(
        self, *, namespace: str, name: str, uid: str, version: str, node: str, assignment: Assignment | None
    ) -> None:
        annotations = None
        if assignment is not None:
            annotations = {
                # remembered: the pod watch's event of this Binding then finds the text decoded
                ann.POD_ASSIGNMENT: assignment_memo.encode(assignment),
                ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
                ann.POD_BIND_TIME: f"{self.clock():.3f}",
            }
        create_binding(
            self.api,
            namespace=namespace,
            name=name,
            uid=uid,
            node=node,
            resource_version=version,
            annotations=annotations,
        )

    def fence(self, *, namespace: str, name: str, uid: str, version: str) -> bool:
        """Make sure a Binding whose outcome is unknown can no longer land: it was sent conditional on `version`, so
        a write that moves the pod past that version fences it (it records the failure: bind phase failed, no
        assignment). A 409 reads the pod: bound with an assignment means it landed (False: the Binding carries one);
        bound without, unbound at another version, recreated or gone means it never can (True). A failed call
        raises."""
        annotations: dict[str, str | None] = {ann.POD_ASSIGNMENT: None, ann.POD_BIND_PHASE: ann.BindPhase.FAILED.value}
        if version:
            try:
                patch_pod_annotations(
                    self.api, namespace=namespace, name=name, uid=uid, annotations=annotations, resource_version=version
                )
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return True
                if exc.status != 409:
                    raise
        pod = get_pod(self.api, namespace=namespace, name=name)
        if pod is not None and (not uid or (pod.get("metadata") or {}).get("uid") == uid):
            if (pod.get("spec") or {}).get("nodeName"):
                # Bound by someone else (no assignment): holding the slices for it would hold them for good.
                return not ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.POD_ASSIGNMENT)
            if not version:  # the Binding's version is unknown: move the unbound pod past any (a 409 raises)
                patch_pod_annotations(
                    self.api,
                    namespace=namespace,
                    name=name,
                    uid=uid,
                    annotations=annotations,
                    resource_version=_version(pod),
                )
        return True


def list_all(
    list_call: Callable[..., Any],
    *,
    field_selector: str | None = None,
    page_size: int = 0,
    slim: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Every object and the list's resourceVersion, read in pages of `page_size` (0: one response), each object
    through `slim`: only one page of whole objects is held at a time. The pages after the first read the first
    one's snapshot (the `continue` token carries its resourceVersion); an expired token (410) raises ApiException
    and the caller lists anew."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        kwargs: dict[str, Any] = {"field_selector": field_selector} if field_selector else {}
        if page_size:
            kwargs["limit"] = page_size
        if token:
            kwargs["_continue"] = token
        raw = _raw(list_call(_preload_content=False, _request_timeout=_timeout(_timeouts.list_s), **kwargs))
        page = raw.pop("items", None) or []
        items.extend(page if slim is None else map(slim, page))
        del page
        meta = raw.get("metadata") or {}
        token = str(meta.get("continue") or "")
        if not token:
            return items, str(meta.get("resourceVersion") or "")


def list_pdbs() -> list[dict[str, Any]]:
    """Every PodDisruptionBudget (policy/v1), for the preempt verb; called only when kube-scheduler preempts."""
    api = client.PolicyV1Api()
    items: list[dict[str, Any]] = (
        _raw(
            api.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False, _request_timeout=_timeout(_timeouts.list_s)
            )
        ).get("items")
        or []
    )
    return items


def mark_leader(api: client.CoreV1Api, *, namespace: str, name: str, leading: bool) -> None:
    """Set (or remove) `vgpu.io/extender-leader=true` on the extender's own pod: the Service selects it."""
    labels = {ann.EXTENDER_LEADER_LABEL: "true" if leading else None}
    _done(
        api.patch_namespaced_pod(
            name, namespace, {"metadata": {"labels": labels}}, _preload_content=False, _request_timeout=_timeout()
        )
    )


def clear_other_leader_labels(api: client.CoreV1Api, *, namespace: str, own: str) -> list[str]:
    """Remove `vgpu.io/extender-leader` from every other pod in the namespace: a leader that crashed leaves it
    behind until its container restarts. Returns the pods cleared."""
    raw = _raw(
        api.list_namespaced_pod(
            namespace,
            label_selector=f"{ann.EXTENDER_LEADER_LABEL}=true",
            _preload_content=False,
            _request_timeout=_timeout(),
        )
    )
    names = [str(p["metadata"]["name"]) for p in raw.get("items") or [] if p["metadata"]["name"] != own]
    for name in names:
        mark_leader(api, namespace=namespace, name=name, leading=False)
    return names


def _micro_time(t: dt.datetime | None) -> str | None:
    """A Lease's MicroTime: RFC 3339 with exactly six fractional digits, as the apiserver parses it."""
    return None if t is None else t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(s: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None


class KubeLeaseStore:
    """A `coordination.k8s.io/v1` Lease as the leader election's record; updates carry the resourceVersion, so a
    concurrent writer gets a 409, which becomes `Conflict`."""

    def __init__(self, api: client.CoordinationV1Api, *, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    def _record(self, raw: dict[str, Any]) -> LeaseRecord:
        spec = raw.get("spec") or {}
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_parse_time(spec.get("acquireTime")),
            renew_time=_parse_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
            version=str((raw.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def _body(self, r: LeaseRecord) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if r.version:
            meta["resourceVersion"] = r.version
        spec = {
            "holderIdentity": r.holder,
            "leaseDurationSeconds": r.duration_s,
            "acquireTime": _micro_time(r.acquire_time),
            "renewTime": _micro_time(r.renew_time),
            "leaseTransitions": r.transitions,
        }
        # A plain dict, not a V1Lease: the client writes datetime.isoformat(), which drops the fraction when it is zero,
        # and the apiserver parses MicroTime with exactly six fractional digits.
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def get(self) -> LeaseRecord | None:
        try:
            return self._record(
                _raw(
                    self.api.read_namespaced_lease(
                        self.name, self.namespace, _preload_content=False, _request_timeout=_timeout()
                    )
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, record: LeaseRecord) -> LeaseRecord:
        try:
            body = self._body(replace(record, version=""))
            raw = self.api.create_namespaced_lease(
                self.namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
                _request_timeout=_timeout(),
            )
            return self._record(_raw(raw))
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"lease {self.namespace}/{self.name} exists already") from None
            raise

    def update(self, record: LeaseRecord) -> LeaseRecord:
        try:
            body = self._body(record)
            raw = self.api.replace_namespaced_lease(
                self.name,
                self.namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
                _request_timeout=_timeout(),
            )
            return self._record(_raw(raw))
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"lease {self.namespace}/{self.name} changed since it was read") from None
            raise


# Bytes asked of the socket per read of a watch; a chunk of the chunked response is handed over as it arrives.
_WATCH_READ = 64 * 1024

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
        page_size: int = 0,
        slim: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.name = name
        self.list_call = list_call
        self.replace = replace
        self.handle = handle
        self.field_selector = field_selector
        self.on_synced = on_synced
        self.watch_timeout_s = watch_timeout_s
        # A list is read in pages of `page_size` (0: one response) and each listed object goes through `slim`, so
        # only one page of whole objects is held at a time (benchmarks/restart.py, 40k pods); so does each watch
        # event's object.
        self.page_size = page_size
        self.slim = slim
        self.stopped = threading.Event()
        self.relists = 0
        # When (time.monotonic) the list `replace` is handed was read: it is applied seconds later at 40k pods, and
        # what happened since is not in it (ExtenderService.replace_pods' `listed_at`).
        self.list_started: float | None = None

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    def _list(self) -> str:
        with paused_gc():  # scheduler_extender.gcpause: a large list is parsed and applied twice as fast
            self.list_started = time.monotonic()
            items, rv = list_all(
                self.list_call, field_selector=self.field_selector, page_size=self.page_size, slim=self.slim
            )
            self.replace(items)
            del items
        self.relists += 1
        return rv

    def run(self) -> None:
        name_os_thread()  # benchmarks/scale.py splits the CPU by thread
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
        """One watch from `rv`, read as raw JSON lines decoded by orjson: the client's Watch.stream splits lines in
        Python and decodes each with the standard library's json (kubernetes-client 37.0.2, kubernetes/watch/
        watch.py, iter_resp_lines and unmarshal_event), about half the watch thread's CPU in benchmarks/scale.py,
        on the thread that competes with the verbs for the GIL. Returns the last resourceVersion, "" on 410 Gone."""
        resp = self.list_call(
            watch=True,
            resource_version=rv,
            timeout_seconds=self.watch_timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            # The client's read timeout outlasts the server's: a silent, half-dead connection still ends.
            _request_timeout=(_timeouts.connect_s, self.watch_timeout_s + _timeouts.watch_read_slack_s),
            **self._kwargs(),
        )
        try:
            pending = b""
            for chunk in resp.stream(_WATCH_READ, decode_content=False):
                if self.stopped.is_set():
                    return rv
                pending += chunk
                if b"\n" not in chunk:
                    continue
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            log.info("watch expired (410); relisting", extra={"reflector": self.name})
                            return ""
                        raise RuntimeError(f"watch error: {obj.get('message')}")
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind == "BOOKMARK":
                        continue
                    # What a list keeps of an object, an event keeps too: the handlers read the same fields either
                    # way, and what they hold on to (the unbound pods /bind takes, the preemption books) no longer
                    # carries each pod's managedFields (~40 nested objects a pod) for the collector to walk.
                    self.handle(str(kind), obj if self.slim is None else self.slim(obj))
            return rv
        finally:
            resp.close()  # a watch left mid-stream must not go back to the pool with unread bytes on it
            resp.release_conn()

    def stop(self) -> None:
        """The watch loop ends at its next chunk (or the server's timeoutSeconds), as the client's Watch.stop did."""
        self.stopped.set()


def lease_store(*, namespace: str, name: str) -> KubeLeaseStore:
    """The election's Lease through the default client configuration (set up by main)."""
    return KubeLeaseStore(client.CoordinationV1Api(), namespace=namespace, name=name)
