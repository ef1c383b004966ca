"""Translate Kubernetes Node and Pod objects into cluster-state changes.

The apiserver is the source of truth: node inventories come from the device plugin's annotation,
allocations from the pods' assignment annotations, so replaying a list of nodes and pods rebuilds
exactly the state a previous extender had.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vgpu import annotations as ann
from vgpu.devices import NodeInventory
from vgpu.errors import CapacityError, CodecError
from vgpu.state import ClusterState

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


class StateSync:
    """Applies watch events to the state. Callers hold the state lock around every call."""

    def __init__(
        self,
        state: ClusterState,
        *,
        is_inflight: Callable[[str], bool] = lambda key: False,
        on_problem: Callable[[str, str], None] = lambda kind, msg: None,
        bind_grace_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self._is_inflight = is_inflight
        self._problem = on_problem
        self.bind_grace_s = bind_grace_s
        self.clock = clock
        # Assignments written by a bind whose Binding we have not seen: key -> when they stop counting.
        self.unbound: dict[str, float] = {}

    # -- nodes ----------------------------------------------------------------------------------

    def node_event(self, kind: str, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        raw = (meta.get("annotations") or {}).get(ann.NODE_INVENTORY)
        if kind == "DELETED" or raw is None:
            self.state.remove_node(name)
            return
        try:
            gpus = ann.decode_inventory(raw)
        except CodecError as exc:
            self._problem("inventory", f"node {name}: {exc}")
            log.warning("ignoring node inventory", extra={"node": name, "error": str(exc)})
            return
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        self.state.upsert_node(NodeInventory(name=name, gpus=gpus, labels=labels))

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
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in TERMINAL_PHASES:
            self.unbound.pop(key, None)
            self.state.release(key)
            return
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(ann.POD_ASSIGNMENT)
        if raw is None:
            return  # not ours yet; an in-flight bind's reservation lives only in the state
        try:
            bind_phase = ann.decode_bind_phase(annotations.get(ann.POD_BIND_PHASE, ann.BindPhase.ALLOCATING.value))
            assignment = ann.decode_assignment(raw)
        except CodecError as exc:
            self._problem("assignment", f"pod {key}: {exc}")
            log.warning("ignoring pod assignment", extra={"pod": key, "error": str(exc)})
            return
        if bind_phase is ann.BindPhase.FAILED:
            if not self._is_inflight(key):
                self.unbound.pop(key, None)
                self.state.release(key)
            return
        if (pod.get("spec") or {}).get("nodeName"):
            self.unbound.pop(key, None)
        elif not self._is_inflight(key):
            # Written by a bind that has not (yet) created the Binding: it may still land, so the
            # slices stay reserved — but only for the bind grace, never as a lock that outlives it.
            deadline = self._bind_time(annotations) + self.bind_grace_s
            if deadline <= self.clock():
                self.unbound.pop(key, None)
                self.state.release(key)
                return
            self.unbound[key] = deadline
        current = self.state.assignments.get(key) or self.state.orphans.get(key)
        if current == assignment:
            return
        if current is not None:
            if self._is_inflight(key):
                return  # our own bind is rewriting it; the watch shows an older version
            self.state.release(key)
        try:
            self.state.apply(key, assignment)
        except CapacityError as exc:
            self.state.conflicts[key] = str(exc)
            self._problem("conflict", str(exc))
            log.error("assignment in the apiserver over-commits a GPU", extra={"pod": key, "error": str(exc)})

    @staticmethod
    def _bind_time(annotations: Mapping[str, Any]) -> float:
        try:
            return float(annotations.get(ann.POD_BIND_TIME, 0))
        except (TypeError, ValueError):
            return 0.0

    def expire_unbound(self) -> list[str]:
        """Release reservations of binds that never completed within the grace; returns their pods."""
        now = self.clock()
        expired = [k for k, deadline in self.unbound.items() if deadline <= now and not self._is_inflight(k)]
        for key in expired:
            del self.unbound[key]
            if self.state.assignments.get(key) is not None or key in self.state.orphans:
                self.state.release(key)
                log.info("released the reservation of a bind that never completed", extra={"pod": key})
        return expired

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A relist: apply every pod, then release what the list no longer holds."""
        seen: set[str] = set()
        for pod in pods:
            self.pod_event("ADDED", pod)
            seen.add(pod_key(pod))
        held = list(self.state.assignments) + list(self.state.orphans)
        for key in held:
            if key not in seen and not self._is_inflight(key):
                self.unbound.pop(key, None)
                self.state.release(key)
