"""Nudging rejected pods when capacity frees (scheduler_extender.requeue): what is queued, coalescing, the bound,
errors, and the service's hooks (release by delete/terminal/expiry, bound or deleted pods are not nudged)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from scheduler_extender import schema
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.requeue import Requeuer
from scheduler_extender.service import ExtenderService
from scheduler_extender.settings import SettingsError, load
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _state
from vgpu import annotations as ann
from vgpu.devices import GpuDevice


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.fail: dict[str, int] = {}

    def __call__(self, namespace: str, name: str, uid: str) -> None:
        if name in self.fail:
            raise ApiError(self.fail[name])
        self.sent.append((namespace, name, uid))


def _requeuer(max_pods: int = 50) -> tuple[Requeuer, Recorder, Clock, ExtenderMetrics]:
    rec, clock = Recorder(), Clock()
    metrics = ExtenderMetrics(_state())
    return Requeuer(rec, max_pods=max_pods, interval_s=2.0, metrics=metrics, clock=clock), rec, clock, metrics


def _nudges(metrics: ExtenderMetrics, outcome: str) -> float:
    return metrics.registry.get_sample_value("vgpu_extender_requeue_nudges_total", {"outcome": outcome}) or 0.0


def _service(max_pods: int = 50) -> tuple[ExtenderService, FakeBinder, Requeuer, Recorder, Clock]:
    req, rec, clock, _metrics = _requeuer(max_pods)
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder, requeuer=req)
    req.metrics = svc.metrics
    return svc, binder, req, rec, clock


def _filter(svc: ExtenderService, pod: dict[str, Any], nodes: list[str] | None = None) -> list[str]:
    return list(svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=nodes or ["a", "b"]))["NodeNames"])


def _fill(svc: ExtenderService, binder: FakeBinder) -> list[dict[str, Any]]:
    """Every GPU of both nodes taken by one 100 % pod each."""
    holders = []
    for i, node in enumerate(["a", "a", "b", "b"]):
        pod = _pod(f"h{i}", 100)
        binder.pods[f"ns/h{i}"] = pod
        assert _bind(svc, pod, node) == ""
        holders.append(pod)
    return holders


# -- the requeuer alone --------------------------------------------------------------------------------------------


def test_a_request_queues_exactly_the_given_pods_and_sends_them_with_their_uid() -> None:
    req, rec, _clock, metrics = _requeuer()
    assert req.request([("ns/w1", "u1"), ("ns/w2", "u2")]) == 2
    assert req.run_once() == 2
    assert rec.sent == [("ns", "w1", "u1"), ("ns", "w2", "u2")]
    assert _nudges(metrics, "sent") == 2
    assert req.run_once() == 0  # nothing left


def test_a_burst_of_releases_nudges_each_pod_once_per_interval() -> None:
    req, rec, clock, metrics = _requeuer()
    for _ in range(5):
        req.request([("ns/w", "u")])
    assert _nudges(metrics, "coalesced") == 4
    req.run_once()
    assert rec.sent == [("ns", "w", "u")]
    clock.now += 0.5
    req.request([("ns/w", "u")])  # within the interval: deferred, not dropped
    for _ in range(3):
        req.request([("ns/w", "u")])
    assert req.run_once() == 0
    clock.now += 1.5
    assert req.run_once() == 1
    assert len(rec.sent) == 2


def test_at_most_max_pods_nudges_an_interval_the_rest_wait_and_none_is_dropped() -> None:
    """Dropping what one release had over max_pods let the first pods rejected take every release's nudges: the
    rest are sent in the next intervals, the oldest rejections first."""
    req, rec, clock, metrics = _requeuer(max_pods=3)
    assert req.request([(f"ns/w{i}", f"u{i}") for i in range(10)]) == 10
    assert req.run_once() == 3 and req.run_once() == 0  # this interval's three are spent
    assert [name for _, name, _ in rec.sent] == ["w0", "w1", "w2"]  # the oldest rejections first
    req.request([(f"ns/w{i}", f"u{i}") for i in range(3)])  # a release: the three sent are due again later
    for _ in range(3):
        clock.now += 2.0
        req.run_once()
    assert [name for _, name, _ in rec.sent] == [f"w{i}" for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1)]
    assert _nudges(metrics, "dropped") == 0 and set(req.pending()) == {"ns/w2"}


def test_zero_disables() -> None:
    req, rec, _clock, _metrics = _requeuer(max_pods=0)
    assert not req.enabled
    assert req.request([("ns/w", "u")]) == 0
    req.start()  # no thread
    assert req.run_once() == 0 and rec.sent == []


def test_gone_pods_are_silent_and_other_errors_counted(caplog: pytest.LogCaptureFixture) -> None:
    req, rec, _clock, metrics = _requeuer()
    rec.fail = {"gone": 404, "recreated": 409, "broken": 500}
    req.request([("ns/gone", "u1"), ("ns/recreated", "u2"), ("ns/broken", "u3"), ("ns/ok", "u4")])
    req.run_once()
    assert rec.sent == [("ns", "ok", "u4")]
    assert (_nudges(metrics, "gone"), _nudges(metrics, "error"), _nudges(metrics, "sent")) == (2, 1, 1)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and getattr(warnings[0], "pod", None) == "ns/broken"


def test_the_worker_thread_sends_queued_nudges() -> None:
    done = threading.Event()
    sent: list[str] = []

    def nudge(namespace: str, name: str, uid: str) -> None:
        sent.append(name)
        done.set()

    req = Requeuer(nudge, max_pods=5, interval_s=0.05)
    req.start()
    try:
        req.request([("ns/w", "u")])
        assert done.wait(30)
        time.sleep(0.1)
        req.request([("ns/w", "u")])
        deadline = time.monotonic() + 30
        while len(sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sent == ["w", "w"]
    finally:
        req.stop()


def test_the_setting_defaults_to_50_and_accepts_0() -> None:
    assert load(flags={}, env={}, config_file=None).requeue_max_pods == 50
    assert load(flags={}, env={"VGPU_EXTENDER_REQUEUE_MAX_PODS": "0"}, config_file=None).requeue_max_pods == 0
    assert load(flags={"requeue_max_pods": 7}, env={}, config_file=None).requeue_max_pods == 7


def test_the_interval_defaults_to_2_s_and_rejects_out_of_range_values() -> None:
    assert load(flags={}, env={}, config_file=None).requeue_interval_seconds == 2.0
    env = {"VGPU_EXTENDER_REQUEUE_INTERVAL_SECONDS": "0.5"}
    assert load(flags={}, env=env, config_file=None).requeue_interval_seconds == 0.5
    for bad in (0, -1, 301):
        with pytest.raises(SettingsError, match="requeue_interval_seconds"):
            load(flags={"requeue_interval_seconds": bad}, env={}, config_file=None)


# -- the service's hooks -------------------------------------------------------------------------------------------


def test_a_deleted_holder_nudges_exactly_the_rejected_pods() -> None:
    svc, binder, req, rec, _clock = _service()
    holders = _fill(svc, binder)
    waiters = [_pod(f"w{i}", 60) for i in range(2)]
    for w in waiters:
        assert _filter(svc, w) == []
    assert list(svc.pending) == ["ns/w0", "ns/w1"]
    svc.pod_event("DELETED", holders[0])
    assert set(req.pending()) == {"ns/w0", "ns/w1"}
    req.run_once()
    assert rec.sent == [("ns", w["metadata"]["name"], w["metadata"]["uid"]) for w in waiters]


def test_a_finished_holder_nudges_too() -> None:
    svc, binder, req, _rec, _clock = _service()
    holders = _fill(svc, binder)
    assert _filter(svc, _pod("w", 60)) == []
    done = {**holders[1], "status": {"phase": "Succeeded"}}
    svc.pod_event("MODIFIED", done)
    assert set(req.pending()) == {"ns/w"}


def test_an_expired_reservation_nudges() -> None:
    svc, binder, req, _rec, _clock = _service()
    svc.sync.clock = lambda: 1000.0
    _fill(svc, binder)
    assert _filter(svc, _pod("w", 60)) == []
    svc.sync.unbound["ns/h0"] = 999.0  # written, never bound, grace over
    svc.expire_unbound()
    assert "ns/h0" not in svc.state.assignments
    assert set(req.pending()) == {"ns/w"}


def test_no_release_no_nudge_and_the_nudge_itself_changes_nothing() -> None:
    svc, binder, req, rec, _clock = _service()
    holders = _fill(svc, binder)
    waiter = _pod("w", 60)
    assert _filter(svc, waiter) == []
    svc.pod_event("MODIFIED", holders[0])  # an unrelated update of a running holder
    assert req.pending() == {}
    before = dict(svc.state.assignments)
    nudged = {**waiter, "metadata": {**waiter["metadata"], "annotations": {ann.POD_REQUEUE: "1.000"}}}
    svc.pod_event("MODIFIED", nudged)  # the watch shows our own patch: no state change, no new nudge
    assert svc.state.assignments == before and req.pending() == {} and rec.sent == []
    assert "ns/w" in svc.pending


def test_a_bound_or_deleted_pending_pod_is_not_nudged() -> None:
    svc, binder, req, rec, _clock = _service()
    holders = _fill(svc, binder)
    bound, deleted, kept = _pod("bound", 60), _pod("deleted", 60), _pod("kept", 60)
    for w in (bound, deleted, kept):
        assert _filter(svc, w) == []
    svc.pod_event("DELETED", holders[0])
    assert set(req.pending()) == {"ns/bound", "ns/deleted", "ns/kept"}
    binder.pods["ns/bound"] = bound
    assert _bind(svc, bound, "a") == ""
    svc.pod_event("DELETED", deleted)
    assert set(req.pending()) == {"ns/kept"}
    svc.pod_event("DELETED", holders[2])
    assert set(req.pending()) == {"ns/kept"}  # bound and deleted pods are no longer pending
    req.run_once()
    assert [name for _, name, _ in rec.sent] == ["kept"]


def test_a_pod_that_fits_again_is_no_longer_pending() -> None:
    svc, binder, req, _rec, _clock = _service()
    holders = _fill(svc, binder)
    w = _pod("w", 60)
    assert _filter(svc, w) == []
    svc.pod_event("DELETED", holders[0])
    req.run_once()
    assert _filter(svc, w) == ["a"]
    svc.pod_event("DELETED", holders[1])
    assert req.pending() == {}


def test_disabled_service_queues_nothing() -> None:
    svc, binder, req, rec, _clock = _service(max_pods=0)
    holders = _fill(svc, binder)
    assert _filter(svc, _pod("w", 60)) == []
    svc.pod_event("DELETED", holders[0])
    assert req.pending() == {} and req.run_once() == 0 and rec.sent == []


def test_without_a_requeuer_the_release_is_unchanged() -> None:
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)  # the file source: nothing to nudge
    holders = _fill(svc, binder)
    assert _filter(svc, _pod("w", 60)) == []
    svc.pod_event("DELETED", holders[0])
    assert "ns/h0" not in svc.state.assignments and "ns/w" in svc.pending


def _node(name: str, gpus: int, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    inventory = tuple(GpuDevice(f"GPU-{name}-{i}", i, "H100", 81920) for i in range(gpus))
    meta = {"name": name, "labels": labels or {}, "annotations": {ann.NODE_INVENTORY: ann.encode_inventory(inventory)}}
    return {"metadata": meta}


def test_a_node_that_joins_or_grows_nudges_and_an_unchanged_one_does_not() -> None:
    svc, binder, req, _rec, _clock = _service()
    _fill(svc, binder)
    assert _filter(svc, _pod("w", 60)) == []
    svc.node_event("MODIFIED", _node("a", 2))  # the same inventory again: nothing changed
    assert not req.pending()
    svc.node_event("ADDED", _node("c", 1))  # a new node with a free GPU
    assert set(req.pending()) == {"ns/w"}


def test_a_relist_with_a_new_node_nudges() -> None:
    svc, binder, req, _rec, _clock = _service()
    _fill(svc, binder)
    assert _filter(svc, _pod("w", 60)) == []
    svc.replace_nodes([_node("a", 2), _node("b", 2)])
    assert not req.pending()
    svc.replace_nodes([_node("a", 2), _node("b", 3)])
    assert set(req.pending()) == {"ns/w"}


def test_a_pod_the_apiserver_does_not_hold_leaves_pending_after_its_nudge() -> None:
    """A nudge answered 404 (no such pod: a made-up /filter body) or 409 (the name now holds another UID) ends that
    pod's entry: it took a nudge of every later release until its TTL, ahead of real pods rejected after it."""
    svc, binder, req, rec, _clock = _service()
    holders = _fill(svc, binder)
    made_up, recreated, real = _pod("made-up", 60), _pod("recreated", 60), _pod("real", 60)
    for w in (made_up, recreated, real):
        assert _filter(svc, w) == []
    rec.fail = {"made-up": 404, "recreated": 409}
    svc.pod_event("DELETED", holders[0])
    req.run_once()
    assert list(svc.pending) == ["ns/real"]
    svc.pod_event("DELETED", holders[1])
    assert set(req.pending()) == {"ns/real"}


def test_a_gone_nudge_keeps_the_entry_the_name_holds_now() -> None:
    """A 409 for the old UID while /filter already rejected the recreated pod under its new UID: the new entry
    stays (it is a real pod, nudged on the next release)."""
    svc, binder, req, _rec, _clock = _service()
    holders = _fill(svc, binder)
    old = _pod("w", 60)
    assert _filter(svc, old) == []
    svc.pod_event("DELETED", holders[0])
    assert req.take_due() == [("ns/w", old["metadata"]["uid"])]
    with svc.lock:
        svc.pending.filtered("ns/w", "uid-new", fits=False)  # /filter of the recreated pod, before the answer
    assert req.on_gone is not None
    req.on_gone("ns/w", old["metadata"]["uid"])
    assert "ns/w" in svc.pending
    req.on_gone("ns/w", "uid-new")
    assert "ns/w" not in svc.pending


def test_a_pod_pending_for_hours_is_nudged_when_capacity_frees() -> None:
    """A big pod waits hours for room: kube-scheduler retries it at least every podMaxInUnschedulablePodsDuration
    (5 min) plus its leftover flush (every 30 s) and a backoff of at most 10 s (kubernetes v1.34
    pkg/scheduler/backend/queue/scheduling_queue.go, PriorityQueue.Run and flushUnschedulablePodsLeftover; sooner on
    any cluster event when no plugin but the extender rejected a node: isPodWorthRequeuing), and each
    /filter rejection renews its entry, so the release that makes room, hours later, still nudges it (Pending.ttl_s
    is 600 s; the test fails with 300 s)."""
    svc, binder, req, _rec, _clock = _service()
    now = [0.0]
    svc.pending.clock = lambda: now[0]
    holders = _fill(svc, binder)
    big = _pod("big", 60)
    for _ in range(12 * 3):  # 3 h of retries, 330 s apart; the room frees 330 s after the last
        assert _filter(svc, big) == []
        now[0] += 330.0
    svc.pod_event("DELETED", holders[0])
    assert set(req.pending()) == {"ns/big"}
