"""What learning placement policies (fragaware) are fed: pods arriving at /filter, in batches, and running pods once.

A relearn re-scores every node once for every active pod shape (~0.1 s of CPU a shape at 5,000 nodes since node classes, on the request
path), so after a first picture (`LEARN_BOOTSTRAP` pods) arrivals are fed at most once per relearn interval.
Running pods that hold our assignments seed the picture (the first pod list, then each one the pod watch shows
that this replica never fed: on a standby, every pod the leader places, so taking over needs no list of all pods)
and are never fed again: not by a second seeding, not as "first seen" at /filter. A pod this replica fed at /filter
and bound is not fed again when the watch shows it bound; a pod it binds without having fed it (the previous leader
saw its /filter, then failed over) is fed once when the watch shows it running, as the leader's other pods are.

Not thread-safe: callers hold the state lock, except around `first_seen`, which only /filter calls (one thread).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from scheduler_extender.metrics import ExtenderMetrics
from vgpu import annotations as ann
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.pod import PodInfo, is_finished, pod_key, pod_uid

log = logging.getLogger(__name__)

LEARN_BOOTSTRAP = 16
RECENT_PODS = 4096  # UIDs remembered as seen: a pod re-filtered within this many others is not "first seen" again
# UIDs remembered as fed at /filter until bound or deleted: a bind tells a pod fed here from one the previous leader
# saw (~100 bytes each; a pod bound more than this many new pods after its first /filter is learned twice).
FED_PODS = 32768

Candidates = list[tuple[str, PodInfo]]  # (UID, the pod's parse) of running pods that hold an assignment


class Observer(Protocol):
    """The placement side: `vgpu.planner.Planner`. Raises UnknownPolicyError for a pod naming no known policy."""

    def observe(self, pod: PodInfo) -> None: ...


def seed_candidates(
    pods: Iterable[Mapping[str, Any]], parse: Callable[[Mapping[str, Any]], PodInfo]
) -> tuple[Candidates, Counter[str]]:
    """The listed pods that hold one of our assignments and still run, parsed; the others that hold one are
    counted by why they were skipped. Needs no lock."""
    out: Candidates = []
    skipped: Counter[str] = Counter()
    for pod in pods:
        if ann.POD_ASSIGNMENT not in ((pod.get("metadata") or {}).get("annotations") or {}) or is_finished(pod):
            continue
        try:
            info = parse(pod)
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
        out.append((pod_uid(pod), info))
    return out, skipped


class Learning:
    def __init__(
        self,
        policy: Observer,
        *,
        relearn_interval_s: float = 60.0,
        bootstrap: int = LEARN_BOOTSTRAP,
        metrics: ExtenderMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.relearn_interval_s = relearn_interval_s
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.clock = clock
        self._queued: list[PodInfo] = []
        self._learned = 0
        self._last_learn = float("-inf")
        self._recent: OrderedDict[str, None] = OrderedDict()  # UIDs /filter saw, oldest first
        # UIDs of running pods that seeded learning, and of pods this replica is binding (fed at /filter already)
        self._seeded: set[str] = set()
        self._fed: OrderedDict[str, None] = OrderedDict()  # UIDs fed at /filter, not bound or deleted yet, oldest first

    @property
    def queued(self) -> int:
        """Arrivals waiting for the next relearn."""
        return len(self._queued)

    @property
    def learned(self) -> int:
        return self._learned

    def first_seen(self, uid: str) -> bool:
        """Note that /filter got this pod; True only the first time, and never for a pod that seeded learning."""
        if not uid:
            return False
        new = uid not in self._recent and uid not in self._seeded and uid not in self._fed
        self._recent[uid] = None
        self._recent.move_to_end(uid)
        if len(self._recent) > RECENT_PODS:
            self._recent.popitem(last=False)
        if new:
            self._fed[uid] = None
            if len(self._fed) > FED_PODS:
                self._fed.popitem(last=False)
        return new

    def knows(self, uid: str) -> bool:
        """This pod was fed already (seeded, or seen at /filter), or has no UID to tell it by: do not feed it again."""
        return not uid or uid in self._seeded or uid in self._recent or uid in self._fed

    def binding(self, uid: str) -> None:
        """This replica binds the pod. If its /filter fed it here, the watch showing it bound must not feed it again
        (the /filter memory holds only the last `RECENT_PODS`, and a bind may come later than that: `_fed` keeps it
        until now). If not (the previous leader filtered it, this replica took over before its bind), nothing is
        noted, and the watch feeds it as a running pod: before, such a pod was never learned.

        Called by BindVerb only once the pod is read from the apiserver under the bind's UID: a refused bind naming a
        UID before its pod's first /filter made that pod never learned, and made-up UIDs were kept without bound (200
        binds with 64 KiB UIDs: 12.5 MiB), while the set now holds only real pods' UIDs (dropped on DELETED and
        relists)."""
        if uid and (uid in self._fed or uid in self._recent):
            self._fed.pop(uid, None)
            self._seeded.add(uid)

    def running(self, uid: str, candidates: Candidates, skipped: Counter[str]) -> bool:
        """One pod the watch shows running with our assignment, as `seed_candidates` takes it (`candidates` empty
        when it was skipped): fed as a seeding feeds it (one observe, counted towards the bootstrap), never twice,
        without a relearn of the arrivals queued; a skipped pod is not tried again. True if it was fed."""
        if self.knows(uid):
            return False
        self._seeded.add(uid)
        fed = False
        for _, info in candidates:
            if self._observe_running(info, skipped):
                fed = True
                self._learned += 1
        self._count_seeded(1 if fed else 0, skipped)
        return fed

    def _observe_running(self, info: PodInfo, skipped: Counter[str]) -> bool:
        """Feed one running pod; a pod naming an unknown policy is counted as skipped, not fed."""
        try:
            self.policy.observe(info)
        except UnknownPolicyError as exc:
            skipped["unknown-policy"] += 1
            log.warning("not learning from running pod", extra={"pod": info.key, "error": str(exc)})
            return False
        return True

    def _count_seeded(self, seeded: int, skipped: Counter[str]) -> None:
        if self.metrics is not None:
            if seeded:
                self.metrics.learning_seeded.inc(seeded)
            for reason, n in skipped.items():
                self.metrics.learning_seed_skipped.labels(reason).inc(n)

    def arrived(self, info: PodInfo) -> None:
        """Feed an arriving pod; batched so a burst causes at most one relearn per interval."""
        self._queued.append(info)
        now = self.clock()
        if self._learned >= self.bootstrap and now - self._last_learn < self.relearn_interval_s:
            return
        self._flush(now)

    def _flush(self, now: float) -> None:
        for pod in self._queued:
            try:
                self.policy.observe(pod)
            except UnknownPolicyError:
                continue  # its filter reports the bad annotation; it must not poison the batch
        self._learned += len(self._queued)
        self._queued.clear()
        self._last_learn = now

    def seed(self, candidates: Candidates, skipped: Counter[str]) -> int:
        """Feed running pods not seeded before as one batch (one observe each); returns how many were fed.

        They count towards the bootstrap and as a relearn, so /filter's batches carry on from here; arrivals
        queued before are fed in the same batch.
        """
        now = self.clock()
        self._flush(now)
        seeded = 0
        for uid, info in candidates:
            if uid and (uid in self._seeded or uid in self._recent):
                continue
            if not self._observe_running(info, skipped):
                continue
            seeded += 1
            if uid:
                self._seeded.add(uid)
        self._learned += seeded
        self._last_learn = now
        self._count_seeded(seeded, skipped)
        log.info(
            "learning seeded from running pods",
            extra={"seeded": seeded, "skipped": sum(skipped.values()), "skipped_by_reason": dict(skipped)},
        )
        return seeded

    def forget(self, uid: str) -> None:
        """The pod is deleted or finished: a pod with its UID will never run again."""
        self._seeded.discard(uid)
        self._fed.pop(uid, None)

    def keep_only(self, uids: Iterable[str]) -> None:
        """A relist: forget the seeded and fed pods it no longer holds."""
        if self._seeded or self._fed:
            listed = set(uids)
            self._seeded &= listed
            for uid in [u for u in self._fed if u not in listed]:
                del self._fed[uid]
