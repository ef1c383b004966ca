"""Deadlines on the extender's apiserver calls: /bind answers (bound or rolled back) inside kube-scheduler's
httpTimeout however slow the apiserver is, a leader stops binding at its renew deadline, and KubeBinder's calls
carry the remaining time and the pod's resourceVersion to a real (local) HTTP server."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from scheduler_extender import deadline, schema
from scheduler_extender.kube import KubeBinder
from scheduler_extender.leader import LeaderElector, LeaseRecord
from scheduler_extender.service import ExtenderService, ServiceOptions
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _state
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice

_ONE = Assignment("a", (ContainerAssignment("c", (DeviceSlice("GPU-a-0", 0, 1024, 50),)),))


def test_remaining_is_the_earlier_of_the_deadline_and_the_default() -> None:
    assert deadline.remaining(7.0) == 7.0  # no deadline: the call's own default
    now = time.monotonic()
    # Minutes, not seconds: the bounds hold however long a loaded machine stalls this thread between the lines.
    with deadline.within(now + 120.0):
        assert 60.0 < deadline.remaining(300.0) <= 120.0
        assert deadline.remaining(0.5) == 0.5
        with deadline.within(now + 3600):  # an inner, later deadline does not extend the outer one
            assert deadline.remaining(7200.0) <= 120.0
    with deadline.within(now - 1), pytest.raises(deadline.DeadlineExceeded, match="was not made"):
        deadline.remaining(7.0)
    assert deadline.current() is None


class SlowBinder(FakeBinder):
    """An apiserver that takes `delay_s` to answer the Binding: the call gives up when its deadline says so, as
    urllib3's read timeout does, and nothing is applied (yet)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.timeouts: list[float] = []

    def bind(
        self, *, namespace: str, name: str, uid: str, version: str, node: str, assignment: Assignment | None
    ) -> None:
        timeout = deadline.remaining(60.0)
        self.timeouts.append(timeout)
        if self.delay_s > timeout:
            time.sleep(timeout)
            self.sent.append((f"{namespace}/{name}", version))
            raise TimeoutError(f"read timed out (read timeout={timeout:.2f})")
        time.sleep(self.delay_s)
        super().bind(namespace=namespace, name=name, uid=uid, version=version, node=node, assignment=assignment)


def test_a_bind_behind_a_slow_binding_answers_inside_the_http_timeout_and_a_retry_is_not_in_progress() -> None:
    now = [1000.0]
    binder = SlowBinder(delay_s=25.0)  # the apiserver: a write answered after 25 s
    svc = ExtenderService(_state(), binder, options=ServiceOptions(bind_timeout_s=1.0, bind_grace_s=30))
    svc.sync.clock = lambda: now[0]
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    started = time.monotonic()
    error = _bind(svc, pod, "a")
    took = time.monotonic() - started
    # Broken, it answers after the 25 s write; the budget itself is checked below on the timeouts the calls got
    # (a wall-clock bound near 1 s fails correct code on a loaded machine).
    assert took < 10.0, f"answered after {took:.2f} s, waiting on the 25 s write; kube-scheduler gave up at 1 s"
    assert "did not answer within this bind's deadline" in error and "binding outcome unknown" in error
    assert len(svc.reservations) == 0 and "ns/p" in svc.state.assignments  # no bind in flight; the slices held
    assert binder.timeouts and max(binder.timeouts) <= 1.0 - 0.25 - 0.2 + 0.01  # answer margin + read-back budget
    binder.delay_s = 0.0  # the apiserver recovers: the retry is refused for the held slices, never "in progress"
    svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=["a", "b"]))
    assert "holds a live assignment" in _bind(svc, pod, "a")
    now[0] += 31  # past the grace, the fence finds the pod unbound: freed, and the retry binds
    svc.expire_unbound()
    assert [k for k, _ in binder.fenced] == ["ns/p"] and "ns/p" not in svc.state.assignments
    assert _bind(svc, pod, "a") == ""
    assert "ns/p" in svc.state.assignments and len(svc.reservations) == 0


def test_a_replica_past_its_lease_refuses_binds_with_nothing_reserved() -> None:
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder, options=ServiceOptions(bind_timeout_s=5.0))
    svc.bind_only_until(lambda: time.monotonic() - 0.01)
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    assert "lease ends before a bind could finish" in _bind(svc, pod, "a")
    assert len(svc.reservations) == 0 and not svc.state.assignments and not binder.sent


def test_a_bind_stops_its_calls_at_the_lease_end_not_at_the_http_timeout() -> None:
    binder = SlowBinder(delay_s=60.0)
    svc = ExtenderService(_state(), binder, options=ServiceOptions(bind_timeout_s=30.0))
    lease_end = time.monotonic() + 0.4
    svc.bind_only_until(lambda: lease_end)
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    _bind(svc, pod, "a")
    # The Binding ended at the lease end, the read-back after; broken, the calls run to the 30 s bind timeout.
    assert time.monotonic() < lease_end + 10.0
    assert binder.timeouts[0] <= 0.4 and len(svc.reservations) == 0


class ClockStore:
    """A LeaseStore whose update takes `rtt` on the elector's fake monotonic clock."""

    def __init__(self, clock: list[float], rtt: float) -> None:
        self.clock, self.rtt = clock, rtt
        self.record: LeaseRecord | None = None

    def get(self) -> LeaseRecord | None:
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        self.clock[0] += self.rtt
        self.record = record
        return record

    def update(self, record: LeaseRecord) -> LeaseRecord:
        return self.create(record)


def test_valid_until_counts_from_when_the_renewal_was_sent() -> None:
    clock = [100.0]
    elector = LeaderElector(
        ClockStore(clock, rtt=3.0), "me", lease_s=15, renew_deadline_s=10, retry_s=2, monotonic=lambda: clock[0]
    )
    assert elector.valid_until() == float("-inf")
    assert elector.step() and elector.leading.is_set()
    # sent at 100, answered at 103: a standby cannot take over before 100 + 15; binds stop at 100 + 10
    assert elector.valid_until() == 110.0
    clock[0] = 112.0
    elector.store = _Down()  # type: ignore[assignment]
    assert not elector.step() and not elector.leading.is_set()  # past the renew deadline: leadership lost


class _Down:
    def get(self) -> LeaseRecord | None:
        raise TimeoutError("apiserver away")


# -- KubeBinder against a real HTTP server ---------------------------------------------------------------------


class _Apiserver(BaseHTTPRequestHandler):
    """Just enough of the pods API: GET answers a pod at resourceVersion 7, POST (a Binding) waits `post_delay_s`."""

    post_delay_s = 0.0
    patch_status = 200
    pod: dict[str, Any] | None = None
    seen: list[tuple[str, str, dict[str, Any]]] = []

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, {}))
        self._send(200, self.pod or {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}})

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("PATCH", self.path, body))
        if self.patch_status != 200:
            self._send(self.patch_status, {"kind": "Status", "status": "Failure", "code": self.patch_status})
            return
        self._send(200, {"metadata": {"name": "p", "resourceVersion": "8"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, body))
        time.sleep(self.post_delay_s)
        with contextlib.suppress(OSError):  # the client gave up
            self._send(201, {"kind": "Status", "status": "Success"})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def apiserver() -> Iterator[tuple[KubeBinder, type[_Apiserver]]]:
    handler = type("Handler", (_Apiserver,), {"seen": [], "post_delay_s": 0.0, "patch_status": 200, "pod": None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    yield KubeBinder(client.CoreV1Api(client.ApiClient(conf))), handler
    server.shutdown()
    server.server_close()  # the listening socket; a handler still sleeping (a daemon thread) is not waited for


def test_kube_binder_sends_one_binding_carrying_the_assignment_on_the_version_given(
    apiserver: tuple[KubeBinder, Any],
) -> None:
    binder, handler = apiserver
    binder.clock = lambda: 1234.5
    binder.bind(namespace="ns", name="p", uid="u1", version="7", node="a", assignment=_ONE)
    [(method, path, binding)] = handler.seen
    assert method == "POST" and path.endswith("/namespaces/ns/pods/p/binding")
    assert binding["metadata"]["resourceVersion"] == "7" and binding["metadata"]["uid"] == "u1"
    assert binding["metadata"]["annotations"] == {
        ann.POD_ASSIGNMENT: ann.encode_assignment(_ONE),
        ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
        ann.POD_BIND_TIME: "1234.500",
    }
    assert (
        binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "a"} and "labels" not in binding["metadata"]
    )


def test_kube_binder_calls_end_at_the_deadline(apiserver: tuple[KubeBinder, Any]) -> None:
    binder, handler = apiserver
    handler.post_delay_s = 30.0
    started = time.monotonic()
    with deadline.within(started + 0.5), pytest.raises(Exception, match=r"(?i)timed? ?out"):
        binder.bind(namespace="ns", name="p", uid="u1", version="7", node="a", assignment=_ONE)
    assert time.monotonic() - started < 10.0  # the 0.5 s deadline, not the 30 s answer


def test_call_timeouts_from_the_settings_bound_every_call_and_a_deadline_shortens_them() -> None:
    from scheduler_extender import kube

    before = kube.call_timeouts()
    try:
        kube.configure_timeouts(kube.CallTimeouts(call_s=4.0, connect_s=1.0, list_s=40.0, watch_read_slack_s=5.0))
        assert kube._timeout() == (1.0, 4.0)
        assert kube._timeout(kube.call_timeouts().list_s) == (1.0, 40.0)
        with deadline.within(time.monotonic() + 3.0):  # a bind's deadline: what is left of it shortens the read
            connect, read = kube._timeout()
            assert 1.0 < read <= 3.0 and connect == 1.0
        # ... and the connect timeout too once less than it is left (seconds of slack: a loaded machine stalls)
        kube.configure_timeouts(kube.CallTimeouts(call_s=40.0, connect_s=20.0, list_s=40.0, watch_read_slack_s=5.0))
        with deadline.within(time.monotonic() + 3.0):
            connect, read = kube._timeout()
            assert 1.0 < read <= 3.0 and connect == read
    finally:
        kube.configure_timeouts(before)


def test_kube_binder_fence_writes_on_the_version_the_binding_was_sent_on(apiserver: tuple[KubeBinder, Any]) -> None:
    """A late Binding carries the version it was sent on as its precondition: the fence writes on that one, not on
    a version read since (a retry's read of the pod, bound by then: marking that failed stripped a bound pod of
    its assignment in benchmarks/scale.py)."""
    binder, handler = apiserver
    assert binder.fence(namespace="ns", name="p", uid="u1", version="8") is True
    [(method, path, body)] = handler.seen
    assert method == "PATCH" and path.endswith("/namespaces/ns/pods/p")
    assert body["metadata"]["resourceVersion"] == "8" and body["metadata"]["uid"] == "u1"
    assert body["metadata"]["annotations"] == {ann.POD_ASSIGNMENT: None, ann.POD_BIND_PHASE: "failed"}


@pytest.mark.parametrize(("assignment", "landed"), [(True, True), (False, False)])
def test_kube_binder_fence_on_a_pod_bound_since_tells_whether_its_binding_landed(
    apiserver: tuple[KubeBinder, Any], assignment: bool, landed: bool
) -> None:
    """The fence's write gets 409 and the pod reads bound. The Binding carries the assignment, so bound with one it
    landed (the slices stay held); bound without one, someone else bound it and this Binding never can."""
    binder, handler = apiserver
    pod: dict[str, Any] = {"metadata": {"name": "p", "uid": "u1", "resourceVersion": "9"}, "spec": {"nodeName": "a"}}
    if assignment:
        pod["metadata"]["annotations"] = {ann.POD_ASSIGNMENT: ann.encode_assignment(_ONE)}
    handler.pod, handler.patch_status = pod, 409
    assert binder.fence(namespace="ns", name="p", uid="u1", version="8") is (not landed)
    assert [m for m, _, _ in handler.seen] == ["PATCH", "GET"]
