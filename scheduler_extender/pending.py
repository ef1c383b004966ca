"""The pods /filter last found no node for, and the nudge that makes kube-scheduler retry them.

When capacity frees (a release, a node joining or changing), kube-scheduler may retry a rejected pod before the
extender has seen the change, and then leave it in its unschedulable pool for minutes; so the rejected pods are
handed, oldest rejection first, to a nudger (`scheduler_extender.requeue.Requeuer`) that patches them. Without a
nudger (the file source) they are only counted.

What is kept is bounded: a /filter body is the caller's, and a made-up pod never gets the watch event (bound,
deleted) that ends a real one's entry. So an entry lasts `TTL_S` after its pod's last rejection (a real pending pod
comes back sooner: kube-scheduler retries an unschedulable pod at least every podMaxInUnschedulablePodsDuration, 5
minutes by default: kubernetes v1.34 pkg/scheduler/backend/queue/scheduling_queue.go,
DefaultPodMaxInUnschedulablePodsDuration), at most `MAX_PENDING` are kept (the oldest rejection goes first), a pod
kube would not hold (a namespace over 63 or a name over 253 characters, a UID over 128) is not kept at all, and a
pod list drops what it does not hold (`keep_only`).

Not thread-safe: callers hold the state lock. Nothing here does I/O; the nudger only queues.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from scheduler_extender.schema import MAX_NAME, MAX_NAMESPACE, MAX_UID

TTL_S = 600.0  # twice kube-scheduler's default podMaxInUnschedulablePodsDuration
MAX_PENDING = 5000


class Nudger(Protocol):
    """Asks kube-scheduler to retry pods; `request` and `forget` queue only, they never block on I/O."""

    def request(self, pods: Iterable[tuple[str, str]]) -> int: ...

    def forget(self, key: str) -> None: ...


class Pending:
    def __init__(
        self,
        nudger: Nudger | None = None,
        *,
        on_count: Callable[[int], None] = lambda n: None,
        ttl_s: float = TTL_S,
        max_pods: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nudger = nudger
        self._count = on_count
        self.ttl_s = ttl_s
        self.max_pods = max_pods
        self.clock = clock
        self._pods: dict[str, tuple[str, float]] = {}  # pod key -> (UID, when rejected), oldest rejection first

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)

    def filtered(self, key: str, uid: str, *, fits: bool) -> None:
        """/filter's outcome for this pod; a rejection moves it to the back (the newest rejection). A pod kube
        would not hold is not kept; over `max_pods`, the oldest rejections are forgotten."""
        self._pods.pop(key, None)
        if not fits and _holdable(key, uid):
            self._pods[key] = (uid, self.clock())
            while len(self._pods) > self.max_pods:
                self._forget(next(iter(self._pods)))
        self._expire()
        self._count(len(self._pods))

    def done(self, key: str) -> None:
        """The pod was bound or deleted: no longer pending, never nudged."""
        if self._pods.pop(key, None) is not None:
            self._count(len(self._pods))
        if self.nudger is not None:
            self.nudger.forget(key)

    def gone(self, key: str, uid: str) -> None:
        """A nudge found no pod under this key and UID (404, or 409: the name holds another UID now): the entry
        ends, unless /filter has since rejected the pod the name holds now (another UID)."""
        entry = self._pods.get(key)
        if entry is not None and entry[0] == uid:
            self._forget(key)
            self._count(len(self._pods))

    def keep_only(self, keys: Iterable[str], *, rejected_before: float | None = None) -> None:
        """A pod list: the pending pods it does not hold were deleted (while the watch was down) or never existed.
        `rejected_before`: when the list was read (this clock); a pod rejected since may have been created after
        the read, so only entries rejected before it are dropped (None: every entry the list does not hold)."""
        listed = set(keys)
        until = float("inf") if rejected_before is None else rejected_before
        gone = [k for k, (_, when) in self._pods.items() if k not in listed and when < until]
        for key in gone:
            self._forget(key)
        if gone:
            self._count(len(self._pods))

    def capacity_freed(self) -> None:
        """Slices were released or a node changed: ask for a retry of every pending pod."""
        if self._expire():
            self._count(len(self._pods))
        if self.nudger is not None and self._pods:
            self.nudger.request([(key, uid) for key, (uid, _) in self._pods.items()])

    def _expire(self) -> bool:
        """Forget the pods not rejected again within `ttl_s` (oldest first, so only the expired ones are looked
        at); True if any was."""
        until, expired = self.clock() - self.ttl_s, False
        while self._pods:
            key, (_, when) = next(iter(self._pods.items()))
            if when > until:
                break
            self._forget(key)
            expired = True
        return expired

    def _forget(self, key: str) -> None:
        del self._pods[key]
        if self.nudger is not None:
            self.nudger.forget(key)


def _holdable(key: str, uid: str) -> bool:
    """A pod the apiserver could hold under this key and UID (longer names are refused there)."""
    namespace, _, name = key.partition("/")
    return len(namespace) <= MAX_NAMESPACE and len(name) <= MAX_NAME and len(uid) <= MAX_UID
