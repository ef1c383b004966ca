"""/bind: the pod as the apiserver holds it (the watch's latest version, else a GET), its slices reserved under the
state lock, the assignment written and the Binding created outside it, each conditional on the pod's
resourceVersion, then the reservation settled (kept by a bound pod, or rolled back).

What is refused (a pod bound already, holding a live assignment, recreated under another UID, no longer fitting)
is refused before anything changes: docs/extender.md, "Security".

Every bind runs against a deadline (scheduler_extender.deadline): kube-scheduler's extender httpTimeout, less a
margin for the answer's way back, and with leader election no later than the lease is surely ours. Its apiserver
calls stop early enough to leave `rollback_s` for undoing them, so a bind answers, bound or rolled back, before
kube-scheduler gives up on it (docs/extender.md, "Timeouts and deadlines").
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from scheduler_extender import deadline, schema
from scheduler_extender.binder import Binder
from scheduler_extender.holds import SoftHolds
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.pending import Pending
from scheduler_extender.preempt import Held
from scheduler_extender.recent import RecentPods
from scheduler_extender.reservations import Refused, Reservations
from scheduler_extender.unbound_pods import UnboundPods
from vgpu.annotations import Assignment
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.pod import PodInfo, bound_node, pod_uid

log = logging.getLogger(__name__)

# kube-scheduler's default extender httpTimeout: kubernetes v1.34 pkg/scheduler/extender.go, DefaultExtenderTimeout
# = 5 * time.Second, used by NewHTTPExtender when the profile's httpTimeout is 0; the http.Client's Timeout is it.
DEFAULT_HTTP_TIMEOUT_S = 5.0
# Left of the httpTimeout for the answer to travel back and be read by kube-scheduler.
ANSWER_MARGIN_S = 0.25


def rollback_budget(timeout_s: float) -> float:
    """What a bind keeps of its time for undoing a failed write: one PATCH, at most a second."""
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

    def bind(self, args: schema.ExtenderBindingArgs) -> dict[str, str]:
        """Bind the pod the apiserver holds under PodNamespace/PodName, never a pod body a caller sent: the spec is
        the watch's latest version of the pod or read fresh (GET), the UID must match PodUID, the writes are
        conditional on that version, and a pod that is bound already or holds a live assignment is refused with
        nothing changed (no assignment written or deleted, no slice freed)."""
        key = f"{args.PodNamespace}/{args.PodName}"
        started = time.perf_counter()
        now = self.clock()
        answer_by = now + self.timeout_s - ANSWER_MARGIN_S
        calls_by = min(answer_by - rollback_budget(self.timeout_s), self.lease_until())
        with self.lock:
            if self.holds is not None:
                self.holds.drop(key)  # from here on the reservation, or kube-scheduler's next attempt, decides
            seen = self.watched.get(key) if self.watched is not None else None
        if calls_by - now < deadline.MIN_CALL_S:
            return self._bind_failed(key, args.Node, "this replica's lease ends before a bind could finish; refused")
        try:
            with deadline.within(calls_by):
                pod, watched = self._pod_to_bind(args, key, seen)
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
            with deadline.within(calls_by):
                if assignment is not None:
                    self._write_assignment(args, key, uid, assignment, info, watched=watched)
                self._bind_checked(args, uid)
        except BindOutcomeUnknown as exc:
            with self.lock:
                self.reservations.unsettled(key, uid)
            return self._bind_failed(
                key,
                args.Node,
                f"binding outcome unknown: {exc}; its slices stay held until the pod shows bound, or, after "
                f"{self.reservations.sync.bind_grace_s:g} s, a write on its version makes sure the Binding cannot "
                "land any more",
            )
        except Exception as exc:
            with deadline.within(min(answer_by, calls_by + rollback_budget(self.timeout_s))):
                self._roll_back(args, uid, assignment, reason=str(exc))
            return self._bind_failed(key, args.Node, f"binding failed: {_describe(exc)}")
        with self.lock:
            self.reservations.bound(key)
            self.pending.done(key)
        self.metrics.bound(time.perf_counter() - started)
        slices = [f"{d.uuid}:{d.memory_mib}MiB:{d.cores}%" for d in assignment.slices()] if assignment else []
        log.info("bound", extra={"pod": key, "node": args.Node, "slices": slices})
        return schema.binding_result()

    def _pod_to_bind(
        self, args: schema.ExtenderBindingArgs, key: str, seen: dict[str, Any] | None
    ) -> tuple[dict[str, Any], bool]:
        """The pod as the apiserver holds it: `seen`, the watch's latest version, when it carries the UID the bind
        names (True), else read now (the file source: as /filter last saw it). Raises Refused for a pod that is
        missing, was recreated under another UID or is bound already."""
        if seen is not None and args.PodUID and pod_uid(seen) == args.PodUID:
            self.binder.known(namespace=args.PodNamespace, name=args.PodName, pod=seen)
            return self._check_to_bind(args, seen), True
        return self._check_to_bind(args, self._read_pod(args, key)), False

    def _read_pod(self, args: schema.ExtenderBindingArgs, key: str) -> dict[str, Any]:
        try:
            pod = self.binder.get_pod(namespace=args.PodNamespace, name=args.PodName)
        except Exception as exc:
            raise Refused(f"cannot read the pod from the apiserver: {exc}") from None
        if pod is None and self.recent.keep_bodies:
            pod = self.recent.body(key)
        if pod is None:
            raise Refused("pod not found")
        return pod

    def _check_to_bind(self, args: schema.ExtenderBindingArgs, pod: dict[str, Any]) -> dict[str, Any]:
        uid = pod_uid(pod)
        if args.PodUID and uid != args.PodUID:
            raise Refused(f"the pod's UID is {uid or 'unset'}, the bind names {args.PodUID}; refused")
        if bound_to := bound_node(pod):
            raise Refused(f"already bound to {bound_to}; a bound pod is never bound again")
        return pod

    def _write_assignment(
        self,
        args: schema.ExtenderBindingArgs,
        key: str,
        uid: str,
        assignment: Assignment,
        info: PodInfo,
        *,
        watched: bool,
    ) -> None:
        """PATCH the assignment on the version the pod was taken at. A watched version the apiserver has moved past
        (409: kube-scheduler wrote the pod's status, the requeuer nudged it) is read once and the write repeated
        on the new version, if the pod still is the one reserved for: same UID, unbound, parsed the same. Anything
        else raises, and the bind rolls back."""
        write = functools.partial(
            self.binder.write_assignment, namespace=args.PodNamespace, name=args.PodName, uid=uid, assignment=assignment
        )
        try:
            write()
            return
        except Exception as exc:
            if not watched or getattr(exc, "status", None) != 409:
                raise
        try:
            fresh = self._check_to_bind(args, self._read_pod(args, key))
            changed = self._parse_to_bind(fresh) != info
        except Refused as exc:
            raise PodChanged(f"the pod changed while it was being bound: {exc}") from None
        if changed:
            raise PodChanged("the pod changed while it was being bound; kube-scheduler retries it")
        write()

    def _parse_to_bind(self, pod: dict[str, Any]) -> PodInfo:
        try:
            return self.parse(pod)
        except (RequestError, UnknownPolicyError) as exc:
            raise Refused(str(exc)) from None

    def _bind_checked(self, args: schema.ExtenderBindingArgs, uid: str) -> None:
        """Create the Binding; on an error, look whether it landed anyway (a timed-out call may have). Raises
        BindOutcomeUnknown when it may have landed unseen: freeing its slices then lets the next pod onto a GPU
        this one may be running on (seen under apiserver overload by benchmarks/scale.py)."""
        try:
            self.binder.bind(namespace=args.PodNamespace, name=args.PodName, uid=uid, node=args.Node)
        except Exception as exc:
            try:
                pod = self.binder.get_pod(namespace=args.PodNamespace, name=args.PodName)
            except Exception as check:
                raise BindOutcomeUnknown(
                    f"{_describe(exc)}; reading the pod to see whether it landed failed too: {_describe(check)}"
                ) from exc
            if pod is not None and bound_node(pod) == args.Node:
                log.info(
                    "binding call failed but the pod is bound", extra={"pod": f"{args.PodNamespace}/{args.PodName}"}
                )
                return
            if pod is not None and not bound_node(pod) and _may_still_land(exc):
                raise BindOutcomeUnknown(
                    f"{_describe(exc)}; the pod reads unbound, but the Binding sent may still be applied"
                ) from exc
            raise

    def _roll_back(
        self, args: schema.ExtenderBindingArgs, uid: str, assignment: Assignment | None, *, reason: str
    ) -> None:
        """Free what the failed bind held, then (best effort, outside the lock) mark its written assignment failed."""
        key = f"{args.PodNamespace}/{args.PodName}"
        with self.lock:
            self.reservations.roll_back(key, assignment)
        if assignment is None:
            return
        try:
            self.binder.mark_failed(namespace=args.PodNamespace, name=args.PodName, uid=uid, reason=reason)
        except Exception as exc:
            log.warning("could not mark assignment failed", extra={"pod": key, "error": str(exc)})

    def _bind_failed(self, key: str, node: str, reason: str) -> dict[str, str]:
        self.metrics.bind_failure()
        log.warning("bind failed", extra={"pod": key, "node": node, "reason": reason})
        return schema.binding_result(f"bind {key} to {node}: {reason}")


class PodChanged(Exception):
    """The pod's apiserver version is not the one the bind reserved for; the message says how."""


class BindOutcomeUnknown(Exception):
    """The Binding may or may not have landed; the message says what failed."""


def _may_still_land(exc: Exception) -> bool:
    """A call that got no HTTP answer (timeout, reset) may still be applied by the apiserver; one refused with a
    status (409, 403, ...) was not."""
    return getattr(exc, "status", None) is None


def _describe(exc: Exception) -> str:
    """A timeout says so (urllib3's text names only the pool), anything else as it reads."""
    if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
        return f"the apiserver did not answer within this bind's deadline ({exc})"
    return str(exc)
