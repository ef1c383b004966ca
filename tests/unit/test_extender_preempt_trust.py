"""/preempt sizes its victims and its hold from the pod the apiserver holds, never from the body a caller sent
(docs/extender.md, "Security"): the watch's copy when its UID is the body's, else one GET; no such pod, no answer."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from scheduler_extender import deadline
from scheduler_extender.app import create_app
from scheduler_extender.service import ExtenderService, ServiceOptions
from tests.unit.test_extender_preempt import _fill, _meta, _pending, _pod, _service
from tests.unit.test_extender_service import FakeBinder
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.state import ClusterState

# The real preemptor: 40000 MiB at priority 1000. On _fill's cluster its cheapest set is b1 on node a; node b holds
# only priority-2000 pods, so it is left out.
REAL_ANSWER = {"a": _meta("uid-b1")}


def _forged(real: dict[str, Any]) -> dict[str, Any]:
    """The real pod's name and UID, with a whole card's memory and a priority above every pod's: sized from this,
    both of GPU 0's pods on node a go (to free 80000 MiB) and a priority-2000 pod on node b too."""
    body = copy.deepcopy(real)
    body["spec"]["priority"] = 1_000_000
    body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "80000"
    return body


def _ask(svc: ExtenderService, pod: dict[str, Any]) -> dict[str, Any]:
    """The verb over HTTP, as kube-scheduler calls it, offering both nodes."""
    body = {"Pod": pod, "NodeNameToMetaVictims": {"a": _meta("uid-b3"), "b": _meta("uid-h0")}}
    r = TestClient(create_app(svc)).post("/preempt", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()["NodeNameToMetaVictims"]
    return out


def _outcome(svc: ExtenderService, label: str) -> float:
    value: float = svc.metrics.preemptions.labels(label)._value.get()
    return value


def _binder(svc: ExtenderService) -> FakeBinder:
    assert isinstance(svc.binder, FakeBinder)
    return svc.binder


def test_inflated_requests_and_priority_in_the_body_are_ignored_for_the_watched_pod_without_a_get() -> None:
    svc, _ = _service()
    _fill(svc)
    real = _pod("online", 40000, 1000)
    svc.pod_event("ADDED", real)  # the watch has it, with the body's UID
    assert _ask(svc, _forged(real)) == REAL_ANSWER
    assert _binder(svc).reads == 0  # the watch's copy, no GET
    assert _outcome(svc, "answered") == 1


def test_the_hold_is_sized_from_the_real_pod() -> None:
    """The answer holds node a for the preemptor until the watch shows its nomination. Sized from the real pod
    (40000 MiB, b1 its victim) a 10000 MiB batch pod still fits beside it once b1 is gone; sized from the forged
    body (80000 MiB, b1 and b2 its victims) the node would stay closed to it while b2 runs."""
    svc, _ = _service()
    pods = _fill(svc)
    real = _pod("online", 40000, 1000)
    svc.pod_event("ADDED", real)
    _ask(svc, _forged(real))
    (claim,) = svc.books.pending["ns/online"][0]
    assert claim.pod["spec"] == real["spec"] and claim.victims == {"ns/b1"}
    svc.pod_event("DELETED", pods["b1"])
    small = _pod("small-batch", 10000, 1)
    r = TestClient(create_app(svc)).post("/filter", json={"Pod": small, "NodeNames": ["a"]}).json()
    assert r["NodeNames"] == ["a"], r


def test_a_pod_the_watch_has_not_shown_is_read_once_and_its_spec_used() -> None:
    svc, _ = _service()
    _fill(svc)
    real = _pod("online", 40000, 1000)
    _pending(svc, real)  # in the apiserver only: the watch is behind
    assert _ask(svc, _forged(real)) == REAL_ANSWER
    assert _binder(svc).reads == 1
    assert svc.books.pending["ns/online"][0][0].pod["spec"] == real["spec"]


def test_the_get_runs_under_a_deadline_within_the_call_timeout() -> None:
    seen: list[float | None] = []

    class Timed(FakeBinder):
        def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
            seen.append(deadline.current())
            return super().get_pod(namespace=namespace, name=name)

    state = ClusterState()
    state.upsert_node(NodeInventory("a", (GpuDevice("GPU-a-0", 0, "H100", 81920),)))
    svc = ExtenderService(state, Timed(), options=ServiceOptions(bind_timeout_s=5.0))
    started = time.monotonic()
    _ask(svc, _pod("online", 40000, 1000))
    (until,) = seen
    # check_budget(5 s): one GET gets at most a second of kube-scheduler's 5 s httpTimeout.
    assert until is not None and started < until <= time.monotonic() + 1.0


@pytest.mark.parametrize(
    ("case", "outcome"),
    [
        ("another-uid", "uid-mismatch"),
        ("no-uid", "uid-mismatch"),
        ("missing", "pod-missing"),
        ("bound", "pod-bound"),
        ("deleting", "pod-deleting"),
        ("unreadable", "read-failed"),
    ],
)
def test_no_pod_the_apiserver_holds_under_that_name_and_uid_gets_no_victims_and_no_hold(
    case: str, outcome: str
) -> None:
    svc, _ = _service()
    pods = _fill(svc)
    real = _pod("online", 40000, 1000)
    body = copy.deepcopy(real)
    binder = _binder(svc)
    if case == "another-uid":  # the watch and the apiserver hold online under its own UID; the body names b1's
        svc.pod_event("ADDED", real)
        _pending(svc, real)
        body["metadata"]["uid"] = pods["b1"]["metadata"]["uid"]
    elif case == "no-uid":
        svc.pod_event("ADDED", real)
        del body["metadata"]["uid"]
    elif case == "bound":  # bound since kube-scheduler asked: the watch dropped it from the unbound pods
        bound = copy.deepcopy(real)
        bound["spec"]["nodeName"] = "b"
        _pending(svc, bound)
    elif case == "deleting":
        leaving = copy.deepcopy(real)
        leaving["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
        _pending(svc, leaving)
    elif case == "unreadable":
        _pending(svc, real)
        binder.get_fails = binder.bind_tried = True  # every read times out
    assert _ask(svc, body) == {}
    assert not svc.books.pending
    assert _outcome(svc, outcome) == 1
    assert _outcome(svc, "answered") == 0


def test_the_file_source_has_no_watch_nor_apiserver_and_takes_the_body() -> None:
    svc, _ = _service()
    svc = ExtenderService(svc.state, FakeBinder(), options=ServiceOptions(pods_from_filter=True))
    _fill(svc)
    assert _ask(svc, _pod("online", 40000, 1000)) == REAL_ANSWER
    assert _binder(svc).reads == 0
