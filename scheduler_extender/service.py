"""The extender's verbs as plain methods: wire schema in, core call, wire schema out.

One lock guards the cluster state. Filter and prioritize take it for a few milliseconds; bind takes
it only to choose GPUs on fresh state and reserve them, and does its apiserver I/O outside it — so
concurrent binds never over-commit a GPU and never wait on each other's network round trips.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduler_extender import schema
from scheduler_extender.binder import Binder
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.requeue import Requeuer
from scheduler_extender.sync import TERMINAL_PHASES, StateSync, pod_key
from vgpu import annotations as ann
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import CapacityError, RequestError, UnknownPolicyError
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.state import ClusterState

log = logging.getLogger(__name__)

_RECENT_PODS = 4096


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    names: ResourceNames = ResourceNames()
    defaults: RequestDefaults = RequestDefaults()
    narrow_filter: bool = False
    bind_grace_s: float = 30.0
    # Arriving pods reach learning policies (fragaware) in batches at most this often once it has a
    # first picture (LEARN_BOOTSTRAP pods): each relearn re-scores every node once for every active pod
    # shape (~0.5 s a shape at 5,000 nodes, on the request path), so it is kept to once a minute.
    relearn_interval_s: float = 60.0
    # The file source has no apiserver to read a pod from: /bind then takes the pod /filter last saw under that
    # namespace/name. Never with the kube source, where /bind reads the pod from the apiserver (docs/extender.md).
    pods_from_filter: bool = False


LEARN_BOOTSTRAP = 16


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
        self.inflight: set[str] = set()
        self.sync = StateSync(
            state,
            is_inflight=self.inflight.__contains__,
            on_problem=self.metrics.problem,
            bind_grace_s=options.bind_grace_s,
        )
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._parsed: dict[str, tuple[dict[str, Any], PodInfo]] = {}  # UID -> the pod last parsed, its parse
        self._filtered: OrderedDict[str, dict[str, Any]] = OrderedDict()  # key -> pod; only with pods_from_filter
        self.ready = threading.Event()
        # Set while this replica may serve the verbs: always without leader election; with it, only while it leads
        # (scheduler_extender.leader). `leader` names the holder for a standby's refusals.
        self.leading = threading.Event()
        self.leading.set()
        self.leader = ""
        # Pods whose last /filter found no node: key -> UID, oldest first. When capacity frees the requeuer nudges
        # them so kube-scheduler retries them (scheduler_extender.requeue); no requeuer (the file source): no nudges.
        self.unschedulable: dict[str, str] = {}
        self.requeuer = requeuer
        self._to_learn: list[PodInfo] = []
        self._learned = 0
        self._seeded: set[str] = set()  # UIDs of running pods that seeded learning: never "first seen" again
        self._last_learn = float("-inf")
        self.clock = time.monotonic

    # -- helpers --------------------------------------------------------------------------------

    def _parse(self, pod: dict[str, Any]) -> PodInfo:
        return pod_info(pod, self.options.names, self.options.defaults)

    def _parse_verb(self, pod: dict[str, Any]) -> PodInfo:
        """`_parse` for /filter and /prioritize: kube-scheduler sends /prioritize the very pod /filter got, so a pod
        equal to the last one parsed for its UID reuses that parse (a changed pod, or another UID, is parsed anew).
        Invalid pods are never kept: they raise every time. Only called on the event loop's thread."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        hit = self._parsed.get(uid) if uid else None
        if hit is not None and hit[0] == pod:
            return hit[1]
        info = self._parse(pod)
        if uid:
            self._parsed.pop(uid, None)  # re-insert: the oldest entry is the first one
            self._parsed[uid] = (pod, info)
            if len(self._parsed) > _RECENT_PODS:
                del self._parsed[next(iter(self._parsed))]
        return info

    def _remember(self, pod: dict[str, Any]) -> bool:
        """Keep the pod for /bind; True the first time this pod (UID) is seen."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return False
        if self.options.pods_from_filter:
            key = pod_key(pod)
            self._filtered[key] = pod
            self._filtered.move_to_end(key)
            if len(self._filtered) > _RECENT_PODS:
                self._filtered.popitem(last=False)
        new = uid not in self._recent and uid not in self._seeded
        self._recent[uid] = pod
        self._recent.move_to_end(uid)
        if len(self._recent) > _RECENT_PODS:
            self._recent.popitem(last=False)
        return new

    def _learn(self, info: PodInfo) -> None:
        """Feed an arriving pod to its policy; batched so a burst causes at most one relearn per interval."""
        self._to_learn.append(info)
        now = self.clock()
        if self._learned >= LEARN_BOOTSTRAP and now - self._last_learn < self.options.relearn_interval_s:
            return
        self._flush_learning(now)

    def _flush_learning(self, now: float) -> None:
        for pod in self._to_learn:
            try:
                self.planner.observe(pod)
            except UnknownPolicyError:
                continue  # its filter reports the bad annotation; it must not poison the batch
        self._learned += len(self._to_learn)
        self._to_learn.clear()
        self._last_learn = now

    def _seed_candidates(self, pods: Iterable[dict[str, Any]]) -> tuple[list[tuple[str, PodInfo]], Counter[str]]:
        """Parse the listed pods that hold one of our assignments; the rest are counted by why they were skipped."""
        out: list[tuple[str, PodInfo]] = []
        skipped: Counter[str] = Counter()
        for pod in pods:
            meta = pod.get("metadata") or {}
            if ann.POD_ASSIGNMENT not in (meta.get("annotations") or {}):
                continue
            if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue
            try:
                info = self._parse(pod)
            except RequestError as exc:
                skipped["invalid-request"] += 1
                log.warning("not seeding learning from pod", extra={"pod": pod_key(pod), "error": str(exc)})
                continue
            except Exception as exc:  # a malformed object must never stop the seeding
                skipped["unparsable"] += 1
                log.warning("not seeding learning from pod", extra={"pod": pod_key(pod), "error": repr(exc)})
                continue
            if info.request.is_empty:
                skipped["empty-request"] += 1
                continue
            out.append((str(meta.get("uid") or ""), info))
        return out, skipped

    def _seed_learning(self, candidates: list[tuple[str, PodInfo]], skipped: Counter[str]) -> int:
        """Feed running pods to the learning path as one batch: one observe per pod, no relearn per pod.

        They count towards LEARN_BOOTSTRAP and as a relearn, so /filter's batch schedule carries on from here.
        Callers hold the state lock.
        """
        now = self.clock()
        self._flush_learning(now)  # anything /filter queued before the list: same batch
        seeded = 0
        for uid, info in candidates:
            try:
                self.planner.observe(info)
            except UnknownPolicyError as exc:
                skipped["unknown-policy"] += 1
                log.warning("not seeding learning from pod", extra={"pod": info.key, "error": str(exc)})
                continue
            seeded += 1
            if uid:
                self._seeded.add(uid)
        self._learned += seeded
        self._last_learn = now
        self.metrics.learning_seeded.inc(seeded)
        for reason, n in skipped.items():
            self.metrics.learning_seed_skipped.labels(reason).inc(n)
        log.info(
            "learning seeded from running pods",
            extra={"seeded": seeded, "skipped": sum(skipped.values()), "skipped_by_reason": dict(skipped)},
        )
        return seeded

    def _pending_done(self, key: str) -> None:
        """The pod was bound or deleted: no longer pending, never nudged. Callers hold the state lock."""
        if self.unschedulable.pop(key, None) is not None:
            self.metrics.pending.set(len(self.unschedulable))
        if self.requeuer is not None:
            self.requeuer.forget(key)

    def _capacity_freed(self) -> None:
        """Slices were released: ask kube-scheduler to retry the pods we rejected. Callers hold the state lock;
        this only queues (no I/O), the requeuer's thread sends the patches."""
        if self.requeuer is not None and self.unschedulable:
            self.requeuer.request(list(self.unschedulable.items()))

    def _release_stale(self, info: PodInfo) -> None:
        if self.sync.unbound and self.sync.expire_unbound():
            self._capacity_freed()
        if info.key in self.sync.unbound and not info.node_name and info.key not in self.inflight:
            # Being scheduled again, so a previous bind of it failed: its reservation is stale. Only an unbound
            # reservation: a /filter body naming a bound pod never frees that pod's slices.
            del self.sync.unbound[info.key]
            self.state.release(info.key)

    def _evaluate(self, info: PodInfo, names: list[str]) -> Evaluation:
        self._release_stale(info)
        return self.planner.evaluate(info, names)

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
        first_time = self._remember(args.Pod)
        try:
            info = self._parse_verb(args.Pod)
            if info.request.is_empty:
                return schema.filter_result(
                    node_names=names if items is None else None, nodes=items, failed={}, unresolvable={}
                )
            with self.lock:
                if first_time:
                    self._learn(info)
                evaluation = self._evaluate(info, names)
                if self.options.narrow_filter:
                    evaluation = self.planner.narrow(evaluation)
                # Recorded under the same lock as the evaluation: a release right after it nudges this pod.
                self.unschedulable.pop(info.key, None)  # (re-)insert: the oldest rejection first
                if not evaluation.feasible:
                    self.unschedulable[info.key] = str((args.Pod.get("metadata") or {}).get("uid") or "")
                self.metrics.pending.set(len(self.unschedulable))
        except (RequestError, UnknownPolicyError) as exc:  # the pod can never fit: say why on every node
            self.metrics.filter_failure("invalid-request")
            return schema.filter_result(
                node_names=[] if items is None else None,
                nodes=None if items is None else [],
                failed={},
                unresolvable=dict.fromkeys(names, str(exc)),
            )
        feasible = evaluation.feasible
        if not feasible:
            self.metrics.filter_failure("no-fit")
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

    def prioritize(self, args: schema.ExtenderArgs) -> list[dict[str, Any]]:
        names, _ = self._names(args, "prioritize")
        try:
            info = self._parse_verb(args.Pod)
            if info.request.is_empty:
                return schema.host_priorities({})
            with self.lock:
                self._release_stale(info)
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
            pod = self.binder.get_pod(namespace=args.PodNamespace, name=args.PodName)
        except Exception as exc:
            return self._bind_failed(key, args.Node, f"cannot read the pod from the apiserver: {exc}")
        if pod is None and self.options.pods_from_filter:
            pod = self._filtered.get(key)
        if pod is None:
            return self._bind_failed(key, args.Node, "pod not found")
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if args.PodUID and uid != args.PodUID:
            return self._bind_failed(
                key, args.Node, f"the pod's UID is {uid or 'unset'}, the bind names {args.PodUID}; refused"
            )
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            return self._bind_failed(key, args.Node, f"already bound to {bound_to}; a bound pod is never bound again")
        try:
            info = self._parse(pod)
        except (RequestError, UnknownPolicyError) as exc:
            return self._bind_failed(key, args.Node, str(exc))
        assignment = None
        with self.lock:
            if key in self.inflight:
                return self._bind_failed(key, args.Node, "a bind of this pod is already in progress")
            held = self.state.assignments.get(key) or self.state.orphans.get(key)
            if held is not None:
                return self._bind_failed(
                    key,
                    args.Node,
                    f"it holds a live assignment on {held.node}; refused until that is released "
                    f"(the pod is deleted, its bind fails, or its reservation expires after {self.options.bind_grace_s:g} s)",
                )
            if not info.request.is_empty:
                try:
                    result = self.planner.evaluate_node(args.Node, info)
                except UnknownPolicyError as exc:
                    return self._bind_failed(key, args.Node, str(exc))
                if result.placement is None:
                    reason = result.failure.reason if result.failure else "does not fit"
                    return self._bind_failed(key, args.Node, f"no longer fits: {reason}")
                assignment = result.placement.assignment(info)
                try:
                    self.state.apply(key, assignment)
                except CapacityError as exc:  # cannot happen after a fresh fit; keep it loud
                    return self._bind_failed(key, args.Node, str(exc))
                self.sync.own_bind(key)
            self.inflight.add(key)
            self.metrics.inflight.set(len(self.inflight))
        try:
            if assignment is not None:
                self.binder.write_assignment(
                    namespace=args.PodNamespace, name=args.PodName, uid=uid or args.PodUID, assignment=assignment
                )
            self._bind_checked(args, uid)
        except Exception as exc:
            with self.lock:
                self.inflight.discard(key)
                self.metrics.inflight.set(len(self.inflight))
                if assignment is not None:
                    self.state.release(key)
                    self.sync.settle()
                    self._capacity_freed()  # others may have been rejected while this bind held the slices
            if assignment is not None:
                try:
                    self.binder.mark_failed(
                        namespace=args.PodNamespace, name=args.PodName, uid=uid or args.PodUID, reason=str(exc)
                    )
                except Exception as mark_exc:
                    log.warning("could not mark assignment failed", extra={"pod": key, "error": str(mark_exc)})
            return self._bind_failed(key, args.Node, f"binding failed: {exc}")
        with self.lock:
            self.inflight.discard(key)
            self.metrics.inflight.set(len(self.inflight))
            self._pending_done(key)
        self.metrics.bound(time.perf_counter() - started)
        slices = [f"{d.uuid}:{d.memory_mib}MiB:{d.cores}%" for d in assignment.slices()] if assignment else []
        log.info("bound", extra={"pod": key, "node": args.Node, "slices": slices})
        return schema.binding_result()

    def _bind_checked(self, args: schema.ExtenderBindingArgs, uid: str) -> None:
        """Create the Binding; on an error, look whether it landed anyway (a timed-out call may have)."""
        try:
            self.binder.bind(namespace=args.PodNamespace, name=args.PodName, uid=uid or args.PodUID, node=args.Node)
        except Exception:
            try:
                pod = self.binder.get_pod(namespace=args.PodNamespace, name=args.PodName)
            except Exception:
                pod = None
            if pod is None or (pod.get("spec") or {}).get("nodeName") != args.Node:
                raise
            log.info("binding call failed but the pod is bound", extra={"pod": f"{args.PodNamespace}/{args.PodName}"})

    def expire_unbound(self) -> None:
        with self.lock:
            if self.sync.expire_unbound():
                self._capacity_freed()

    def _bind_failed(self, key: str, node: str, reason: str) -> dict[str, str]:
        self.metrics.bind_failure()
        log.warning("bind failed", extra={"pod": key, "node": node, "reason": reason})
        return schema.binding_result(f"bind {key} to {node}: {reason}")

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
                self._capacity_freed()

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        with self.lock:
            held = key in self.state.assignments
            self.sync.pod_event(kind, pod)
            if self._seeded and (kind == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES):
                self._seeded.discard(str((pod.get("metadata") or {}).get("uid") or ""))
            if kind == "DELETED" or (pod.get("spec") or {}).get("nodeName"):
                self._pending_done(key)
            # Only a release nudges: the nudge's own MODIFIED event changes no state, so it never nudges again.
            if held and key not in self.state.assignments:
                self._capacity_freed()

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            before = dict(self.state.nodes)
            self.sync.replace_nodes(nodes)
            if any(before.get(name) is not node for name, node in self.state.nodes.items()):
                self._capacity_freed()  # new or changed nodes, as in node_event

    def set_leading(self, leading: bool, *, leader: str = "") -> None:
        """Leader election moved: serve the verbs or refuse them (503) while another replica leads."""
        self.leader = leader
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self.leading.set()
        else:
            self.leading.clear()

    def seed_learning_from(self, pods: list[dict[str, Any]]) -> int:
        """Seed learning from running pods not seeded yet: a standby that takes over learns the pods the leader
        placed while it stood by (it never saw their /filter). Pods seeded before are skipped, so none counts twice."""
        candidates, skipped = self._seed_candidates(pods)
        with self.lock:
            fresh = [(uid, info) for uid, info in candidates if not uid or uid not in self._seeded]
            return self._seed_learning(fresh, skipped)

    def replace_pods(self, pods: list[dict[str, Any]], *, seed_learning: bool = False) -> None:
        """Apply a pod list. `seed_learning` (the source's first list only, never a relist, which would count
        the pods twice): the running pods that hold our assignments also seed the placement policy's learned
        workload, so a restarted extender does not start placement from a cold start."""
        seed = self._seed_candidates(pods) if seed_learning else None  # parsing needs no lock
        with self.lock:
            held = set(self.state.assignments)
            self.sync.replace_pods(pods)
            if not held <= self.state.assignments.keys():
                self._capacity_freed()
            if seed is not None:
                self._seed_learning(*seed)
            elif self._seeded:
                listed = {str((p.get("metadata") or {}).get("uid") or "") for p in pods}
                self._seeded &= listed
