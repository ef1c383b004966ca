"""The extender's verbs as plain methods: wire schema in, core call, wire schema out; and the watch feed.

One lock guards the cluster state and the parts that keep books on it: the reservations of binds in flight
(scheduler_extender.reservations), the pods /filter rejected (scheduler_extender.pending), what learning policies
are fed (scheduler_extender.learning). Filter and prioritize take it for a few milliseconds; bind takes it only to
reserve GPUs on fresh state and to settle the outcome, and does its apiserver I/O outside it, so concurrent binds
never over-commit a GPU and never wait on each other's network round trips.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler_extender import schema
from scheduler_extender.binder import Binder
from scheduler_extender.learning import Learning, seed_candidates
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.pending import Pending
from scheduler_extender.recent import RecentPods
from scheduler_extender.requeue import Requeuer
from scheduler_extender.reservations import Refused, Reservations
from scheduler_extender.sync import StateSync
from vgpu.annotations import Assignment
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo, bound_node, is_finished, pod_info, pod_key, pod_uid
from vgpu.state import ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    names: ResourceNames = ResourceNames()
    defaults: RequestDefaults = RequestDefaults()
    narrow_filter: bool = False
    bind_grace_s: float = 30.0
    # Arriving pods reach learning policies (fragaware) at most this often once they have a first picture
    # (scheduler_extender.learning): each relearn costs ~0.5 s a pod shape at 5,000 nodes, on the request path.
    relearn_interval_s: float = 60.0
    # The file source has no apiserver to read a pod from: /bind then takes the pod /filter last saw under that
    # namespace/name. Never with the kube source, where /bind reads the pod from the apiserver (docs/extender.md).
    pods_from_filter: bool = False


class BadRequest(ValueError):
    """The request body is well-formed JSON but not a valid extender call (-> HTTP 400)."""


class ExtenderService:
    def __init__(
        self,
        state: ClusterState,
        binder: Binder,
        *,
        options: ServiceOptions = ServiceOptions(),
        metrics: ExtenderMetrics | None = None,
        lock: threading.RLock | None = None,
        requeuer: Requeuer | None = None,
    ) -> None:
        self.state = state
        self.planner = Planner(state)
        self.binder = binder
        self.options = options
        self.metrics = metrics or ExtenderMetrics(state)
        self.lock = lock or threading.RLock()
        self.requeuer = requeuer  # no requeuer (the file source): rejected pods are counted, never nudged
        self.pending = Pending(requeuer, on_count=self.metrics.pending.set)
        self.learning = Learning(self.planner, relearn_interval_s=options.relearn_interval_s, metrics=self.metrics)
        self.recent = RecentPods(self._parse, keep_bodies=options.pods_from_filter)
        self.sync = StateSync(
            state,
            is_inflight=lambda key: key in self.reservations,  # made next; the sync only asks once events flow
            on_problem=self.metrics.problem,
            bind_grace_s=options.bind_grace_s,
        )
        self.reservations = Reservations(
            state, self.planner, self.sync, on_freed=self.pending.capacity_freed, on_count=self.metrics.inflight.set
        )
        self.ready = threading.Event()
        # Set while this replica may serve the verbs: always without leader election; with it, only while it leads
        # (scheduler_extender.leadership drives it through set_leading). `leader` names the holder for refusals.
        self.leading = threading.Event()
        self.leading.set()
        self.leader = ""

    def _parse(self, pod: Mapping[str, Any]) -> PodInfo:
        return pod_info(pod, self.options.names, self.options.defaults)

    # -- verbs ----------------------------------------------------------------------------------

    @staticmethod
    def _names(args: schema.ExtenderArgs, verb: str) -> tuple[list[str], list[dict[str, Any]] | None]:
        """The candidate node names, plus the node objects in the full-NodeList mode."""
        if args.NodeNames is not None:
            return list(args.NodeNames), None
        if args.Nodes is not None:
            items = args.Nodes.items
            return [str((n.get("metadata") or {}).get("name") or "") for n in items], items
        raise BadRequest(f"{verb}: the request carries neither Nodes nor NodeNames")

    def filter(self, args: schema.ExtenderArgs) -> dict[str, Any]:
        names, items = self._names(args, "filter")
        uid = pod_uid(args.Pod)
        self.recent.keep(args.Pod)
        first_time = self.learning.first_seen(uid)
        try:
            info = self.recent.parse(args.Pod)
            if info.request.is_empty:
                return schema.filter_result(
                    node_names=names if items is None else None, nodes=items, failed={}, unresolvable={}
                )
            with self.lock:
                if first_time:
                    self.learning.arrived(info)
                self.reservations.release_stale(info)
                evaluation = self.planner.evaluate(info, names)
                if self.options.narrow_filter:
                    evaluation = self.planner.narrow(evaluation)
                # Recorded under the same lock as the evaluation: a release right after it nudges this pod.
                self.pending.filtered(info.key, uid, fits=bool(evaluation.feasible))
        except (RequestError, UnknownPolicyError) as exc:  # the pod can never fit: say why on every node
            self.metrics.filter_failure("invalid-request")
            return schema.filter_result(
                node_names=[] if items is None else None,
                nodes=None if items is None else [],
                failed={},
                unresolvable=dict.fromkeys(names, str(exc)),
            )
        if not evaluation.feasible:
            self.metrics.filter_failure("no-fit")
        return _filter_result(names, items, evaluation)

    def prioritize(self, args: schema.ExtenderArgs) -> list[dict[str, Any]]:
        names, _ = self._names(args, "prioritize")
        try:
            info = self.recent.parse(args.Pod)
            if info.request.is_empty:
                return schema.host_priorities({})
            with self.lock:
                self.reservations.release_stale(info)
                prios = self.planner.priorities_for(info, names)
        except (RequestError, UnknownPolicyError):
            prios = {}
        return schema.host_priorities(prios)  # priorities_for only scores the nodes asked about

    def bind(self, args: schema.ExtenderBindingArgs) -> dict[str, str]:
        """Bind the pod the apiserver holds under PodNamespace/PodName, never a pod body a caller sent: the spec is
        read fresh (GET), the UID must match PodUID, and a pod that is bound already or holds a live assignment
        is refused with nothing changed (no assignment written or deleted, no slice freed)."""
        key = f"{args.PodNamespace}/{args.PodName}"
        started = time.perf_counter()
        try:
            pod = self._pod_to_bind(args, key)
            info = self._parse_to_bind(pod)
            with self.lock:
                assignment = self.reservations.reserve(key, args.Node, info)
        except Refused as exc:
            return self._bind_failed(key, args.Node, str(exc))
        uid = pod_uid(pod) or args.PodUID
        try:
            if assignment is not None:
                self.binder.write_assignment(
                    namespace=args.PodNamespace, name=args.PodName, uid=uid, assignment=assignment
                )
            self._bind_checked(args, uid)
        except Exception as exc:
            self._roll_back(args, uid, assignment, reason=str(exc))
            return self._bind_failed(key, args.Node, f"binding failed: {exc}")
        with self.lock:
            self.reservations.bound(key)
            self.pending.done(key)
        self.metrics.bound(time.perf_counter() - started)
        slices = [f"{d.uuid}:{d.memory_mib}MiB:{d.cores}%" for d in assignment.slices()] if assignment else []
        log.info("bound", extra={"pod": key, "node": args.Node, "slices": slices})
        return schema.binding_result()

    def _pod_to_bind(self, args: schema.ExtenderBindingArgs, key: str) -> dict[str, Any]:
        """The pod as the apiserver holds it now (the file source: as /filter last saw it). Raises Refused for a
        pod that is missing, was recreated under another UID or is bound already."""
        try:
            pod = self.binder.get_pod(namespace=args.PodNamespace, name=args.PodName)
        except Exception as exc:
            raise Refused(f"cannot read the pod from the apiserver: {exc}") from None
        if pod is None and self.recent.keep_bodies:
            pod = self.recent.body(key)
        if pod is None:
            raise Refused("pod not found")
        uid = pod_uid(pod)
        if args.PodUID and uid != args.PodUID:
            raise Refused(f"the pod's UID is {uid or 'unset'}, the bind names {args.PodUID}; refused")
        if bound_to := bound_node(pod):
            raise Refused(f"already bound to {bound_to}; a bound pod is never bound again")
        return pod

    def _parse_to_bind(self, pod: dict[str, Any]) -> PodInfo:
        try:
            return self._parse(pod)
        except (RequestError, UnknownPolicyError) as exc:
            raise Refused(str(exc)) from None

    def _bind_checked(self, args: schema.ExtenderBindingArgs, uid: str) -> None:
        """Create the Binding; on an error, look whether it landed anyway (a timed-out call may have)."""
        try:
            self.binder.bind(namespace=args.PodNamespace, name=args.PodName, uid=uid, node=args.Node)
        except Exception:
            try:
                pod = self.binder.get_pod(namespace=args.PodNamespace, name=args.PodName)
            except Exception:
                pod = None
            if pod is None or bound_node(pod) != args.Node:
                raise
            log.info("binding call failed but the pod is bound", extra={"pod": f"{args.PodNamespace}/{args.PodName}"})

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

    def expire_unbound(self) -> None:
        with self.lock:
            self.reservations.expire()

    # -- watch feed -----------------------------------------------------------------------------

    def node_event(self, kind: str, node: dict[str, Any]) -> None:
        name = str((node.get("metadata") or {}).get("name") or "")
        with self.lock:
            before = self.state.nodes.get(name)
            self.sync.node_event(kind, node)
            after = self.state.nodes.get(name)
            # A node joined or its GPUs or labels changed: the same race as a release (kube-scheduler may retry
            # a rejected pod on this Node event before we have read the new inventory), so nudge as for a release.
            if after is not None and after is not before:
                self.pending.capacity_freed()

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        with self.lock:
            held = key in self.state.assignments
            self.sync.pod_event(kind, pod)
            if kind == "DELETED" or is_finished(pod):
                self.learning.forget(pod_uid(pod))
            if kind == "DELETED" or bound_node(pod):
                self.pending.done(key)
            # Only a release nudges: the nudge's own MODIFIED event changes no state, so it never nudges again.
            if held and key not in self.state.assignments:
                self.pending.capacity_freed()

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            before = dict(self.state.nodes)
            self.sync.replace_nodes(nodes)
            if any(before.get(name) is not node for name, node in self.state.nodes.items()):
                self.pending.capacity_freed()  # new or changed nodes, as in node_event

    def replace_pods(self, pods: list[dict[str, Any]], *, seed_learning: bool = False) -> None:
        """Apply a pod list. `seed_learning` (the source's first list only, never a relist, which would count
        the pods twice): the running pods that hold our assignments also seed the placement policy's learned
        workload, so a restarted extender does not start placement from a cold start."""
        seed = seed_candidates(pods, self._parse) if seed_learning else None  # parsing needs no lock
        with self.lock:
            held = set(self.state.assignments)
            self.sync.replace_pods(pods)
            if not held <= self.state.assignments.keys():
                self.pending.capacity_freed()
            if seed is not None:
                self.learning.seed(*seed)
            else:
                self.learning.keep_only(pod_uid(p) for p in pods)

    # -- leadership (scheduler_extender.leadership.Replica) -------------------------------------

    def set_leading(self, leading: bool, *, leader: str = "") -> None:
        """Leader election moved: serve the verbs or refuse them (503) while another replica leads."""
        self.leader = leader
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self.leading.set()
        else:
            self.leading.clear()

    def leader_seen(self, holder: str) -> None:
        """The current holder of the lease, named in a standby's refusals."""
        self.leader = holder

    def seed_learning_from(self, pods: list[dict[str, Any]]) -> int:
        """Seed learning from running pods not seeded yet: a standby that takes over learns the pods the leader
        placed while it stood by (it never saw their /filter). Pods seeded before are skipped, so none counts twice."""
        candidates, skipped = seed_candidates(pods, self._parse)
        with self.lock:
            return self.learning.seed(candidates, skipped)


def _filter_result(names: list[str], items: list[dict[str, Any]] | None, evaluation: Evaluation) -> dict[str, Any]:
    """ExtenderFilterResult in the request's mode: node names, or the node objects kept in the full-NodeList mode."""
    feasible = evaluation.feasible
    if items is None:
        return schema.filter_result(
            node_names=[n for n in names if n in feasible],
            nodes=None,
            failed=evaluation.failed,
            unresolvable=evaluation.unresolvable,
        )
    kept = [n for n, name in zip(items, names, strict=True) if name in feasible]
    return schema.filter_result(
        node_names=None, nodes=kept, failed=evaluation.failed, unresolvable=evaluation.unresolvable
    )
