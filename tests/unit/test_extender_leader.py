"""Leader election (scheduler_extender.leader) on an in-memory Lease with the apiserver's optimistic concurrency,
and the HTTP gate of a standby replica."""

from __future__ import annotations

import datetime as dt
import warnings
from dataclasses import replace

import pytest

from scheduler_extender.app import create_app
from scheduler_extender.leader import Attempt, Conflict, LeaderElector, LeaseRecord
from scheduler_extender.service import ExtenderService
from scheduler_extender.settings import SettingsError, load
from tests.unit.test_extender_service import FakeBinder, _state

with warnings.catch_warnings():  # starlette 1.x nudges towards httpx2; httpx is what we ship
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class MemoryLease:
    """One Lease with resourceVersions: a write with a stale version conflicts, as on the apiserver."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.rv = 0
        self.down = False
        self.writes = 0

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.rv += 1
        self.writes += 1
        self.record = replace(record, version=str(self.rv))
        return self.record

    def get(self) -> LeaseRecord | None:
        if self.down:
            raise ConnectionError("apiserver away")
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise ConnectionError("apiserver away")
        if self.record is not None:
            raise Conflict("exists")
        return self._store(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise ConnectionError("apiserver away")
        if self.record is None or record.version != self.record.version:
            raise Conflict("stale")
        return self._store(record)


class StaleRead(MemoryLease):
    """Reads an old record (as a candidate that read just before another wrote), writes to the real lease."""

    def __init__(self, lease: MemoryLease, seen: LeaseRecord) -> None:
        super().__init__()
        self.lease, self.seen = lease, seen

    def get(self) -> LeaseRecord | None:
        return self.seen

    def update(self, record: LeaseRecord) -> LeaseRecord:
        return self.lease.update(record)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


def _elector(lease: MemoryLease, clock: Clock, name: str, events: list[str]) -> LeaderElector:
    return LeaderElector(
        lease,
        name,
        lease_s=15,
        renew_deadline_s=10,
        retry_s=2,
        on_started=lambda: events.append(f"{name} started"),
        on_stopped=lambda: events.append(f"{name} stopped"),
        monotonic=clock,
        now=lambda: T0 + dt.timedelta(seconds=clock.t),
    )


def test_the_first_candidate_leads_and_the_second_stands_by_until_the_lease_expires() -> None:
    lease, clock, events = MemoryLease(), Clock(), list[str]()
    a, b = _elector(lease, clock, "a", events), _elector(lease, clock, "b", events)
    assert a.step() and b.step()
    assert a.leading.is_set() and not b.leading.is_set() and b.holder == "a"
    assert lease.record is not None and lease.record.holder == "a" and lease.record.transitions == 0
    # a renews every retry period: b never takes over, however long it waits
    for _ in range(20):
        clock.t += 2
        assert a.attempt() is Attempt.HELD and b.attempt() is Attempt.OTHER
    # a stops renewing (a crash): b waits out a full lease duration from the last change it saw
    clock.t += 14
    assert b.attempt() is Attempt.OTHER
    clock.t += 1.5
    assert b.step() and b.leading.is_set()
    assert lease.record.holder == "b" and lease.record.transitions == 1
    assert events == ["a started", "b started"]


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    lease, clock, events = MemoryLease(), Clock(), list[str]()
    a, b = _elector(lease, clock, "a", events), _elector(lease, clock, "b", events)
    a.step()
    b.step()
    clock.t += 16
    assert b.step() and b.leading.is_set()  # a was frozen (a long pause) past its lease: b took over
    assert not a.step()
    assert not a.leading.is_set() and events == ["a started", "b started", "a stopped"]


def test_a_leader_keeps_serving_through_short_outages_and_stops_at_the_renew_deadline() -> None:
    lease, clock, events = MemoryLease(), Clock(), list[str]()
    a = _elector(lease, clock, "a", events)
    a.step()
    lease.down = True
    for _ in range(4):
        clock.t += 2
        assert a.step() and a.leading.is_set()  # 8 s without renewing: within the 10 s deadline
    lease.down = False
    clock.t += 2
    assert a.step() and a.leading.is_set()  # renewed: the deadline starts over
    lease.down = True
    clock.t += 9.9
    assert a.step()
    clock.t += 0.2
    assert not a.step() and not a.leading.is_set()
    assert events == ["a started", "a stopped"]


def test_two_candidates_racing_for_a_free_lease_get_one_leader() -> None:
    lease, clock, events = MemoryLease(), Clock(), list[str]()
    released = lease.record = LeaseRecord(holder="", duration_s=1, version="0")  # given up by an earlier leader
    a, b = _elector(lease, clock, "a", events), _elector(lease, clock, "b", events)
    b.store = StaleRead(lease, released)
    assert a.attempt() is Attempt.HELD
    assert b.attempt() is Attempt.FAILED  # b read the released lease before a wrote it: its write conflicts
    assert lease.get() is not None and lease.record.holder == "a" and lease.writes == 1


def test_a_clean_stop_releases_the_lease_so_the_standby_takes_over_without_waiting() -> None:
    lease, clock, events = MemoryLease(), Clock(), list[str]()
    a, b = _elector(lease, clock, "a", events), _elector(lease, clock, "b", events)
    a.step()
    b.step()
    a.stop(release=True)
    assert lease.record is not None and lease.record.holder == "" and not a.leading.is_set()
    clock.t += 2  # one retry period, not a lease duration
    assert b.step() and b.leading.is_set() and lease.record.holder == "b" and lease.record.transitions == 1
    assert events == ["a started", "a stopped", "b started"]


def test_a_restarted_candidate_with_a_new_identity_waits_for_the_old_lease() -> None:
    lease, clock, events = MemoryLease(), Clock(), list[str]()
    _elector(lease, clock, "pod-a_1", events).step()
    again = _elector(lease, clock, "pod-a_2", events)  # the same pod, restarted: a new identity
    assert again.attempt() is Attempt.OTHER
    clock.t += 15.1
    assert again.attempt() is Attempt.HELD


def test_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match=r"retry .* < renew deadline .* < lease"):
        LeaderElector(MemoryLease(), "a", lease_s=10, renew_deadline_s=10, retry_s=2)


def test_settings_check_the_election_timings_and_source() -> None:
    s = load(flags={"leader_elect": True}, env={}, config_file=None)
    assert (s.leader_elect_resource_namespace, s.leader_elect_resource_name) == ("kube-system", "vgpu-extender")
    assert (s.leader_elect_lease_duration_seconds, s.leader_elect_renew_deadline_seconds) == (15, 10)
    with pytest.raises(SettingsError, match="retry period < renew deadline < lease duration"):
        load(flags={"leader_elect_renew_deadline_seconds": 20}, env={}, config_file=None)
    with pytest.raises(SettingsError, match="leader_elect needs source 'kube'"):
        load(flags={"leader_elect": True, "source": "file", "cluster_file": "c.yaml"}, env={}, config_file=None)
    with pytest.raises(SettingsError, match="pod_name and pod_namespace go together"):
        load(flags={}, env={"VGPU_EXTENDER_POD_NAME": "x"}, config_file=None)


def test_a_standby_refuses_the_verbs_with_503_naming_the_leader_and_stays_ready() -> None:
    service = ExtenderService(_state(), FakeBinder())
    service.ready.set()
    service.set_leading(False, leader="vgpu-extender-7f9c_1a2b")
    http = TestClient(create_app(service))
    body = {"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}, "NodeNames": ["n0"]}
    for verb in ("filter", "prioritize"):
        r = http.post(f"/{verb}", json=body)
        assert r.status_code == 503 and "the leader is vgpu-extender-7f9c_1a2b" in r.json()["Error"]
    r = http.post("/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n0"})
    assert r.status_code == 503
    assert http.get("/readyz").status_code == 200  # synced: ready to take over; the Service selects the leader
    metrics = http.get("/metrics").text
    assert "vgpu_extender_leader 0.0" in metrics
    assert 'vgpu_extender_standby_refusals_total{verb="filter"} 1.0' in metrics
    service.set_leading(True, leader="me")
    assert http.post("/filter", json=body).status_code == 200
    assert "vgpu_extender_leader 1.0" in http.get("/metrics").text
