"""The extender's verbs as plain methods: wire schema in, core call, wire schema out; and the watch feed.

One lock guards the cluster state and the parts that keep books on it: the reservations of binds in flight
(scheduler_extender.reservations), the pods /filter rejected (scheduler_extender.pending), what learning policies
are fed (scheduler_extender.learning). Filter and prioritize take it for a few milliseconds; bind takes it only to
reserve GPUs on fresh state and to settle the outcome, and does its apiserver I/O outside it, so concurrent binds
never over-commit a GPU and never wait on each other's network round trips.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler_extender import deadline, schema
from scheduler_extender.bind import DEFAULT_HTTP_TIMEOUT_S, BindVerb, NotHeld, check_budget, held_pod
from scheduler_extender.binder import Binder
from scheduler_extender.holds import SoftHolds, steer
from scheduler_extender.learning import Candidates, Learning, seed_candidates
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.pending import Pending
from scheduler_extender.preempt import Books, given_victims, nominations_held, victims_result
from scheduler_extender.recent import RecentPods
from scheduler_extender.requeue import Requeuer
from scheduler_extender.reservations import Reservations
from scheduler_extender.sync import StateSync
from scheduler_extender.unbound_pods import UnboundPods
from vgpu import annotations as ann
from vgpu.annotations import Assignment
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo, bound_node, is_finished, pod_info, pod_key, pod_uid
from vgpu.priority import pod_priority
from vgpu.state import ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    names: ResourceNames = ResourceNames()
    defaults: RequestDefaults = RequestDefaults()
    narrow_filter: bool = False
    # /filter answers only the node /prioritize would rank first (`ExtenderService._one_node`), so kube-scheduler binds
    # it without scoring and never calls /prioritize (docs/extender.md, "One node from /filter").
    filter_answers_one: bool = False
    bind_grace_s: float = 30.0
    bind_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S  # kube-scheduler's extender httpTimeout (scheduler_extender.bind)
    # Arriving pods reach learning policies (fragaware) at most this often once they have a first picture
    # (scheduler_extender.learning): each relearn costs ~0.5 s a pod shape at 5,000 nodes, on the request path.
    relearn_interval_s: float = 60.0
    # The file source has no apiserver to read a pod from: /bind then takes the pod /filter last saw under that
    # namespace/name. Never with the kube source, where /bind reads the pod from the apiserver (docs/extender.md).
    pods_from_filter: bool = False
    # The most node names one /filter or /prioritize may carry (kube-scheduler sends at most one per node; Kubernetes
    # supports 5,000 nodes). 50 MB of unknown names once took 35 s and answered 310 MB.
    max_node_names: int = 15_000


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
        list_pdbs: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.state = state
        self.planner = Planner(state)
        self.binder = binder
        self.options = options
        self.metrics = metrics or ExtenderMetrics(state)
        self.lock = lock or threading.RLock()
        self.requeuer = requeuer  # no requeuer (the file source): rejected pods are counted, never nudged
        # PodDisruptionBudgets for the preempt verb (the kube source lists them; none: no pod is protected).
        self.list_pdbs = list_pdbs
        self.books = Books()  # priorities, ages, labels and nominations (scheduler_extender.preempt)
        self.pending = Pending(requeuer, on_count=self.metrics.pending.set)
        if requeuer is not None:
            requeuer.on_gone = self._nudge_found_no_pod
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
        self.unbound = UnboundPods(options.names)  # what /bind binds, from the pod watch (the kube source only)
        self.holds = SoftHolds()  # where pods just prioritized are about to be bound (scheduler_extender.holds)
        self._bind = BindVerb(
            binder=binder,
            lock=self.lock,
            reservations=self.reservations,
            pending=self.pending,
            recent=self.recent,
            parse=self._parse,
            metrics=self.metrics,
            timeout_s=options.bind_timeout_s,
            lease_until=lambda: self._lease_until(),
            watched=self.unbound,
            holds=self.holds,
            claims=lambda pod, info: nominations_held(
                self.state, self.planner, self.books, info, pod_priority(pod, info.request), self._parse
            ),
            binding=self.learning.binding,  # once the pod is read under its UID (scheduler_extender.bind.BindVerb)
        )
        # With leader election: until when this replica may still bind (LeaderElector.valid_until).
        self._lease_until: Callable[[], float] = lambda: math.inf
        self.ready = threading.Event()
        # Set while this replica may serve the verbs: always without leader election; with it, only while it leads
        # (scheduler_extender.leadership drives it through set_leading). `leader` names the holder for refusals.
        self.leading = threading.Event()
        self.leading.set()
        self.leader = ""
        # Per verb: the names last asked, the state's names_version then, and those of them that have an inventory.
        # kube-scheduler asks /filter about the same names pod after pod and /prioritize about /filter's answer:
        # comparing lists is a memcmp per name, where looking each fresh name up hashes it (~0.5 ms at 5,000).
        self._known_memo: dict[str, tuple[list[str], int, list[str]]] = {}
        self._pods_listed = False  # a later pod list is a relist (replace_pods)

    def _nudge_found_no_pod(self, key: str, uid: str) -> None:
        """The requeuer's nudge found no pod under this key and UID (its worker thread, outside its own lock)."""
        with self.lock:
            self.pending.gone(key, uid)

    def _parse(self, pod: Mapping[str, Any]) -> PodInfo:
        return pod_info(pod, self.options.names, self.options.defaults)

    # -- verbs ----------------------------------------------------------------------------------

    @staticmethod
    def _names(args: schema.ExtenderArgs, verb: str) -> tuple[list[str], list[dict[str, Any]] | None]:
        """The candidate node names, plus the node objects in the full-NodeList mode."""
        if args.NodeNames is not None:
            names, items = list(args.NodeNames), None
        elif args.Nodes is not None:
            items = args.Nodes.items
            names = [_node_name(n, i) for i, n in enumerate(items)]
        else:
            raise BadRequest(f"{verb}: the request carries neither Nodes nor NodeNames")
        return names, items

    def _check_count(self, names: list[str], verb: str) -> None:
        if len(names) > self.options.max_node_names:
            raise BadRequest(
                f"{verb}: {len(names)} nodes in one call; at most {self.options.max_node_names} allowed "
                "(--max-node-names)"
            )

    def filter(self, args: schema.ExtenderArgs) -> dict[str, Any]:
        names, items = self._names(args, "filter")
        self._check_count(names, "filter")
        uid = pod_uid(args.Pod)
        self.recent.keep(args.Pod)
        with self.lock:
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
                # Names without an inventory fail with one shared message, outside the planner's per-shape caches,
                # so a flood of unknown names costs one lookup each and is never remembered.
                evaluation: Evaluation | None = None
                if (
                    items is None
                    and not self.options.narrow_filter
                    and not (self.books.nominated or self.books.pending)
                ):
                    # The common call (names, no narrowing, no preemptor holding room): no subset evaluation is built,
                    # and the planner tells the names without an inventory apart as it looks each name up.
                    passed, failed, unresolvable = self.planner.filter_names(info, names, unknown=NO_INVENTORY)
                else:
                    known = self._known_names("filter", names)
                    evaluation = self._evaluate_held(args.Pod, info, known)
                    if len(known) < len(names):  # a copy: the planner may hand out its memoised evaluation's dicts
                        failed = {
                            **evaluation.failed,
                            **dict.fromkeys((n for n in names if n not in self.state.nodes), NO_INVENTORY),
                        }
                        evaluation = dataclasses.replace(evaluation, failed=failed)
                if evaluation is not None:
                    if self.options.narrow_filter:
                        evaluation = self.planner.narrow(evaluation)
                    failed, unresolvable = evaluation.failed, evaluation.unresolvable
                    # Unknown names are never feasible, so the answer in `known`'s order is the answer in `names`'.
                    # /prioritize gets this list back: it is the planner's to recognise, and ours (`_known_names`).
                    passed = [] if items is not None else self.planner.passing(info, known, evaluation)
                fits = bool(passed) if evaluation is None else bool(evaluation.feasible)
                # Recorded under the same lock as the evaluation: a release right after it nudges this pod.
                self.pending.filtered(info.key, uid, fits=fits)
                if items is None:
                    self._known_memo["prioritize"] = (passed, self.state.names_version, passed)
                chosen: str | None = None
                if fits and self.options.filter_answers_one:
                    # One node out of what passed above, so it combines with every way there: a preemptor holding
                    # room leaves the nodes it closed failed and the best one left is answered; --narrow-filter's tier
                    # is narrowed first (its other nodes stay failed as without this) and its best node answered; the
                    # node-list mode answers that node's object. FailedNodes and the unresolvable ones stay as they are.
                    if items is not None and evaluation is not None:
                        passed = self.planner.passing(info, known, evaluation)
                    chosen = self._one_node(info, passed)
                    self.metrics.one_node.labels("all-held" if chosen is None else "one").inc()
                    if chosen is not None and items is None:
                        passed = [chosen]
                # Written under the lock: FailedNodes (and the evaluation the node-list mode reads) may be the planner's
                # memoised evaluation's own dicts, which another verb thread's call refreshes in place once it is free.
                if items is not None:
                    assert evaluation is not None
                    answer = _filter_result(names, items, evaluation, only=chosen)
                else:
                    answer = schema.filter_result(
                        node_names=passed, nodes=None, failed=failed, unresolvable=unresolvable
                    )
        except (RequestError, UnknownPolicyError) as exc:  # the pod can never fit: say why on every node
            self.metrics.filter_failure("invalid-request")
            return schema.filter_result(
                node_names=[] if items is None else None,
                nodes=None if items is None else [],
                failed={},
                unresolvable=dict.fromkeys(names, str(exc)),
            )
        if not fits:
            self.metrics.filter_failure("no-fit")
        return answer

    def _known_names(self, verb: str, names: list[str]) -> list[str]:
        """`names` that have an inventory, in order; the list kept from the verb's last call when nothing changed."""
        version = self.state.names_version
        memo = self._known_memo.get(verb)
        if memo is not None and memo[1] == version and memo[0] == names:
            return memo[2]
        known = _known(names, self.state.nodes)
        self._known_memo[verb] = (names, version, known)
        return known

    def _evaluate_held(self, pod: dict[str, Any], info: PodInfo, known: list[str]) -> Evaluation:
        """The planner's evaluation, with pods that preempted for room holding it against pods of lower priority
        (scheduler_extender.preempt): a copy then, as the stand-ins are gone after it."""
        if not self.books.nominated and not self.books.pending:
            return self.planner.evaluate(info, known)
        prio = pod_priority(pod, info.request)
        with nominations_held(self.state, self.planner, self.books, info, prio, self._parse) as held:
            names = [n for n in known if n not in held.closed] if held.closed else known
            ev = self.planner.evaluate(info, names)
            if not held.placed and not held.closed:
                return ev
            failed = {**ev.failed, **{n: r for n, r in held.closed.items() if n in known}}
            return Evaluation(dict(ev.feasible), failed, dict(ev.unresolvable), dict(ev.scores))

    def preempt(self, args: schema.ExtenderPreemptionArgs) -> dict[str, Any]:
        """ExtenderPreemptionResult: per candidate node our cheapest victim set; nodes where none works are left
        out (scheduler_extender.preempt). Victims, priority and the hold are sized from the pod the apiserver
        holds, never from the body sent (`_pod_to_preempt_for`)."""
        given = given_victims(args.NodeNameToMetaVictims, args.NodeNameToVictims)
        self._check_count(list(given), "preempt")  # each candidate node costs a victim search under the lock
        pod = self._pod_to_preempt_for(args.Pod)
        if pod is None:
            return {"NodeNameToMetaVictims": {}}
        try:
            info = self.recent.parse(pod)
        except (RequestError, UnknownPolicyError) as exc:
            log.info("preempt: pod can never fit", extra={"error": str(exc)})
            self.metrics.preemptions.labels("cannot-fit").inc()
            return {"NodeNameToMetaVictims": {}}
        if info.request.is_empty:
            self.metrics.preemptions.labels("no-gpu").inc()
            return {
                "NodeNameToMetaVictims": {
                    n: {"Pods": [{"UID": u} for u in v[0]], "NumPDBViolations": v[1]} for n, v in given.items() if v[0]
                }
            }
        pdbs: list[dict[str, Any]] = []
        if self.list_pdbs is not None:
            try:
                pdbs = self.list_pdbs()  # apiserver I/O outside the lock
            except Exception as exc:  # any failure: choose as if no budget protected a pod
                log.warning("preempt: could not list PodDisruptionBudgets", extra={"error": str(exc)})
        prio = pod_priority(pod, info.request)
        with self.lock:
            self.reservations.release_stale(info)
            result = victims_result(self.state, self.planner, self.books, info, prio, given, pdbs)
            by_uid = {m.uid: k for k, m in self.books.pods.items() if m.uid}
            self.books.preempting(
                pod,
                {n: [by_uid[p["UID"]] for p in v["Pods"] if p["UID"] in by_uid] for n, v in result.items()},
            )
        self.metrics.preemptions.labels("answered" if result else "no-node").inc()
        return {"NodeNameToMetaVictims": result}

    def _pod_to_preempt_for(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The pod as the apiserver holds it under the body's namespace/name (scheduler_extender.bind.held_pod): the
        watch's copy when it carries the body's metadata.uid, else one GET, within what /bind keeps for a read
        (`check_budget`), outside the lock. None, logged and counted by reason, when there is none: the caller could
        otherwise size victims and a hold of up to PENDING_NOMINATION_S from inflated requests, a forged priority or
        another pod's name. The file source has no watch nor apiserver: there the body is all there is."""
        if self.options.pods_from_filter:
            return body
        key = pod_key(body)
        namespace, _, name = key.partition("/")
        uid = pod_uid(body)
        with self.lock:
            seen = self.unbound.get(key)
        try:
            if not uid:
                raise NotHeld("the body carries no metadata.uid", reason="uid-mismatch")
            with deadline.within(time.monotonic() + check_budget(self.options.bind_timeout_s)):
                return held_pod(self.binder, seen, namespace=namespace, name=name, uid=uid, verb="preemption request")
        except NotHeld as exc:
            log.warning("preempt: no pod to preempt for", extra={"pod": key, "outcome": exc.reason, "reason": str(exc)})
            self.metrics.preemptions.labels(exc.reason).inc()
            return None

    def prioritize(self, args: schema.ExtenderArgs) -> list[dict[str, Any]]:
        names, _ = self._names(args, "prioritize")
        self._check_count(names, "prioritize")
        try:
            info = self.recent.parse(args.Pod)
            if info.request.is_empty:
                return schema.host_priorities({})
            with self.lock:
                self.reservations.release_stale(info)
                prios = self.planner.priorities_for(info, self._known_names("prioritize", names))
                prios = self._steer(info, prios)
        except (RequestError, UnknownPolicyError):
            prios = {}
        return schema.host_priorities(prios)  # priorities_for only scores the nodes asked about

    def _one_node(self, info: PodInfo, feasible: list[str]) -> str | None:
        """--filter-answers-one: the node of `feasible` (/filter's answer) that /prioritize would rank first, the
        same priorities steered past others' soft holds the same way, with this pod's hold left there (`_steer`);
        None when no node of the best ranked is free of them (the whole answer goes back, and /prioritize decides).

        kube-scheduler (kubernetes v1.34.4 pkg/scheduler/schedule_one.go): `findNodesThatPassExtenders` sets a
        status only for the nodes named in FailedNodes / FailedAndUnresolvableNodes and keeps the extender's
        NodeNames (or Nodes) as the feasible list, so the feasible nodes left out get no status at all; then
        `schedulePod` returns a single feasible node at once ("When only one node after predicate, just use it"):
        no PreScore/Score plugins, no extender prioritize, and no PostFilter (preemption runs only on a FitError,
        i.e. no feasible node, which this never turns into). A pod with a nominated node is first asked about that
        node alone (`evaluateNominatedNode`): answered as itself when it fits. HAMi's extender answers one node by
        design (Project-HAMi/HAMi pkg/scheduler/scheduler.go, Filter: `NodeNames: &[]string{m.NodeID}`, 024910e).
        Callers hold the lock."""
        return self._steered(info, self.planner.priorities_for(info, feasible))[1]

    def _steer(self, info: PodInfo, prios: dict[str, int]) -> dict[str, int]:
        """Score 0 the best-ranked nodes this pod does not fit on beside the soft holds there, then hold its own
        place on the best node left (scheduler_extender.holds). Only ever lowers scores."""
        return self._steered(info, prios)[0]

    def _steered(self, info: PodInfo, prios: dict[str, int]) -> tuple[dict[str, int], str | None]:
        """`_steer`'s priorities, and the best node left (None: every scored node is blocked by others' holds)."""
        placed: dict[str, Assignment] = {}

        def blocked(node: str) -> bool:
            holds = self.holds.on(node, other_than=info.key)
            if not holds:
                return False
            # On a copy of the node: a hold that no longer fits (the node changed since) is left out, and the state's
            # versions do not move, so no memoised evaluation re-evaluates the node for this.
            result = self.planner.evaluate_beside(node, info, [(HOLD_PREFIX + h.key, h.assignment) for h in holds])
            if result.placement is None:
                return True
            placed[node] = result.placement.assignment(info)
            return False

        prios, best = steer(prios, blocked)
        if best is not None:
            if best not in placed:  # unchanged since this call evaluated it: the shape's cached answer
                result = self.planner.cached_result(best, info)
                if result.placement is not None:
                    placed[best] = result.placement.assignment(info)
            if best in placed:
                self.holds.hold(info.key, best, placed[best])
        return prios, best

    def bind(self, args: schema.ExtenderBindingArgs) -> dict[str, str]:
        """Bind the pod the apiserver holds under PodNamespace/PodName (scheduler_extender.bind)."""
        return self._bind.bind(args)

    def expire_unbound(self) -> None:
        """Expire reservations past their grace; fence the Bindings of unknown outcome held past it (apiserver I/O,
        outside the lock; one that cannot be fenced now stays held and is tried again on the next call)."""
        with self.lock:
            self.reservations.expire()
            due = self.reservations.due_fences()
        for key, uid, version in due:
            namespace, _, name = key.partition("/")
            try:
                fenced = self.binder.fence(namespace=namespace, name=name, uid=uid, version=version)
            except Exception as exc:
                log.warning("cannot fence a Binding of unknown outcome yet", extra={"pod": key, "error": str(exc)})
                continue
            if fenced:
                with self.lock:
                    self.reservations.fenced(key)
                log.info("released the slices of a Binding that can no longer land", extra={"pod": key})

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
            self.books.pod_event(kind, pod)
            self.unbound.event(kind, pod)
            if kind == "DELETED" or is_finished(pod):
                self.learning.forget(pod_uid(pod))
            else:
                self._learn_running(pod)
            if kind == "DELETED" or bound_node(pod):
                self.pending.done(key)
                self.holds.drop(key)
            # Only a release nudges: the nudge's own MODIFIED event changes no state, so it never nudges again.
            if held and key not in self.state.assignments:
                self.pending.capacity_freed()

    def _learn_running(self, pod: dict[str, Any]) -> None:
        """A pod that now runs with our assignment and was never fed (on a standby: every pod the leader places)
        feeds learning as the pod list's seeding would, so a standby takes over with the leader's picture and no
        list of all pods (docs/extender.md, "Leader election"). Callers hold the lock."""
        uid = pod_uid(pod)
        if ann.POD_ASSIGNMENT not in ((pod.get("metadata") or {}).get("annotations") or {}) or self.learning.knows(uid):
            return
        self.learning.running(uid, *seed_candidates([pod], self._parse))

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            before = dict(self.state.nodes)
            self.sync.replace_nodes(nodes)
            if any(before.get(name) is not node for name, node in self.state.nodes.items()):
                self.pending.capacity_freed()  # new or changed nodes, as in node_event

    def replace_pods(
        self, pods: list[dict[str, Any]], *, seed_learning: bool = False, listed_at: float | None = None
    ) -> None:
        """Apply a pod list. `seed_learning`: the running pods that hold our assignments also seed the placement
        policy's learned workload, so a restarted extender does not start placement from a cold start (the kube
        source seeds its first list in the background: `seed_learning_from`). A relist learns the running pods the
        watch missed while it was down, as their events would have; pods fed before are never fed twice.
        `listed_at`: when the list was read (time.monotonic): pods /filter rejected since stay pending, and the
        slices this extender's binds reserved since stay held, though the list does not hold their pods (created
        after the read; at 40k pods the list is applied seconds later)."""
        relist = self._pods_listed
        self._pods_listed = True
        if seed_learning:
            seed: tuple[Candidates, Counter[str]] | None = seed_candidates(pods, self._parse)  # parsing needs no lock
        elif relist:  # unlocked membership reads only skip parsing: learning.seed checks again under the lock
            seed = seed_candidates((p for p in pods if not self.learning.knows(pod_uid(p))), self._parse)
        else:
            seed = None
        with self.lock:
            held = set(self.state.assignments)
            self.sync.replace_pods(pods, listed_at=listed_at)
            self.books.replace(pods)
            self.unbound.replace(pods)
            # A pod /filter rejected that the list no longer holds is gone: it must not be nudged on later releases.
            self.pending.keep_only(
                (pod_key(p) for p in pods if not bound_node(p) and not is_finished(p)), rejected_before=listed_at
            )
            if not held <= self.state.assignments.keys():
                self.pending.capacity_freed()
            if not seed_learning:
                self.learning.keep_only(pod_uid(p) for p in pods)
            if seed is not None and (seed_learning or seed[0] or seed[1]):
                self.learning.seed(*seed)

    # -- leadership (scheduler_extender.leadership.Replica) -------------------------------------

    def set_leading(self, leading: bool, *, leader: str = "") -> None:
        """Leader election moved: serve the verbs or refuse them (503) while another replica leads."""
        self.leader = leader
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self.leading.set()
        else:
            self.leading.clear()

    def bind_only_until(self, until: Callable[[], float]) -> None:
        """Binds end (their apiserver calls stop) by `until()`: the lease's renew deadline."""
        self._lease_until = until

    def leader_seen(self, holder: str) -> None:
        """The current holder of the lease, named in a standby's refusals."""
        self.leader = holder

    def seed_learning_from(self, pods: list[dict[str, Any]]) -> int:
        """Seed learning from running pods not fed yet (the kube source's first list, in the background). Pods fed
        before (seeded, from the watch, at /filter) are skipped, so none counts twice."""
        candidates, skipped = seed_candidates(pods, self._parse)
        with self.lock:
            return self.learning.seed(candidates, skipped)


NO_INVENTORY = "node has no vGPU inventory (device plugin not running?)"  # as vgpu.planner says it
HOLD_PREFIX = "hold:"  # the state key of a soft hold's stand-in while /prioritize weighs a pod beside it


def _node_name(node: object, index: int) -> str:
    meta = node.get("metadata") if isinstance(node, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        raise BadRequest(f"Nodes.items[{index}].metadata.name: expected a string")
    return name


def _known(names: list[str], nodes: Mapping[str, object]) -> list[str]:
    """The names that have an inventory, in order. `filter` with a bound `__contains__` runs in C: a Python loop over
    5,000 names cost more than the whole no-GPU request (extender_latency.py). They stay the request's own strings:
    mapped to the state's (older, scattered) string objects, /prioritize's comparison of its 3,900 names with them and
    the answer's JSON cost more at 5,000 names than the lookups by identity saved at 500 (measured, both ways)."""
    return list(filter(nodes.__contains__, names))


def _filter_result(
    names: list[str], items: list[dict[str, Any]] | None, evaluation: Evaluation, *, only: str | None = None
) -> dict[str, Any]:
    """ExtenderFilterResult in the full-NodeList mode: the node objects kept (node names: `Planner.passing`); `only`:
    just that node's object (--filter-answers-one), the other feasible ones left out and not failed."""
    assert items is not None
    if only is not None:
        kept = [items[names.index(only)]]
    else:
        feasible = evaluation.feasible
        kept = [n for n, name in zip(items, names, strict=True) if name in feasible]
    return schema.filter_result(
        node_names=None, nodes=kept, failed=evaluation.failed, unresolvable=evaluation.unresolvable
    )
