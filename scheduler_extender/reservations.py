"""The slices /bind holds while its apiserver calls are in flight, and the unbound reservations it leaves behind.

`reserve` chooses GPUs on fresh state and applies them before any I/O, so concurrent binds never over-commit a GPU
and never wait on each other's round trips; a refusal (`Refused`) changes nothing. The bind then ends in `bound`,
`roll_back` (its Binding, which carries the assignment, was refused or never sent: nothing was written) or
`unsettled` (its Binding may still land: held until the watch or a fence settles it). An assignment some other
writer left on an unbound pod (an extender of an earlier release wrote it before its Binding) stays reserved for
the bind grace on this extender's own clock (`scheduler_extender.sync`), and is dropped earlier when its pod comes
back to /filter.

Not thread-safe: callers hold the state lock. Releasing capacity calls `on_freed` (the pending pods' nudge).
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_extender.sync import StateSync
from vgpu.annotations import Assignment
from vgpu.errors import CapacityError, UnknownPolicyError
from vgpu.planner import Planner
from vgpu.pod import PodInfo
from vgpu.state import ClusterState


class Refused(Exception):
    """A bind refused before anything changed; the message says why."""


class Reservations:
    def __init__(
        self,
        state: ClusterState,
        planner: Planner,
        sync: StateSync,
        *,
        on_freed: Callable[[], None] = lambda: None,
        on_count: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.state = state
        self.planner = planner
        self.sync = sync
        self._freed = on_freed
        self._count = on_count
        self._inflight: set[str] = set()  # pods whose bind is between `reserve` and `bound`/`roll_back`
        # Pods whose Binding may still land (`unsettled`), with their UID and the resourceVersion it was sent on: held
        # until the watch shows them bound or gone, or a fence (`due_fences`, `fenced`) made sure it can no longer land.
        self._unknown: dict[str, tuple[str, str]] = {}

    def __contains__(self, key: object) -> bool:
        """A bind of this pod is in flight: between `reserve` and its end, or its Binding's outcome is unknown (the
        watch sync then neither expires nor relist-releases its slices)."""
        return key in self._inflight or key in self._unknown

    def __len__(self) -> int:
        return len(self._inflight)

    def reserve(self, key: str, node: str, info: PodInfo) -> Assignment | None:
        """Start a bind of `info` to `node`: hold the slices it needs there (None for a pod that asks for no GPU).
        Raises Refused, with nothing changed, for a pod already being bound, one holding a live assignment
        (bound or reserved) and one that no longer fits."""
        if key in self._inflight:
            raise Refused("a bind of this pod is already in progress")
        held = self.state.assignments.get(key) or self.state.orphans.get(key)
        if held is not None:
            raise Refused(
                f"it holds a live assignment on {held.node}; refused until that is released "
                f"(the pod is deleted, its bind fails, or its reservation expires after {self.sync.bind_grace_s:g} s)"
            )
        assignment = None if info.request.is_empty else self._apply(key, node, info)
        self._inflight.add(key)
        self._count(len(self._inflight))
        return assignment

    def _apply(self, key: str, node: str, info: PodInfo) -> Assignment:
        try:
            # The pod shape's cached result while the node is at the version it was evaluated at (the cache is per node
            # version, policy and epoch: the same decision as a fresh fit, which it was only for a node that changed).
            result = self.planner.cached_result(node, info)
        except UnknownPolicyError as exc:
            raise Refused(str(exc)) from None
        if result.placement is None:
            raise Refused(f"no longer fits: {result.failure.reason if result.failure else 'does not fit'}")
        assignment = result.placement.assignment(info)
        try:
            self.state.apply(key, assignment)
        except CapacityError as exc:  # cannot happen after a fresh fit; keep it loud
            raise Refused(str(exc)) from None
        self.sync.own_bind(key)
        return assignment

    def bound(self, key: str) -> None:
        """The Binding landed: the slices stay held, now by a bound pod."""
        self._inflight.discard(key)
        self._count(len(self._inflight))

    def roll_back(self, key: str, assignment: Assignment | None) -> None:
        """The Binding failed: never sent, or refused with a status, so it cannot land, and as it carried the
        assignment nothing was written. Free what `reserve` held; refused claims and pending pods may fit now."""
        self._inflight.discard(key)
        self._count(len(self._inflight))
        if assignment is not None:
            self.state.release(key)
            self.sync.settle()
            self._freed()  # others may have been rejected while this bind held the slices

    def unsettled(self, key: str, uid: str = "", version: str = "") -> None:
        """The Binding's outcome is unknown (its call timed out and the check whether it landed failed or could
        not rule it out): the pod may be bound and running on these slices, so they stay held as an unbound
        reservation — until the watch shows the pod bound (then it holds them) or deleted, or, once the bind grace
        has passed on this extender's clock, a fence made sure the Binding can no longer land (`due_fences`).
        A Binding stuck in an apiserver whose etcd is down lands when etcd returns, long after any grace: releasing
        on the grace alone over-committed a GPU (tests/e2e/test_chaos_e2e.py, etcd restarted). Its own retry
        through /filter does not free them early."""
        self._inflight.discard(key)
        self._count(len(self._inflight))
        if self.state.assignments.get(key) is not None or key in self.state.orphans:
            self.sync.hold_unbound(key)
            self._unknown[key] = (uid, version)

    def due_fences(self) -> list[tuple[str, str, str]]:
        """(pod, UID, the version its Binding was sent on) of the unknown Bindings held past the grace: fence each
        (outside the lock) before `fenced`."""
        now = self.sync.clock()
        return [(k, uid, v) for k, (uid, v) in self._unknown.items() if self.sync.unbound.get(k, now) <= now]

    def fenced(self, key: str) -> None:
        """The pod's Binding can no longer land (a write on its version succeeded, the pod changed or went): free
        the slices it held, unless the watch has shown the pod bound meanwhile."""
        if self._unknown.pop(key, None) is None or key not in self.sync.unbound:
            return
        self.sync.drop_unbound(key)
        if self.state.release(key) is not None:
            self.sync.settle()
            self._freed()

    def release_stale(self, info: PodInfo) -> None:
        """Before evaluating a pod: expire reservations past their grace, and drop this pod's own unbound
        reservation, which an earlier bind of it left without its Binding (it is being scheduled again).

        Only the pod itself: the body's UID must be the UID of the pod the watch showed holding the reservation.
        A /filter or /prioritize body is the caller's, not the apiserver's; naming another pod's namespace/name
        under another UID freed that pod's slices, and the next pod could be placed onto them while its Binding
        may still land."""
        self.expire()
        if (
            info.key in self.sync.unbound
            and not info.node_name
            and info.uid
            and info.uid == self.sync.unbound_uid(info.key)
            and info.key not in self._inflight
            and info.key not in self._unknown
        ):
            # Only an unbound reservation: a /filter body naming a bound pod never frees that pod's slices.
            self.sync.drop_unbound(info.key)
            self.state.release(info.key)

    def expire(self) -> None:
        """Release the reservations of binds that never completed within the grace (not those whose Binding's
        outcome is unknown: they wait for a fence); forget unknown outcomes the watch has settled."""
        if self.sync.unbound and self.sync.expire_unbound():
            self._freed()
        for key in [k for k in self._unknown if k not in self.sync.unbound]:  # shown bound, or deleted
            del self._unknown[key]
