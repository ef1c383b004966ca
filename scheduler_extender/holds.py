"""Soft holds: where a pod /prioritize ranked first is about to be bound, so the pods scored next look elsewhere.

kube-scheduler binds asynchronously: after /prioritize it assumes pod P on its best node and goes on to score
the next pod Q while P's /bind is still on its way. The extender learns P's placement only at /bind, so Q, of the
same shape, ranks the very same GPU first, and one of the two binds is refused "no longer fits" and scheduled
again (a cycle, an event and a backoff; 124 to 221 of 1,000 pods at 200 nodes in benchmarks/scale.py).

So /prioritize leaves P a hold on its first-ranked node: the slices P would take there, for `ttl_s` or until P is
bound, refused at bind or deleted. When Q is scored, a node ranked first that Q does not fit on beside the holds
there scores 0 instead (and the next node is looked at the same way). A hold only ever lowers other pods' scores:
/filter never sees it, so it cannot make a pod unschedulable, and a stale one costs at most a less packed choice.

Not thread-safe: callers hold the state lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from vgpu.annotations import Assignment

# kube-scheduler's extender httpTimeout (scheduler_extender.bind.DEFAULT_HTTP_TIMEOUT_S): a bind arrives within it.
DEFAULT_TTL_S = 5.0


@dataclass(frozen=True, slots=True)
class Hold:
    key: str
    node: str
    assignment: Assignment
    until: float


class SoftHolds:
    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._by_pod: dict[str, Hold] = {}
        self._by_node: dict[str, dict[str, Hold]] = {}

    def __len__(self) -> int:
        return len(self._by_pod)

    def __contains__(self, key: object) -> bool:
        return key in self._by_pod

    def hold(self, key: str, node: str, assignment: Assignment) -> None:
        """`key` ranked `node` first and would take `assignment` there (replacing any earlier hold of it)."""
        self.drop(key)
        h = Hold(key, node, assignment, self.clock() + self.ttl_s)
        self._by_pod[key] = h
        self._by_node.setdefault(node, {})[key] = h

    def drop(self, key: str) -> None:
        """The pod is being bound, was deleted or is bound: its hold goes."""
        h = self._by_pod.pop(key, None)
        if h is not None:
            on_node = self._by_node[h.node]
            del on_node[key]
            if not on_node:
                del self._by_node[h.node]

    def on(self, node: str, *, other_than: str) -> list[Hold]:
        """The live holds on `node` of pods other than `other_than`; expired ones are dropped on the way."""
        held = self._by_node.get(node)
        if not held:
            return []
        now = self.clock()
        for key in [k for k, h in held.items() if h.until <= now]:
            self.drop(key)
        return [h for k, h in (self._by_node.get(node) or {}).items() if k != other_than]


def steer(prios: dict[str, int], blocked: Callable[[str], bool]) -> tuple[dict[str, int], str | None]:
    """Lower to 0 the best-ranked nodes that `blocked` says the pod cannot share with the holds there, best first,
    until the best one left is not blocked. Returns the new priorities (a copy when any changed) and that node
    (None when no node scores). Scores are only ever lowered, never raised."""
    if not prios:
        return prios, None
    best = max(prios, key=prios.__getitem__)  # linear: the common case, no hold in the way
    if prios[best] <= 0:
        return prios, None
    if not blocked(best):
        return prios, best
    out = dict(prios)
    out[best] = 0
    for node in sorted(prios, key=prios.__getitem__, reverse=True):
        if node == best:
            continue
        if prios[node] <= 0:
            break
        if not blocked(node):
            return out, node
        out[node] = 0
    return out, None
