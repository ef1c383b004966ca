"""What the extender trusts: /bind reads the pod from the apiserver and never rebinds a bound or held pod; a
reservation's deadline runs on the extender's clock; an over-committing assignment is reported, not counted."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from scheduler_extender import schema
from scheduler_extender.service import ExtenderService, ServiceOptions
from tests.unit.test_extender_service import FakeBinder, _pod, _state
from vgpu import annotations as ann
from vgpu.annotations import Assignment
from vgpu.claims import Claim, precedence, settle


def _slice(gpu: str, pct: int) -> Assignment:
    return Assignment("a", (ann.ContainerAssignment("c", (ann.DeviceSlice(gpu, 0, 819 * pct, pct),)),))


def _with(pod: dict[str, Any], a: Assignment, *, node: str | None = None, **extra: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(a),
        ann.POD_BIND_PHASE: "allocated" if node else "allocating",
        **extra,
    }
    if node:
        out["spec"]["nodeName"] = node
    return out


def _bind(svc: ExtenderService, name: str, node: str, uid: str) -> str:
    args = schema.ExtenderBindingArgs(PodName=name, PodNamespace="ns", PodUID=uid, Node=node)
    return svc.bind(args)["Error"]


def _books(svc: ExtenderService) -> tuple[dict[str, Assignment], dict[str, int]]:
    return dict(svc.state.assignments), svc.state.totals()


def test_bind_of_a_running_pod_changes_nothing() -> None:
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)
    victim = _with(_pod("victim", 90), _slice("GPU-a-0", 90), node="a")
    binder.pods["ns/victim"] = victim
    svc.pod_event("ADDED", victim)
    before = _books(svc)
    err = _bind(svc, "victim", "b", victim["metadata"]["uid"])
    assert "already bound to a" in err and "ns/victim" in err
    assert _books(svc) == before  # the assignment stays, the slice stays held
    assert binder.written == {} and binder.sent == []  # no Binding sent, nothing written


def test_bind_of_a_pod_holding_a_live_reservation_is_refused_without_side_effects() -> None:
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)
    pod = _with(_pod("p", 50), _slice("GPU-a-0", 50))
    binder.pods["ns/p"] = pod
    svc.pod_event("ADDED", pod)  # written by a bind whose Binding has not landed
    before = _books(svc)
    err = _bind(svc, "p", "b", pod["metadata"]["uid"])
    assert "live assignment on a" in err
    assert _books(svc) == before and binder.written == {} and binder.sent == []


def test_bind_takes_the_spec_from_the_apiserver_not_from_a_filter_body() -> None:
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)
    real = _pod("p", 10)
    binder.pods["ns/p"] = real
    forged = _pod("p", 100)
    forged["metadata"]["uid"] = real["metadata"]["uid"]  # a /filter carrying the real pod's UID, asking 100 %
    svc.filter(schema.ExtenderArgs(Pod=forged, NodeNames=["a"]))
    assert _bind(svc, "p", "a", real["metadata"]["uid"]) == ""
    (s,) = svc.state.assignments["ns/p"].slices()
    assert s.cores == 10  # the apiserver's pod, not the body /filter saw


def test_bind_refuses_a_uid_the_apiserver_does_not_hold_and_an_unreadable_pod() -> None:
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)
    binder.pods["ns/p"] = _pod("p")
    assert "the bind names" in _bind(svc, "p", "a", str(uuid.uuid4()))
    assert "pod not found" in _bind(svc, "ghost", "a", str(uuid.uuid4()))

    def broken(**_: Any) -> None:
        raise ConnectionError("apiserver unreachable")

    binder.get_pod = broken  # type: ignore[method-assign]
    assert "cannot read the pod from the apiserver" in _bind(svc, "p", "a", str(uuid.uuid4()))
    assert svc.state.assignments == {}


def test_a_forged_far_future_bind_time_holds_capacity_only_for_the_grace() -> None:
    now = [5000.0]
    svc = ExtenderService(_state(), FakeBinder(), options=ServiceOptions(bind_grace_s=30))
    svc.sync.clock = lambda: now[0]
    squatter = _with(_pod("squat", 100), _slice("GPU-a-0", 100), **{ann.POD_BIND_TIME: "9999999999"})
    svc.pod_event("ADDED", squatter)
    assert "ns/squat" in svc.state.assignments
    now[0] += 31
    svc.expire_unbound()
    assert "ns/squat" not in svc.state.assignments
    # Rewriting the annotation (new bind-time, same pod) buys no new grace: the first sighting counts.
    svc.pod_event("MODIFIED", _with(squatter, _slice("GPU-a-1", 100), **{ann.POD_BIND_TIME: f"{now[0]:.3f}"}))
    assert "ns/squat" not in svc.state.assignments and svc.state.totals()["cores_used"] == 0
    svc.pod_event("DELETED", squatter)
    assert "ns/squat" not in svc.sync.first_seen


def test_own_bind_starts_its_grace_at_the_bind() -> None:
    now = [100.0]
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder, options=ServiceOptions(bind_grace_s=30))
    svc.sync.clock = lambda: now[0]
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    binder.fail_bind = True
    assert "binding failed" in _bind(svc, "p", "a", pod["metadata"]["uid"])
    assert svc.sync.first_seen["ns/p"] == 100.0


def test_an_over_committing_assignment_is_reported_not_counted_and_counted_once_it_fits() -> None:
    svc = ExtenderService(_state(), FakeBinder())
    holder = _with(_pod("holder", 90), _slice("GPU-a-0", 90), node="a")
    forged = _with(_pod("forged", 100), _slice("GPU-a-0", 100), node="a")
    svc.pod_event("ADDED", holder)
    svc.pod_event("ADDED", forged)
    assert "ns/forged" not in svc.state.assignments and "ns/forged" in svc.state.conflicts
    assert svc.state.totals()["cores_used"] == 90  # never 190 %
    assert svc.metrics.problems.labels("conflict")._value.get() == 1
    svc.pod_event("DELETED", holder)  # capacity frees: the refused claim fits now
    assert "ns/forged" in svc.state.assignments and "ns/forged" not in svc.state.conflicts


def test_a_list_honours_bound_pods_first_whatever_the_list_order() -> None:
    svc = ExtenderService(_state(), FakeBinder())
    bound = _with(_pod("z-bound", 90), _slice("GPU-a-0", 90), node="a")
    pending = _with(_pod("a-pending", 90), _slice("GPU-a-0", 90))
    svc.replace_pods([pending, bound])
    assert "ns/z-bound" in svc.state.assignments and "ns/a-pending" in svc.state.conflicts


def test_claim_precedence_and_settle() -> None:
    a, b = _slice("GPU-a-0", 60), _slice("GPU-a-0", 60)
    older = Claim("ns/y", a, bound=False, created="2025-01-01T00:00:00Z")
    newer = Claim("ns/x", b, bound=False, created="2025-01-02T00:00:00Z")
    bound = Claim("ns/w", b, bound=True, created="2025-01-03T00:00:00Z")
    assert sorted([newer, older, bound], key=precedence) == [bound, older, newer]
    state = _state()
    applied, refused = settle(state, {c.key: c for c in (newer, older)})
    assert applied == ["ns/y"] and list(refused) == ["ns/x"] and "cores" in refused["ns/x"]
