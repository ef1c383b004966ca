"""Leader election over a coordination.k8s.io/v1 Lease: any number of replicas, one serves.

Two active extenders could both reserve the same free slice between their watch updates, so only the leader
answers /filter, /prioritize and /bind. Every replica keeps its watches running, so a standby takes over with a
current view, and the leader labels its own pod `vgpu.io/extender-leader=true`, which the Service selects, so
kube-scheduler always reaches the leader (scheduler_extender.leadership wires this).

The rules are client-go's: a lease is held while its record keeps changing; a candidate takes it over once it
has seen the same record for longer than the lease duration, measured on its own monotonic clock (so clock skew
between nodes does not matter); a leader that fails to renew for the renew deadline stops leading, and the
process then exits, so it comes back as a standby that rebuilt its state from the apiserver. A clean shutdown
releases the lease, and a standby takes over within one retry period instead of one lease duration.

Renewal time counts from when the renewing request was sent, not when its answer came: the standby sees the
record at or after it was written, so it cannot take over before sent + lease duration, while this leader stops
binding at sent + renew deadline (`valid_until`), earlier by lease - renew deadline. Each attempt's calls are bound
by the renew deadline (client-go v0.34 tools/leaderelection/leaderelection.go, renew(): every tryAcquireOrRenew runs
under context.WithTimeout(ctx, RenewDeadline), and the leader gives up once that passes without a renewal).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from scheduler_extender.deadline import within

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str  # "" once released
    duration_s: int
    acquire_time: dt.datetime | None = None
    renew_time: dt.datetime | None = None
    transitions: int = 0
    version: str = ""  # the object's resourceVersion: an update with a stale one conflicts


class Conflict(Exception):
    """The lease exists already (create) or changed since it was read (update): another candidate moved first."""


class LeaseStore(Protocol):
    def get(self) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord) -> LeaseRecord: ...

    def update(self, record: LeaseRecord) -> LeaseRecord: ...


class Attempt(Enum):
    HELD = "held"  # we hold the lease (acquired or renewed)
    OTHER = "other"  # another candidate holds a live lease
    FAILED = "failed"  # the apiserver did not answer, or another candidate won a race


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElector:
    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        *,
        lease_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_s: float = 2.0,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        on_holder: Callable[[str], None] = lambda holder: None,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        if not 0 < retry_s < renew_deadline_s < lease_s:
            raise ValueError(
                f"need 0 < retry ({retry_s} s) < renew deadline ({renew_deadline_s} s) < lease ({lease_s} s)"
            )
        self.store = store
        self.identity = identity
        self.lease_s = lease_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_s = retry_s
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.on_holder = on_holder
        self.monotonic = monotonic
        self.now = now
        self.leading = threading.Event()
        self.holder = ""  # the holder last observed, for messages
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one round ------------------------------------------------------------------------------------------------

    def valid_until(self) -> float:
        """Until when (on `monotonic`) this replica surely holds the lease: the renew deadline after the last
        successful renewal was sent; -inf while it does not lead."""
        return self._renewed_at + self.renew_deadline_s if self.leading.is_set() else -math.inf

    def attempt(self) -> Attempt:
        """Try once to acquire or renew the lease, within the renew deadline (a leader: what is left of it)."""
        sent = self.monotonic()
        until = self.valid_until() if self.leading.is_set() else sent + self.renew_deadline_s
        try:
            with within(until):
                return self._attempt(sent)
        except Conflict:
            return Attempt.FAILED
        except Exception as exc:  # the apiserver is away: a leader keeps trying until its renew deadline
            log.warning("leader election: lease not reachable", extra={"error": repr(exc)})
            return Attempt.FAILED

    def _attempt(self, sent: float) -> Attempt:
        current = self.store.get()
        if current is None:
            return self._won(self.store.create(self._claim(None)), sent)
        self._observe(current)
        live = self._observed_at + current.duration_s > self.monotonic()
        if current.holder and current.holder != self.identity and live:
            return Attempt.OTHER
        return self._won(self.store.update(self._claim(current)), sent)

    def _claim(self, current: LeaseRecord | None) -> LeaseRecord:
        now = self.now()
        ours = current is not None and current.holder == self.identity
        return LeaseRecord(
            holder=self.identity,
            duration_s=max(1, round(self.lease_s)),
            acquire_time=current.acquire_time if ours and current is not None else now,
            renew_time=now,
            transitions=(current.transitions + (0 if ours else 1)) if current else 0,  # client-go counts from "" too
            version=current.version if current else "",
        )

    def _observe(self, record: LeaseRecord) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = self.monotonic()
        if record.holder != self.holder:
            self.holder = record.holder
            self.on_holder(record.holder)

    def _won(self, stored: LeaseRecord, sent: float) -> Attempt:
        self._observe(stored)
        self._renewed_at = sent
        return Attempt.HELD

    # -- the loop ------------------------------------------------------------------------------------------------

    def step(self) -> bool:
        """One round of the loop; False once leadership was lost (the loop ends)."""
        result = self.attempt()
        if result is Attempt.HELD:
            if not self.leading.is_set():
                log.info("leader election: leading", extra={"identity": self.identity})
                self.leading.set()
                self.on_started()
            return True
        if self.leading.is_set() and (
            result is Attempt.OTHER or self.monotonic() - self._renewed_at >= self.renew_deadline_s
        ):
            log.error(
                "leader election: lost the lease",
                extra={"identity": self.identity, "holder": self.holder, "reason": result.value},
            )
            self.leading.clear()
            self.on_stopped()
            return False
        return True

    def run(self, after: threading.Event | None = None) -> None:
        """Loop until stopped or leadership is lost; with `after`, only once that is set (the state has synced: a
        replica that never synced must not lead)."""
        while after is not None and not after.wait(self.retry_s):
            if self._stop.is_set():
                return
        while not self._stop.is_set() and self.step():
            self._stop.wait(self.retry_s)

    def start(self, after: threading.Event | None = None) -> None:
        self._thread = threading.Thread(target=self.run, args=(after,), name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """End the loop; a leader gives the lease up (holder "", one second left) so a standby takes over now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_s + 5)
        if not self.leading.is_set():
            return
        self.leading.clear()
        if release and self._observed is not None:
            try:
                self.store.update(replace(self._observed, holder="", duration_s=1, renew_time=self.now()))
                log.info("leader election: released the lease", extra={"identity": self.identity})
            except Exception as exc:
                log.warning("leader election: could not release the lease", extra={"error": repr(exc)})
        self.on_stopped()
