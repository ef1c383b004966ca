"""The pods /filter last found no node for, and the nudge that makes kube-scheduler retry them.

When capacity frees (a release, a node joining or changing), kube-scheduler may retry a rejected pod before the
extender has seen the change, and then leave it in its unschedulable pool for minutes; so the rejected pods are
handed, oldest rejection first, to a nudger (`scheduler_extender.requeue.Requeuer`) that patches them. Without a
nudger (the file source) they are only counted.

Not thread-safe: callers hold the state lock. Nothing here does I/O; the nudger only queues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol


class Nudger(Protocol):
    """Asks kube-scheduler to retry pods; `request` and `forget` queue only, they never block on I/O."""

    def request(self, pods: Iterable[tuple[str, str]]) -> int: ...

    def forget(self, key: str) -> None: ...


class Pending:
    def __init__(self, nudger: Nudger | None = None, *, on_count: Callable[[int], None] = lambda n: None) -> None:
        self.nudger = nudger
        self._count = on_count
        self._pods: dict[str, str] = {}  # pod key -> UID, oldest rejection first

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)

    def filtered(self, key: str, uid: str, *, fits: bool) -> None:
        """/filter's outcome for this pod; a rejection moves it to the back (the newest rejection)."""
        self._pods.pop(key, None)
        if not fits:
            self._pods[key] = uid
        self._count(len(self._pods))

    def done(self, key: str) -> None:
        """The pod was bound or deleted: no longer pending, never nudged."""
        if self._pods.pop(key, None) is not None:
            self._count(len(self._pods))
        if self.nudger is not None:
            self.nudger.forget(key)

    def capacity_freed(self) -> None:
        """Slices were released or a node changed: ask for a retry of every pending pod."""
        if self.nudger is not None and self._pods:
            self.nudger.request(list(self._pods.items()))
