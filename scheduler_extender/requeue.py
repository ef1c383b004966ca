"""Nudge kube-scheduler to retry the pods the extender rejected, once capacity frees.

kube-scheduler and the extender see a pod deletion through separate watches. When kube-scheduler retries a
rejected pod before the extender has applied the deletion, /filter rejects it again and the pod sits in
kube-scheduler's unschedulable pool until the next cluster event or `podMaxInUnschedulablePodsDuration` (5 min).
So when the extender itself frees capacity it patches one annotation (`vgpu.io/requeue`) on each pending pod: an
update of the pod, which moves it out of that pool, and this time /filter sees the freed slices.

The patches run on a worker thread, outside the state lock and off the watch thread. Requests coalesce: a pod is
nudged at most once per `interval_s` (a later request is deferred to the end of the interval, never dropped), and
at most `max_pods` nudges go out per `interval_s` (0 disables the feature): the rest wait, earliest due first, for
the next interval, never dropped. Dropping what was over `max_pods` on each release let the first `max_pods` pods
rejected take every release's nudges for ever (made-up pods /filter rejected never leave scheduler_extender.pending
through a watch event): a real pod rejected after them was never nudged. What waits is bounded by what is pending
(scheduler_extender.pending.MAX_PENDING), and a pod whose nudge finds no such pod (404) or another UID under
its name (409) is handed to `on_gone`, which ends its pending entry: a made-up pod took a nudge of every release
for the whole TTL, ahead of the real pods rejected after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from scheduler_extender.metrics import ExtenderMetrics

log = logging.getLogger(__name__)

DEFAULT_MAX_PODS = 50
DEFAULT_INTERVAL_S = 2.0

# (namespace, name, uid) -> None; raises on failure. An exception with `status` 404 or 409 means the pod is gone
# or was recreated (the UID precondition failed): normal, silent.
Nudge = Callable[[str, str, str], None]


class Requeuer:
    def __init__(
        self,
        nudge: Nudge,
        *,
        max_pods: int = DEFAULT_MAX_PODS,
        interval_s: float = DEFAULT_INTERVAL_S,
        metrics: ExtenderMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nudge = nudge
        self.max_pods = max_pods
        self.interval_s = interval_s
        self.metrics = metrics
        self.clock = clock
        self._cond = threading.Condition()
        self._due: dict[str, tuple[str, float]] = {}  # pod key -> (UID, when to nudge it)
        self._last: dict[str, float] = {}  # pod key -> when it was last nudged
        # The current interval's start and how many nudges it sent: at most `max_pods` an interval.
        self._window: tuple[float, int] = (float("-inf"), 0)
        # (pod key, UID) of a pod the apiserver does not hold under that UID; called on the worker thread, outside
        # `_cond` (the service drops its pending entry under its own lock: scheduler_extender.pending.Pending.gone).
        self.on_gone: Callable[[str, str], None] | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.max_pods > 0

    def _count(self, outcome: str, n: int = 1) -> None:
        if self.metrics is not None and n:
            self.metrics.requeue_nudges.labels(outcome).inc(n)

    # -- called by the service (under its lock): cheap, no I/O --------------------------------------------------

    def request(self, pods: Iterable[tuple[str, str]]) -> int:
        """Queue a nudge for these pending pods (key, UID), oldest first; returns how many were queued. None is
        dropped: the worker sends at most `max_pods` an interval, earliest due first (`take_due`)."""
        if not self.enabled:
            return 0
        now = self.clock()
        queued = 0
        with self._cond:
            for key, uid in pods:
                queued += 1
                if key in self._due:
                    self._due[key] = (uid, self._due[key][1])  # already queued: coalesced
                    self._count("coalesced")
                    continue
                self._due[key] = (uid, max(now, self._last.get(key, float("-inf")) + self.interval_s))
            self._cond.notify()
        return queued

    def forget(self, key: str) -> None:
        """The pod was bound or deleted: it needs no nudge."""
        with self._cond:
            self._due.pop(key, None)

    def pending(self) -> dict[str, tuple[str, float]]:
        with self._cond:
            return dict(self._due)

    # -- the worker ----------------------------------------------------------------------------------------------

    def _room(self, now: float) -> int:
        """How many nudges the current interval may still send (a new interval starts once the last is over)."""
        start, sent = self._window
        if now - start >= self.interval_s:
            self._window = (now, 0)
            return self.max_pods
        return max(self.max_pods - sent, 0)

    def take_due(self, now: float | None = None) -> list[tuple[str, str]]:
        """The nudges due now, earliest due first (the oldest rejection among equals), at most what the interval
        has room for; the rest stay queued."""
        now = self.clock() if now is None else now
        with self._cond:
            due = [(when, key, uid) for key, (uid, when) in self._due.items() if when <= now]
            room = self._room(now) if due else 0
            due.sort(key=lambda d: d[0])  # stable: queue order among equal times
            out = [(key, uid) for _, key, uid in due[:room]]
            if out:
                start, sent = self._window
                self._window = (start, sent + len(out))
            for key, _ in out:
                del self._due[key]
                self._last[key] = now
            if len(self._last) > 4 * max(self.max_pods, 1):
                self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
        return out

    def run_once(self, now: float | None = None) -> int:
        """Send every nudge that is due; returns how many were attempted."""
        batch = self.take_due(now)
        for key, uid in batch:
            namespace, _, name = key.partition("/")
            try:
                self.nudge(namespace, name, uid)
            except Exception as exc:
                if getattr(exc, "status", None) in (404, 409):
                    self._count("gone")
                    if self.on_gone is not None:
                        self.on_gone(key, uid)
                    continue
                self._count("error")
                log.warning("could not nudge a pending pod", extra={"pod": key, "error": str(exc)})
                continue
            self._count("sent")
            log.debug("nudged a pending pod", extra={"pod": key})
        return len(batch)

    def _wait(self) -> None:
        with self._cond:
            if self._stopped:
                return
            if not self._due:
                self._cond.wait()
                return
            now = self.clock()
            start, sent = self._window
            if sent >= self.max_pods and now - start < self.interval_s:  # this interval's nudges are spent
                self._cond.wait(start + self.interval_s - now)
                return
            delay = min(due for _, due in self._due.values()) - now
            if delay > 0:
                self._cond.wait(delay)

    def _loop(self) -> None:
        while not self._stopped:
            self._wait()
            if self._stopped:
                return
            try:
                self.run_once()
            except Exception:  # never let the worker die
                log.exception("requeue worker failed")

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="requeue", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
