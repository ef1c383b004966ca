"""/bind: the pod as the apiserver holds it (the watch's latest version, else a GET), its slices reserved under the
state lock, then one apiserver write outside it: the Binding, conditional on the pod's UID and resourceVersion,
carrying the assignment annotations the apiserver copies onto the pod in the same update; then the reservation
settled (kept by the bound pod, freed, or held while the Binding's outcome is unknown).

What is refused (a pod bound already, holding a live assignment, recreated under another UID, no longer fitting)
is refused before anything changes: docs/extender.md, "Security".

Every bind runs against a deadline (scheduler_extender.deadline): kube-scheduler's extender httpTimeout, less a
margin for the answer's way back, and with leader election no later than the lease is surely ours. Its writes stop
early enough to leave `check_budget` for reading back a Binding that got no answer, so a bind answers, bound or
not, before kube-scheduler gives up on it (docs/extender.md, "Timeouts and deadlines").
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import orjson

from scheduler_extender import deadline, schema
from scheduler_extender.binder import Binder
from scheduler_extender.holds import SoftHolds
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.pending import Pending
from scheduler_extender.preempt import Held
from scheduler_extender.recent import RecentPods
from scheduler_extender.reservations import Refused, Reservations
from scheduler_extender.unbound_pods import UnboundPods
from vgpu import annotations as ann
from vgpu.annotations import Assignment
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.pod import PodInfo, bound_node, pod_uid

log = logging.getLogger(__name__)

# kube-scheduler's default extender httpTimeout: kubernetes v1.34 pkg/scheduler/extender.go, DefaultExtenderTimeout
# = 5 * time.Second, used by NewHTTPExtender when the profile's httpTimeout is 0; the http.Client's Timeout is it.
DEFAULT_HTTP_TIMEOUT_S = 5.0
# Left of the httpTimeout for the answer to travel back and be read by kube-scheduler.
ANSWER_MARGIN_S = 0.25


def check_budget(timeout_s: float) -> float:
    """What a bind keeps of its time for reading back a Binding that got no answer: one GET, at most a second."""
    return min(1.0, timeout_s / 5)


@dataclass(frozen=True, slots=True, kw_only=True)
class BindVerb:
    """What /bind works with; the service owns each part and shares `lock` with the other verbs."""

    binder: Binder
    lock: threading.RLock
    reservations: Reservations
    pending: Pending
    recent: RecentPods
    parse: Callable[[Mapping[str, Any]], PodInfo]
    metrics: ExtenderMetrics
    timeout_s: float = DEFAULT_HTTP_TIMEOUT_S  # kube-scheduler's extender httpTimeout
    # Until when (time.monotonic) this replica may still bind: with leader election, the end of its renew deadline;
    # a bind's calls end by then, so none lands after a standby could have taken the lease over.
    lease_until: Callable[[], float] = lambda: math.inf
    clock: Callable[[], float] = time.monotonic
    # The unbound pods as the watch delivered them (scheduler_extender.unbound_pods); none: every bind reads the pod.
    watched: UnboundPods | None = None
    # Where /prioritize expected pods to be bound (scheduler_extender.holds): a pod's hold ends when its bind starts.
    holds: SoftHolds | None = None
    # Pods that preempted for room hold it against lower-priority pods (scheduler_extender.preempt), here as at
    # /filter: a pod filtered just before a nomination became known must not bind into the room either.
    claims: Callable[[Mapping[str, Any], PodInfo], AbstractContextManager[Held]] | None = None
    # Told the UID of a pod this replica is about to bind, once the pod is read under it, under the lock
    # (scheduler_extender.learning.Learning.binding: the watch showing it bound must not feed learning again).
    binding: Callable[[str], None] | None = None

    def bind(self, args: schema.ExtenderBindingArgs) -> dict[str, str]:
        """Bind the pod the apiserver holds under PodNamespace/PodName, never a pod body a caller sent: the spec is
        the watch's latest version of the pod or read fresh (GET), the UID must match PodUID, the Binding is
        conditional on that version, and a pod that is bound already or holds a live assignment is refused with
        nothing changed (no assignment written or deleted, no slice freed)."""
        key = f"{args.PodNamespace}/{args.PodName}"
        started = time.perf_counter()
        now = self.clock()
        answer_by = now + self.timeout_s - ANSWER_MARGIN_S
        calls_by = min(answer_by - check_budget(self.timeout_s), self.lease_until())
        with self.lock:
            seen = self.watched.get(key) if self.watched is not None else None
        if calls_by - now < deadline.MIN_CALL_S:
            return self._bind_failed(key, args.Node, "this replica's lease ends before a bind could finish; refused")
        try:
            with deadline.within(calls_by):
                pod = self._pod_to_bind(args, key, seen)
            with self.lock:
                # The pod is the one named, under its UID: from here on the reservation, or kube-scheduler's next
                # attempt, decides, so its soft hold goes. A bind refused before this (no such pod, another UID)
                # leaves the real pod's hold: it is about to be bound there.
                if self.holds is not None:
                    self.holds.drop(key)
                if self.binding is not None:
                    self.binding(pod_uid(pod))
            info = self._parse_to_bind(pod)
            with self.lock:
                if self.claims is None or info.request.is_empty:
                    assignment = self.reservations.reserve(key, args.Node, info)
                else:
                    with self.claims(pod, info) as held:
                        if args.Node in held.closed:
                            raise Refused(held.closed[args.Node])
                        assignment = self.reservations.reserve(key, args.Node, info)
        except Refused as exc:
            return self._bind_failed(key, args.Node, str(exc))
        uid = pod_uid(pod) or args.PodUID
        try:
            self._send(args, key, uid, _version(pod), assignment, info, calls_by=calls_by, answer_by=answer_by)
        except BindOutcomeUnknown as exc:
            with self.lock:
                self.reservations.unsettled(key, uid, exc.version)
            return self._bind_failed(
                key,
                args.Node,
                f"binding outcome unknown: {exc}; its slices stay held until the pod shows bound, or, after "
                f"{self.reservations.sync.bind_grace_s:g} s, a write on its version makes sure the Binding cannot "
                "land any more",
            )
        except Exception as exc:
            # The Binding was refused, or never sent: nothing was written, so freeing the slices is all there is.
            with self.lock:
                self.reservations.roll_back(key, assignment)
            return self._bind_failed(key, args.Node, f"binding failed: {_describe(exc)}")
        with self.lock:
            self.reservations.bound(key)
            self.pending.done(key)
        self.metrics.bound(time.perf_counter() - started)
        slices = [f"{d.uuid}:{d.memory_mib}MiB:{d.cores}%" for d in assignment.slices()] if assignment else []
        log.info("bound", extra={"pod": key, "node": args.Node, "slices": slices})
        return schema.binding_result()

    def _pod_to_bind(self, args: schema.ExtenderBindingArgs, key: str, seen: dict[str, Any] | None) -> dict[str, Any]:
        """The pod as the apiserver holds it (`held_pod`); the file source: as /filter last saw it."""
        return held_pod(
            self.binder,
            seen,
            namespace=args.PodNamespace,
            name=args.PodName,
            uid=args.PodUID,
            verb="bind",
            fallback=(lambda: self.recent.body(key)) if self.recent.keep_bodies else None,
        )

    def _send(
        self,
        args: schema.ExtenderBindingArgs,
        key: str,
        uid: str,
        version: str,
        assignment: Assignment | None,
        info: PodInfo,
        *,
        calls_by: float,
        answer_by: float,
    ) -> None:
        """The Binding, on the version the pod was taken at. One the apiserver refuses with 409 (the watch was
        behind: kube-scheduler wrote the pod's status, the requeuer nudged it) is read once and sent again on the
        new version, if the pod still is the one reserved for: same UID, unbound, parsed the same. Anything else
        raises: PodChanged or the refusal (nothing was applied), BindOutcomeUnknown (it may still land)."""
        try:
            self._bind_checked(args, uid, version, assignment, calls_by=calls_by, answer_by=answer_by)
            return
        except BindOutcomeUnknown:
            raise
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
        try:
            with deadline.within(calls_by):
                fresh = self._pod_to_bind(args, key, None)
            changed = self._parse_to_bind(fresh) != info
        except Refused as exc:
            raise PodChanged(f"the pod changed while it was being bound: {exc}") from None
        if changed:
            raise PodChanged("the pod changed while it was being bound; kube-scheduler retries it")
        self._bind_checked(args, uid, _version(fresh), assignment, calls_by=calls_by, answer_by=answer_by)

    def _parse_to_bind(self, pod: dict[str, Any]) -> PodInfo:
        try:
            return self.parse(pod)
        except (RequestError, UnknownPolicyError) as exc:
            raise Refused(str(exc)) from None

    def _bind_checked(
        self,
        args: schema.ExtenderBindingArgs,
        uid: str,
        version: str,
        assignment: Assignment | None,
        *,
        calls_by: float,
        answer_by: float,
    ) -> None:
        """Create the Binding by `calls_by`; one that got no answer is read back (by `answer_by`): bound here with
        this assignment, it landed; unbound at another version, recreated, gone or bound otherwise, it never can;
        unbound at `version`, or unreadable, raises BindOutcomeUnknown: freeing its slices then lets the next pod
        onto a GPU this one may be running on (seen under apiserver overload by benchmarks/scale.py)."""
        ns, name = args.PodNamespace, args.PodName
        try:
            with deadline.within(calls_by):
                self.binder.bind(
                    namespace=ns, name=name, uid=uid, version=version, node=args.Node, assignment=assignment
                )
            return
        except Exception as exc:
            if not _may_still_land(exc):
                raise
            try:
                with deadline.within(answer_by):
                    pod = self.binder.get_pod(namespace=ns, name=name)
            except Exception as check:
                raise BindOutcomeUnknown(
                    f"{_describe(exc)}; reading the pod to see whether it landed failed too: {_describe(check)}",
                    version=version,
                ) from exc
            if pod is not None and pod_uid(pod) == uid and not bound_node(pod) and _may_apply_on(pod, version):
                raise BindOutcomeUnknown(
                    f"{_describe(exc)}; the pod reads unbound, but the Binding sent may still be applied",
                    version=version,
                ) from exc
            if pod is not None and bound_node(pod) == args.Node and _carries(pod, assignment):
                log.info("binding call failed but the pod is bound", extra={"pod": f"{ns}/{name}"})
                return
            raise

    def _bind_failed(self, key: str, node: str, reason: str) -> dict[str, str]:
        self.metrics.bind_failure()
        log.warning("bind failed", extra={"pod": key, "node": node, "reason": reason})
        return schema.binding_result(f"bind {key} to {node}: {reason}")


class NotHeld(Refused):
    """The apiserver holds no pod a verb may act for under the name it was given; `reason` names why, as a metric
    label: pod-missing, uid-mismatch, pod-bound, pod-deleting or read-failed."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def held_pod(
    binder: Binder,
    seen: dict[str, Any] | None,
    *,
    namespace: str,
    name: str,
    uid: str,
    verb: str,
    fallback: Callable[[], dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The pod as the apiserver holds it under namespace/name, never a body a caller sent: `seen`, the watch's latest
    version, when it carries `uid`, else read now with one GET (under the caller's deadline: scheduler_extender.
    deadline); `fallback` when the apiserver has none (the file source: the body /filter last saw). Raises NotHeld
    for a pod that cannot be read, is missing, carries another UID than `uid`, is bound already or is being deleted
    (docs/extender.md, "Security"), and for a call naming no UID: kube-scheduler always sends one (kubernetes
    pkg/scheduler/schedule_one.go `extendersBinding` builds the Binding with `UID: pod.UID`, and pkg/scheduler/
    extender.go `HTTPExtender.Bind` sends it as `PodUID: binding.UID`; read in the v1.25+ source, where
    `extendersBinding` lives in schedule_one.go), so without one "the pod's UID must equal PodUID" cannot hold and
    whatever pod has the name now would be bound."""
    if not uid:
        raise NotHeld(
            f"the {verb} names no pod UID (PodUID); the pod's UID must equal it, refused", reason="uid-mismatch"
        )
    pod = seen if seen is not None and pod_uid(seen) == uid else None
    if pod is None:
        try:
            pod = binder.get_pod(namespace=namespace, name=name)
        except Exception as exc:
            raise NotHeld(f"cannot read the pod from the apiserver: {exc}", reason="read-failed") from None
        if pod is None and fallback is not None:
            pod = fallback()
        if pod is None:
            raise NotHeld("pod not found", reason="pod-missing")
    held = pod_uid(pod)
    if held != uid:
        raise NotHeld(f"the pod's UID is {held or 'unset'}, the {verb} names {uid}; refused", reason="uid-mismatch")
    if bound_to := bound_node(pod):
        raise NotHeld(f"already bound to {bound_to}; a bound pod is never bound again", reason="pod-bound")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        raise NotHeld("the pod is being deleted", reason="pod-deleting")
    return pod


class PodChanged(Exception):
    """The pod's apiserver version is not the one the bind reserved for; the message says how."""


class BindOutcomeUnknown(Exception):
    """The Binding sent on `version` may or may not have landed; the message says what failed."""

    def __init__(self, message: str, *, version: str) -> None:
        super().__init__(message)
        self.version = version


def _version(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("resourceVersion") or "")


def _may_apply_on(pod: Mapping[str, Any], version: str) -> bool:
    """A Binding sent on `version` may still apply to this unbound pod: it is at that version (or either is unknown;
    one sent without a version precondition applies to any)."""
    now = _version(pod)
    return not version or not now or now == version


def _carries(pod: Mapping[str, Any], assignment: Assignment | None) -> bool:
    """The pod holds `assignment` (a Binding of this bind landed), or none was sent."""
    if assignment is None:
        return True
    held = ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.POD_ASSIGNMENT)
    return held == ann.encode_assignment(assignment)


def _may_still_land(exc: Exception) -> bool:
    """A call that got no HTTP answer (timeout, reset) may still be applied by the apiserver, and so may one it
    answered 504: its request timeout answers while the handler goes on (k8s.io/apiserver v0.34.4
    pkg/server/filters/timeout.go). So may a 500 that reports a storage timeout: etcd can commit a write whose
    client (the apiserver) gave up on it ("etcdserver: request timed out"). One refused with another status
    (409, 403, another 500, ...) was not, nor one whose deadline had passed before it was sent
    (scheduler_extender.deadline: "the call was not made")."""
    if isinstance(exc, deadline.DeadlineExceeded):
        return False
    status = getattr(exc, "status", None)
    if status == 500:
        return _reports_timeout(exc)
    return status in (None, 504)


_TIMEOUT_WORDS = ("timed out", "timeout", "deadline exceeded")


def _reports_timeout(exc: Exception) -> bool:
    """The apiserver's Status body names a timeout (reason ServerTimeout/Timeout, or the message says so)."""
    body = getattr(exc, "body", None)
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        status = orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    if status.get("reason") in ("ServerTimeout", "Timeout"):
        return True
    message = str(status.get("message") or text).lower()
    return any(word in message for word in _TIMEOUT_WORDS)


def _describe(exc: Exception) -> str:
    """A timeout says so (urllib3's text names only the pool), anything else as it reads."""
    if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
        return f"the apiserver did not answer within this bind's deadline ({exc})"
    return str(exc)
