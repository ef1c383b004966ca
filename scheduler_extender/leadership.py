"""What leading means for the extender, wired to `scheduler_extender.leader`'s election.

Leading: serve the verbs, label the own pod `vgpu.io/extender-leader=true` for the Service (clearing a label a
crashed leader left on its pod). Nothing is listed on taking over: a standby's pod watch already fed learning every
pod the leader placed (`ExtenderService.pod_event`), and the election starts only once that watch has synced, so
the new leader's first lease renewals never queue behind a list of every pod. Losing the lease: stop serving
and end the process (SIGTERM to itself), so it comes back as a standby with state rebuilt from the apiserver. A clean
shutdown releases the lease (`Election.release`). docs/extender.md, "Leader election".
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from scheduler_extender.kube import CoreApi, clear_other_leader_labels, lease_store, mark_leader
from scheduler_extender.leader import LeaderElector
from scheduler_extender.settings import ExtenderSettings

log = logging.getLogger(__name__)


class Replica(Protocol):
    """All the election drives in this replica (`scheduler_extender.service.ExtenderService` implements it)."""

    @property
    def ready(self) -> threading.Event:
        """Set once the state has synced: the election starts then, so a new leader never serves a cold state."""
        ...

    def set_leading(self, leading: bool, *, leader: str = "") -> None:
        """Serve the verbs (leading) or refuse them naming `leader`."""
        ...

    def bind_only_until(self, until: Callable[[], float]) -> None:
        """Let binds run only until `until()` (monotonic): the end of the lease's renew deadline."""
        ...

    def leader_seen(self, holder: str) -> None:
        """Another replica holds the lease: name it in the refusals."""
        ...


@dataclass
class Election:
    elector: LeaderElector
    lost: threading.Event = field(default_factory=threading.Event)  # the lease was lost, not given up
    releasing: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """On shutdown: give the lease up so a standby takes over within one retry period."""
        self.releasing.set()
        self.elector.stop(release=True)


def start_leader_election(s: ExtenderSettings, service: Replica, api: CoreApi) -> Election:
    """Stand by until this replica holds the Lease; the election starts once the service's state has synced."""
    identity = f"{s.pod_name or socket.gethostname()}_{uuid.uuid4().hex[:8]}"

    def label(leading: bool) -> None:
        if s.pod_name is None or s.pod_namespace is None:
            return
        try:
            mark_leader(api, namespace=s.pod_namespace, name=s.pod_name, leading=leading)
            if leading:  # a crashed leader's pod keeps the label until its container restarts
                cleared = clear_other_leader_labels(api, namespace=s.pod_namespace, own=s.pod_name)
                if cleared:
                    log.info("cleared a stale leader label", extra={"pods": cleared})
        except Exception as exc:
            log.error("cannot label the own pod", extra={"pod": s.pod_name, "leading": leading, "error": repr(exc)})

    def started() -> None:
        service.set_leading(True, leader=identity)
        label(True)
        # No list of every pod here: with 40k pods on a loaded apiserver that list took 70 s, and the new leader's
        # lease renewals, queued behind it, missed the renew deadline (benchmarks/restart.py). The standby's pod
        # watch learned those pods as the old leader placed them.

    def stopped() -> None:
        service.set_leading(False, leader=elector.holder)
        label(False)
        if not election.releasing.is_set():
            election.lost.set()
            os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down gracefully; main exits 1

    elector = LeaderElector(
        lease_store(namespace=s.leader_elect_resource_namespace, name=s.leader_elect_resource_name),
        identity,
        lease_s=s.leader_elect_lease_duration_seconds,
        renew_deadline_s=s.leader_elect_renew_deadline_seconds,
        retry_s=s.leader_elect_retry_period_seconds,
        on_started=started,
        on_stopped=stopped,
        on_holder=service.leader_seen,
    )
    service.bind_only_until(elector.valid_until)
    service.set_leading(False)
    label(False)  # a label left by an earlier run of this pod (labels outlive container restarts)
    log.info("leader election: standing by", extra={"identity": identity, "lease": s.leader_elect_resource_name})
    election = Election(elector)
    elector.start(after=service.ready)
    return election
