"""Translate Kubernetes Node and Pod objects into cluster-state changes.

The apiserver is the source of truth: node inventories come from the device plugin's annotation,
allocations from the pods' assignment annotations, so replaying a list of nodes and pods rebuilds
exactly the state a previous extender had.

Nothing a pod author writes decides how long capacity stays held: an unbound reservation lives for the bind
grace from when *this extender* first saw it (its own monotonic clock), never from `vgpu.io/bind-time`, which
is written for humans only. An assignment that would over-commit a GPU is not honoured: it is reported
(metric, error log) and kept aside, and counted only once it fits (vgpu.claims says which claim wins).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scheduler_extender import assignment_memo
from vgpu import annotations as ann
from vgpu import cordon, kubelet_topology
from vgpu.claims import Claim, order_key, settle
from vgpu.devices import NodeInventory
from vgpu.errors import CapacityError, CodecError
from vgpu.pod import bound_node, is_finished, pod_key, pod_uid
from vgpu.state import ClusterState

log = logging.getLogger(__name__)


class StateSync:
    """Applies watch events to the state. Callers hold the state lock around every call."""

    def __init__(
        self,
        state: ClusterState,
        *,
        is_inflight: Callable[[str], bool] = lambda key: False,
        on_problem: Callable[[str, str], None] = lambda kind, msg: None,
        bind_grace_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self._is_inflight = is_inflight
        self._problem = on_problem
        self.bind_grace_s = bind_grace_s
        self.clock = clock
        # Assignments written by a bind whose Binding we have not seen: key -> when they stop counting.
        self.unbound: dict[str, float] = {}
        # The UID of the pod whose unbound assignment the watch showed (`unbound_uid`): only that pod, filtered
        # again, may drop the reservation early (scheduler_extender.reservations.Reservations.release_stale).
        self._unbound_uids: dict[str, str] = {}
        # key -> when this extender first saw the pod's unbound reservation (or made it): the deadline's start.
        # Kept after the reservation expired, so rewriting the annotation never buys a new grace.
        self.first_seen: dict[str, float] = {}
        # Claims refused because they over-commit a GPU: retried, best first, whenever capacity frees.
        self.contested: dict[str, Claim] = {}
        # node -> the cordon problems last reported, so a periodic inventory write does not repeat them.
        self._cordon_reported: dict[str, tuple[str, ...]] = {}

    # -- nodes ----------------------------------------------------------------------------------

    def node_event(self, kind: str, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        annotations = meta.get("annotations") or {}
        raw = annotations.get(ann.NODE_INVENTORY)
        if kind == "DELETED" or raw is None:
            self._cordon_reported.pop(name, None)
            self.state.remove_node(name)
            return
        try:
            gpus = ann.decode_inventory(raw)
            kubelet = kubelet_topology.policy_of(raw)  # the node's Topology Manager: which GPUs it will offer
        except CodecError as exc:
            self._problem("inventory", f"node {name}: {exc}")
            log.warning("ignoring node inventory", extra={"node": name, "error": str(exc)})
            return
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        cordoned = cordon.parse_cordon(annotations, (g.uuid for g in gpus))
        self._report_cordon(name, tuple(cordon.problems(name, cordoned)))
        self.state.upsert_node(NodeInventory(name=name, gpus=gpus, labels=labels, cordon=cordoned, kubelet=kubelet))

    def _report_cordon(self, name: str, problems: tuple[str, ...]) -> None:
        """Log and count a node's cordon entries that cannot be honoured as written, once per change."""
        if self._cordon_reported.get(name, ()) == problems:
            return
        self._cordon_reported[name] = problems
        for message in problems:
            self._problem("cordon", message)
            log.error("GPU cordon entry not honoured as written", extra={"node": name, "error": message})

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        seen: set[str] = set()
        for node in nodes:
            self.node_event("ADDED", node)
            seen.add(str((node.get("metadata") or {}).get("name") or ""))
        for name in [n for n in self.state.nodes if n not in seen]:
            self.state.remove_node(name)

    # -- pods -----------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        if kind == "DELETED" or is_finished(pod):
            self._forget(key)
            self._release(key)
            return
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(ann.POD_ASSIGNMENT)
        if raw is None:
            if not self._is_inflight(key):
                self.first_seen.pop(key, None)
                if self.contested.pop(key, None) is not None:
                    self.state.conflicts.pop(key, None)
            return  # not ours yet; an in-flight bind's reservation lives only in the state
        try:
            bind_phase = ann.decode_bind_phase(annotations.get(ann.POD_BIND_PHASE, ann.BindPhase.ALLOCATING.value))
            assignment = assignment_memo.decode(raw)  # once per text: every MODIFIED event carries it
        except CodecError as exc:
            self._problem("assignment", f"pod {key}: {exc}")
            log.warning("ignoring pod assignment", extra={"pod": key, "error": str(exc)})
            return
        if bind_phase is ann.BindPhase.FAILED:
            if not self._is_inflight(key):
                self._forget(key)
                self._release(key)
            return
        node = bound_node(pod)
        bound = bool(node)
        if bound and node != assignment.node:
            # The annotation names another node than the one the pod runs on: ours never do (the Binding carries
            # the assignment it names), so it was written by hand. Honouring it would hold slices on a node the pod
            # is not on; the device plugin where it runs refuses it anyway.
            self._problem(
                "assignment", f"pod {key}: its assignment names node {assignment.node!r}, it is bound to {node!r}"
            )
            log.warning(
                "ignoring an assignment for another node than the pod's",
                extra={"pod": key, "assignment_node": assignment.node, "node": node},
            )
            self._forget(key)
            self._release(key)
            return
        if bound:
            self.unbound.pop(key, None)
            self._unbound_uids.pop(key, None)
            self.first_seen.pop(key, None)
        elif not self._is_inflight(key):
            # An assignment on an unbound pod: ours arrive with the Binding, so an extender of an earlier release
            # wrote it before its Binding (an upgrade), or someone by hand. The Binding may still land, so the slices
            # stay reserved — for the bind grace from when we first saw it, never as a lock that outlives it.
            now = self.clock()
            deadline = self.first_seen.setdefault(key, now) + self.bind_grace_s
            if deadline <= now:
                self.unbound.pop(key, None)
                self._unbound_uids.pop(key, None)
                self.contested.pop(key, None)
                self._release(key)
                return
            self.unbound[key] = deadline
            self._unbound_uids[key] = pod_uid(pod)
        current = self.state.assignments.get(key) or self.state.orphans.get(key)
        if current == assignment:
            return
        if current is not None:
            if self._is_inflight(key):
                return  # our own bind is rewriting it; the watch shows an older version
            self._release(key)
        created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        claim = Claim(key=key, assignment=assignment, bound=bound, created=created)
        try:
            self.state.apply(key, assignment)
        except CapacityError as exc:
            self.contested[key] = claim
            self.state.conflicts[key] = str(exc)
            self._problem("conflict", str(exc))
            log.error(
                "not honouring an assignment that over-commits a GPU",
                extra={"pod": key, "error": str(exc), "bound": bound},
            )
            return
        self.contested.pop(key, None)

    def own_bind(self, key: str) -> None:
        """Our bind is writing an assignment for this pod now: its reservation's grace starts now."""
        self.first_seen[key] = self.clock()
        self.contested.pop(key, None)

    def hold_unbound(self, key: str) -> None:
        """Keep this pod's slices as an unbound reservation until the bind grace, from our own bind's start."""
        self.unbound[key] = self.first_seen.setdefault(key, self.clock()) + self.bind_grace_s
        self._unbound_uids.pop(key, None)  # ours: only the watch or a fence settles it (Reservations.unsettled)

    def unbound_uid(self, key: str) -> str:
        """The UID of the pod the watch showed holding this unbound reservation; "" for our own binds' (and none)."""
        return self._unbound_uids.get(key, "") if key in self.unbound else ""

    def drop_unbound(self, key: str) -> None:
        """The reservation is no longer unbound-held (settled, fenced or dropped by its own pod's return)."""
        self.unbound.pop(key, None)
        self._unbound_uids.pop(key, None)

    def _forget(self, key: str) -> None:
        self.drop_unbound(key)
        self.first_seen.pop(key, None)
        self.contested.pop(key, None)

    def _release(self, key: str) -> None:
        """Release a pod's slices; freed capacity may let a refused claim in (vgpu.claims, rule 3)."""
        if self.state.release(key) is not None:
            self.settle()

    def settle(self) -> list[str]:
        """Apply the refused claims that fit now; returns their pods."""
        if not self.contested:
            return []
        applied, refused = settle(self.state, self.contested)
        for key in applied:
            del self.contested[key]
            log.info("an assignment refused before fits now and is counted", extra={"pod": key})
        for key, reason in refused.items():
            self.state.conflicts[key] = reason
        return applied

    def expire_unbound(self) -> list[str]:
        """Release reservations of binds that never completed within the grace; returns their pods."""
        now = self.clock()
        expired = [k for k, deadline in self.unbound.items() if deadline <= now and not self._is_inflight(k)]
        for key in expired:
            self.drop_unbound(key)
            if self.state.assignments.get(key) is not None or key in self.state.orphans:
                self._release(key)
                log.info("released the reservation of a bind that never completed", extra={"pod": key})
        return expired

    def replace_pods(self, pods: Iterable[Mapping[str, Any]], *, listed_at: float | None = None) -> None:
        """A relist: apply every pod, then release what the list no longer holds. `listed_at` (this clock): when the
        list was read; a reservation our bind made since (`own_bind`) is for a pod the list may not hold yet (created
        after the read; at 40k pods a list is applied seconds later), and stays until the watch settles it."""
        pods = sorted(pods, key=_list_order)  # claims seen together: vgpu.claims, rule 2
        seen: set[str] = set()
        for pod in pods:
            self.pod_event("ADDED", pod)
            seen.add(pod_key(pod))
        if listed_at is not None:
            seen.update(k for k, since in self.first_seen.items() if since >= listed_at)
        held = list(self.state.assignments) + list(self.state.orphans)
        for key in held:
            if key not in seen and not self._is_inflight(key):
                self._forget(key)
                self._release(key)
        for key in [k for k in (*self.first_seen, *self.contested) if k not in seen and not self._is_inflight(k)]:
            self._forget(key)
            self.state.conflicts.pop(key, None)


def _list_order(pod: Mapping[str, Any]) -> tuple[bool, str, str]:
    created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    return order_key(bound=bool(bound_node(pod)), created=created, key=pod_key(pod))
