"""The preempt verb, and the books it needs: every pod's priority, age and labels, and the nominated pods.

kube-scheduler (Kubernetes v1.34) calls the verb from its DefaultPreemption PostFilter
(pkg/scheduler/framework/preemption/preemption.go, Evaluator.callExtenders) after dry-running only its in-tree
filters with lower-priority pods removed: the candidate nodes are those our /filter put in FailedNodes (not
FailedAndUnresolvableNodes) *and* where the in-tree dry run needed at least one victim (a node it finds feasible
with none is dropped before we see it; kubernetes/kubernetes pull request 135486 lifts that after v1.34). With
nodeCacheCapable it sends NodeNameToMetaVictims (victim UIDs only; pkg/scheduler/extender.go, ProcessPreemption)
and takes back ExtenderPreemptionResult.NodeNameToMetaVictims, whose UIDs it looks up among the pods on that node
(k8s.io/kube-scheduler/extender/v1 types.go: MetaVictims{Pods []*MetaPod{UID}, NumPDBViolations}). A node
answered with no victims is an error for a non-ignorable extender, so nodes where no set works are left out.

Per node we replace kube-scheduler's GPU-holding victims by vgpu.preemption's cheapest set on our books (its
in-tree choice counts `nvidia.com/gpu` replicas, not memory, SMs or which GPU) and keep its victims that hold no
slice (they were chosen for CPU or memory). When our books say the pod fits already, its set stands as sent.

After preemption kube-scheduler writes the preemptor's status.nominatedNodeName. `Books.nominated` holds those
pods; /filter evaluates a pod with every nominated pod of at least its priority placed on its nominated node
(as kube-scheduler's in-tree filters do), so a lower-priority pod cannot take the slices freed for the preemptor.
Two windows are closed besides:
- Between our answer and the watch showing the nomination: kube-scheduler (v1.34, SchedulerAsyncPreemption on by
  default) deletes the victims from a goroutine while its failure handler writes nominatedNodeName, and our watch
  may show the victims gone first. The nodes we answered hold the preemptor from the answer on (`Books.pending`)
  until the watch shows its nomination, its binding or its deletion, or `PENDING_NOMINATION_S` passes.
- While the victims terminate the preemptor does not fit yet, so it cannot hold slices; a lower-priority pod that
  fits in the partly freed room would take it for good (once it is gone, kube-scheduler's in-tree dry run finds the
  preemptor fits without victims and never calls our preempt verb again). So a node where the preemptor would fit
  once its terminating pods (or the victims we chose) are gone is closed to lower-priority GPU pods meanwhile,
  as kube-scheduler's in-tree filters count a nominated pod's requests whether or not the node has room yet.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu import annotations as ann
from vgpu.disruption import protected
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.fit import NodePlacement, fit_node
from vgpu.planner import Planner
from vgpu.pod import PodInfo, bound_node, is_finished, pod_key
from vgpu.preemption import VictimFacts, choose_victims, without
from vgpu.priority import Priority, spec_priority
from vgpu.state import ClusterState

log = logging.getLogger(__name__)

# How long an answered preemption holds its nodes before the watch shows the nomination (normally milliseconds;
# kube-scheduler v1.34 writes nominatedNodeName in the same scheduling cycle as our answer).
PENDING_NOMINATION_S = 30.0
BUDGET_S = 3.0  # of kube-scheduler's 5 s extender httpTimeout (deploy/scheduler/kube-scheduler-config.yaml)
_NOMINATED = "nominated:"  # state key prefix of a nominated pod's stand-in placement during one /filter


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str
    priority: Priority
    created: float
    labels: Mapping[str, str] = field(default_factory=dict)


def _created(meta: Mapping[str, Any]) -> float:
    raw = meta.get("creationTimestamp")
    if not isinstance(raw, str):
        return 0.0
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """Priority from spec.priority and the webhook's priority label (HAMi's nvidia.com/priority, 0 high)."""
    meta = pod.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    hami_high = labels.get(ann.LABEL_PRIORITY) == "0"
    return PodMeta(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or "default"),
        priority=Priority(spec_priority(pod), hami_high),
        created=_created(meta),
        labels=labels,
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """A preemptor's claim on a node: nominated there (or answered and not yet nominated), with the pods whose
    departure lets it fit (our chosen victims; the node's terminating pods count too)."""

    node: str
    pod: Mapping[str, Any]
    victims: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Held:
    """What `nominations_held` did: stand-ins placed, and nodes closed to the pod (node -> reason)."""

    placed: int
    closed: dict[str, str]


class Books:
    """Kept from the pod watch under the service lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.pods: dict[str, PodMeta] = {}
        self.nominated: dict[str, tuple[str, Mapping[str, Any]]] = {}  # key -> (node, pod object)
        self.terminating: set[str] = set()  # pods with a deletionTimestamp, still holding their slices
        # Preemptor key -> (its claims on the nodes we answered, until when): before the watch shows the nomination.
        self.pending: dict[str, tuple[list[Claim], float]] = {}
        self.clock = clock

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        if kind == "DELETED" or is_finished(pod):
            self.pods.pop(key, None)
            self.nominated.pop(key, None)
            self.terminating.discard(key)
            self.pending.pop(key, None)
            return
        meta = pod.get("metadata") or {}
        known = self.pods.get(key)
        # A pod's UID, namespace, creation time and spec.priority never change, so its PodMeta only changes with its
        # labels: most events (bound, status, deleting) keep it, without parsing the creation time again.
        if known is None or known.uid != str(meta.get("uid") or "") or known.labels != (meta.get("labels") or {}):
            self.pods[key] = pod_meta(pod)
        if meta.get("deletionTimestamp"):
            self.terminating.add(key)
        else:
            self.terminating.discard(key)
        node = str((pod.get("status") or {}).get("nominatedNodeName") or "")
        if node or bound_node(pod):
            self.pending.pop(key, None)
        if node and not bound_node(pod):
            self.nominated[key] = (node, pod)
        else:
            self.nominated.pop(key, None)

    def replace(self, pods: list[dict[str, Any]]) -> None:
        self.pods.clear()
        self.nominated.clear()
        self.terminating.clear()
        pending, self.pending = self.pending, {}
        for p in pods:
            self.pod_event("ADDED", p)
        listed = {pod_key(p) for p in pods}
        # A relist keeps the answers whose preemptor is still pending and not yet nominated.
        self.pending = {k: v for k, v in pending.items() if k in listed and k not in self.nominated}

    def preempting(self, pod: Mapping[str, Any], victims: Mapping[str, list[str]]) -> None:
        """Our answer to kube-scheduler for `pod`: node -> victim keys. Held until the watch shows the outcome."""
        claims = [Claim(node, pod, frozenset(keys)) for node, keys in victims.items()]
        if claims:
            self.pending[pod_key(pod)] = (claims, self.clock() + PENDING_NOMINATION_S)

    def claims(self) -> list[tuple[str, Claim]]:
        """Every live claim, in a stable order: nominations first-hand, then answers not yet nominated."""
        now = self.clock()
        for key in [k for k, (_, until) in self.pending.items() if until < now]:
            del self.pending[key]
        out = [(key, Claim(node, obj)) for key, (node, obj) in sorted(self.nominated.items())]
        for key, (claims, _) in sorted(self.pending.items()):
            if key not in self.nominated:
                out += [(key, c) for c in claims]
        return out


@contextlib.contextmanager
def nominations_held(
    state: ClusterState,
    planner: Planner,
    books: Books,
    pod: PodInfo,
    priority: Priority,
    parse: Callable[[Mapping[str, Any]], PodInfo],
) -> Iterator[Held]:
    """While open: each claiming pod (other than `pod`) of at least `priority` holds a stand-in placement on its
    node where it fits; where it fits only once its victims or the node's terminating pods are gone, the node is
    closed to `pod`. Stand-ins are released on exit."""
    placed: list[str] = []
    closed: dict[str, str] = {}
    try:
        for key, claim in books.claims():
            meta = books.pods.get(key)
            node_state = state.nodes.get(claim.node)
            if key == pod.key or meta is None or meta.priority.value < priority.value or node_state is None:
                continue
            if key in state.assignments or claim.node in closed:
                continue
            try:
                info = parse(claim.pod)
                result = planner.evaluate_node(claim.node, info)
            except (RequestError, UnknownPolicyError):
                continue
            if result.placement is not None:
                stand_in = f"{_NOMINATED}{key}@{claim.node}"
                state.apply(stand_in, result.placement.assignment(info))
                placed.append(stand_in)
                continue
            leaving = {k for k in node_state.pods if k in books.terminating or k in claim.victims}
            if leaving and isinstance(
                fit_node(without(node_state, leaving), info, state.config, planner.rank_on(node_state, info)),
                NodePlacement,
            ):
                closed[claim.node] = (
                    f"held for pod {key} (priority {meta.priority.value}), which preempted pods here and fits once "
                    "they have gone"
                )
        yield Held(len(placed), closed)
    finally:
        for stand_in in placed:
            state.release(stand_in)


def victims_result(
    state: ClusterState,
    planner: Planner,
    books: Books,
    pod: PodInfo,
    priority: Priority,
    given: Mapping[str, tuple[list[str], int]],
    pdbs: Sequence[Mapping[str, Any]],
    *,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, dict[str, Any]]:
    """NodeNameToMetaVictims for the nodes kube-scheduler offered (`given`: node -> (victim UIDs, PDB violations)).
    Nodes still unexamined after `budget_s` are left out, so the answer comes inside kube-scheduler's httpTimeout
    (a full node of 8 GPUs x 10 sharers takes up to ~55 ms; kube-scheduler offers up to 100 candidates). A pod
    naming an unknown placement policy gets no node (as one that can never fit), never an error."""
    out: dict[str, dict[str, Any]] = {}
    by_uid = {m.uid: k for k, m in books.pods.items() if m.uid}
    until = clock() + budget_s
    for name, (uids, violations) in given.items():
        if clock() > until:
            log.info("preempt: time budget spent, nodes left out", extra={"pod": pod.key, "answered": len(out)})
            break
        node = state.nodes.get(name)
        if node is None:
            continue
        keys = [k for k in node.pods if k in books.pods]
        guarded = protected({k: (books.pods[k].namespace, books.pods[k].labels) for k in keys}, pdbs)
        facts = {
            k: VictimFacts(books.pods[k].priority, books.pods[k].created, k in guarded)
            for k in keys
            if books.pods[k].uid
        }
        try:
            rank = planner.rank_on(node, pod)
        except UnknownPolicyError as exc:
            # Annotations are mutable and the webhook acts on CREATE: a pod naming no known policy fits nowhere, as
            # its /filter said (every node unresolvable), so no victim set can help it.
            log.info("preempt: pod can never fit", extra={"pod": pod.key, "error": str(exc)})
            return {}
        choice = choose_victims(node, pod, state.config, rank, facts, priority)
        if choice is None:
            if uids and isinstance(fit_node(node, pod, state.config, rank), NodePlacement):
                out[name] = _meta(uids, violations)  # our books have room: its in-tree reasons stand
            continue
        # Its victims that hold no slice were chosen for CPU or memory: they stay.
        keep = [u for u in uids if by_uid.get(u) not in node.pods]
        chosen = [books.pods[k].uid for k in choice.victims]
        out[name] = _meta(chosen + [u for u in keep if u not in chosen], choice.cost[0])
        log.info(
            "preemption victims",
            extra={"pod": pod.key, "node": name, "victims": list(choice.victims), "kube_scheduler_chose": len(uids)},
        )
    return out


def _meta(uids: list[str], violations: int) -> dict[str, Any]:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": violations}


def given_victims(
    args_meta: Mapping[str, Any] | None, args_full: Mapping[str, Any] | None
) -> dict[str, tuple[list[str], int]]:
    """node -> (victim UIDs, NumPDBViolations) from either form of ExtenderPreemptionArgs (Go field names, matched
    case-insensitively as Go's encoding/json does). The wire model refuses wrong types with a 400
    (scheduler_extender.schema); a body made without it still never raises here: a victim that is not an object, or
    has no string UID, is skipped."""
    out: dict[str, tuple[list[str], int]] = {}
    source = args_meta if args_meta is not None else (args_full or {})
    for node, victims in source.items():
        v = {str(k).lower(): val for k, val in (victims or {}).items()} if isinstance(victims, Mapping) else {}
        pods = v.get("pods")
        uids: list[str] = []
        for p in pods if isinstance(pods, list) else ():
            if not isinstance(p, Mapping):
                continue
            if args_meta is not None:
                uid = next((val for k, val in p.items() if str(k).lower() == "uid"), "")
            else:
                meta = next((val for k, val in p.items() if str(k).lower() == "metadata"), None)
                uid = (
                    next((val for k, val in meta.items() if str(k).lower() == "uid"), "")
                    if isinstance(meta, Mapping)
                    else ""
                )
            if isinstance(uid, str) and uid:
                uids.append(uid)
        n = v.get("numpdbviolations") or 0
        out[str(node)] = (uids, n if isinstance(n, int) else 0)
    return out
