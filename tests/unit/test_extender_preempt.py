"""The preempt verb over HTTP (scheduler_extender.preempt): kube-scheduler's wire form in, our victims out; and the
nominated pod's slices held against lower-priority pods at /filter."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as kclient
from starlette.testclient import TestClient

from scheduler_extender.app import create_app
from scheduler_extender.kube import KubeBinder
from scheduler_extender.preempt import PENDING_NOMINATION_S
from scheduler_extender.service import ExtenderService, ServiceOptions
from tests.unit.test_extender_service import FakeBinder
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.state import ClusterState

MIB = 81920


def _pod(
    name: str, mib: int, prio: int, *, created: str = "2026-01-01T00:00:00Z", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": labels or {},
        },
        "spec": {"priority": prio, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {},
    }


def _held(pod: dict[str, Any], node: str, gpu: int, mib: int) -> dict[str, Any]:
    """The pod as the watch shows it once bound with a slice of `gpu`."""
    a = Assignment(node, (ContainerAssignment("c", (DeviceSlice(f"GPU-{node}-{gpu}", gpu, mib, 0),)),))
    out = copy.deepcopy(pod)
    out["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(a),
        ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATED.value,
    }
    out["spec"]["nodeName"] = node
    return out


def _service(pdbs: list[dict[str, Any]] | None = None) -> tuple[ExtenderService, TestClient]:
    state = ClusterState()
    for n in ("a", "b"):
        state.upsert_node(
            NodeInventory(n, tuple(GpuDevice(f"GPU-{n}-{i}", i, "H100", MIB, split_count=4) for i in range(2)))
        )
    svc = ExtenderService(state, FakeBinder(), list_pdbs=lambda: pdbs or [])
    return svc, TestClient(create_app(svc))


def _fill(svc: ExtenderService) -> dict[str, dict[str, Any]]:
    """Node a: GPU 0 holds b1 (50000, prio 1) and b2 (30000, prio 1, younger); GPU 1 holds b3 (70000, prio 5).
    Node b: both GPUs hold a priority-2000 pod (not preemptible by 1000)."""
    pods = {
        "b1": _held(_pod("b1", 50000, 1, created="2026-01-01T00:00:00Z"), "a", 0, 50000),
        "b2": _held(_pod("b2", 30000, 1, created="2026-01-02T00:00:00Z"), "a", 0, 30000),
        "b3": _held(_pod("b3", 70000, 5), "a", 1, 70000),
        "h0": _held(_pod("h0", 70000, 2000), "b", 0, 70000),
        "h1": _held(_pod("h1", 70000, 2000), "b", 1, 70000),
    }
    svc.replace_pods(list(pods.values()))
    return pods


def _pending(svc: ExtenderService, *pods: dict[str, Any]) -> None:
    """The preemptors as the apiserver holds them (/preempt reads a pod the watch has not shown)."""
    binder = svc.binder
    assert isinstance(binder, FakeBinder)
    for pod in pods:
        binder.pods[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = copy.deepcopy(pod)


def _meta(*uids: str, pdb: int = 0) -> dict[str, Any]:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}


def test_preempt_answers_the_cheapest_set_per_node_and_drops_nodes_where_none_works() -> None:
    svc, http = _service()
    _fill(svc)
    online = _pod("online", 40000, 1000)
    _pending(svc, online)
    # kube-scheduler's in-tree dry run counted replicas only: it offers one pod per node, not what frees memory.
    body = {"Pod": online, "NodeNameToMetaVictims": {"a": _meta("uid-b3"), "b": _meta("uid-h0")}}
    r = http.post("/preempt", json=body)
    assert r.status_code == 200, r.text
    got = r.json()["NodeNameToMetaVictims"]
    # Node a: b2 (younger) would free only 31920 MiB of GPU 0; b1 (priority 1) frees 51920, cheaper than b3 (priority
    # 5) on GPU 1. Node b: nothing of lower priority than 1000, so it is left out.
    assert got == {"a": _meta("uid-b1")}
    assert svc.metrics.preemptions.labels("answered")._value.get() == 1


def test_a_pdb_that_allows_no_disruption_steers_the_choice() -> None:
    pdb = {
        "metadata": {"name": "keep-b1", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "b1"}}},
        "status": {"disruptionsAllowed": 0},
    }
    svc, http = _service([pdb])
    pods = _fill(svc)
    pods["b1"]["metadata"]["labels"] = {"app": "b1"}
    svc.pod_event("MODIFIED", pods["b1"])
    body = {"Pod": _pod("online", 40000, 1000), "NodeNameToMetaVictims": {"a": _meta("uid-b3")}}
    _pending(svc, body["Pod"])
    got = http.post("/preempt", json=body).json()["NodeNameToMetaVictims"]
    assert got == {"a": _meta("uid-b3")}  # b3 (priority 5) frees GPU 1; b1 is spared


def test_the_full_pod_form_and_a_node_without_a_fitting_set() -> None:
    svc, http = _service()
    pods = _fill(svc)
    huge = _pod("huge", MIB + 1, 1000)  # never fits any card: no node
    _pending(svc, huge, _pod("online", 40000, 1000), _pod("low", 40000, 1))
    body = {"Pod": huge, "NodeNameToVictims": {"a": {"Pods": [pods["b1"]], "NumPDBViolations": 0}}}
    assert http.post("/preempt", json=body).json() == {"NodeNameToMetaVictims": {}}
    body = {
        "Pod": _pod("online", 40000, 1000),
        "NodeNameToVictims": {"a": {"Pods": [pods["b3"]], "NumPDBViolations": 0}},
    }
    assert http.post("/preempt", json=body).json()["NodeNameToMetaVictims"] == {"a": _meta("uid-b1")}
    # A low-priority preemptor may evict nothing of priority >= its own.
    body = {"Pod": _pod("low", 40000, 1), "NodeNameToMetaVictims": {"a": _meta("uid-b1")}}
    assert http.post("/preempt", json=body).json()["NodeNameToMetaVictims"] == {}


def test_a_nominated_pod_keeps_the_freed_slice_from_a_lower_priority_pod() -> None:
    svc, http = _service()
    pods = _fill(svc)
    svc.pod_event("DELETED", pods["b1"])  # the victim is gone: GPU 0 of node a has 51920 MiB free
    online = _pod("online", 40000, 1000)
    online["status"] = {"nominatedNodeName": "a"}
    svc.pod_event("ADDED", online)
    late = _pod("late-batch", 40000, 1)
    r = http.post("/filter", json={"Pod": late, "NodeNames": ["a", "b"]}).json()
    assert r["NodeNames"] == [] and "a" in r["FailedNodes"]
    # The preemptor itself, and a pod of higher priority than it, still see the room.
    for pod in (online, _pod("urgent", 40000, 5000)):
        r = http.post("/filter", json={"Pod": pod, "NodeNames": ["a", "b"]}).json()
        assert r["NodeNames"] == ["a"], r
    # The stand-in is gone after each call: the state holds only real pods.
    assert all(not k.startswith("nominated:") for k in svc.state.assignments)
    bound = copy.deepcopy(online)
    bound["spec"]["nodeName"] = "a"
    svc.pod_event("MODIFIED", bound)
    assert not svc.books.nominated


def test_an_answered_preemption_holds_the_room_before_the_watch_shows_the_nomination() -> None:
    """kube-scheduler deletes the victims while it writes nominatedNodeName; our watch may show them gone first."""
    svc, http = _service()
    pods = _fill(svc)
    now = [100.0]
    svc.books.clock = lambda: now[0]
    online = _pod("online", 40000, 1000)
    svc.pod_event("ADDED", online)
    body = {"Pod": online, "NodeNameToMetaVictims": {"a": _meta("uid-b3")}}
    assert http.post("/preempt", json=body).json()["NodeNameToMetaVictims"] == {"a": _meta("uid-b1")}
    svc.pod_event("DELETED", pods["b1"])  # the victim is gone; online's status still shows no nomination
    late = _pod("late-batch", 40000, 1)
    r = http.post("/filter", json={"Pod": late, "NodeNames": ["a", "b"]}).json()
    assert r["NodeNames"] == [] and "a" in r["FailedNodes"], r
    assert http.post("/filter", json={"Pod": online, "NodeNames": ["a", "b"]}).json()["NodeNames"] == ["a"]
    # The watch shows the nomination: the answer's hold gives way to it, and the room stays held.
    nominated = copy.deepcopy(online)
    nominated["status"] = {"nominatedNodeName": "a"}
    svc.pod_event("MODIFIED", nominated)
    assert not svc.books.pending and "ns/online" in svc.books.nominated
    assert http.post("/filter", json={"Pod": late, "NodeNames": ["a", "b"]}).json()["NodeNames"] == []
    # An answer never followed by a nomination stops holding after PENDING_NOMINATION_S.
    svc.pod_event("MODIFIED", online)  # kube-scheduler cleared the nomination
    svc.books.preempting(online, {"a": []})
    now[0] += PENDING_NOMINATION_S + 1
    assert http.post("/filter", json={"Pod": late, "NodeNames": ["a", "b"]}).json()["NodeNames"] == ["a"]
    assert not svc.books.pending


def test_a_node_is_closed_to_lower_priority_pods_while_the_preemptors_victims_terminate() -> None:
    svc, http = _service()
    pods = _fill(svc)
    online = _pod("online", 40000, 1000)
    online["status"] = {"nominatedNodeName": "a"}
    svc.pod_event("ADDED", online)
    # b1 is terminating (deletionTimestamp set, slices still held): online does not fit yet, but will.
    leaving = copy.deepcopy(pods["b1"])
    leaving["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    svc.pod_event("MODIFIED", leaving)
    small = _pod("small-batch", 10000, 1)  # fits GPU 1 (11920 MiB free) today
    r = http.post("/filter", json={"Pod": small, "NodeNames": ["a", "b"]}).json()
    assert r["NodeNames"] == ["b"] and "online" in r["FailedNodes"]["a"], r
    # A pod of at least the preemptor's priority is not held back.
    assert http.post("/filter", json={"Pod": _pod("urgent", 10000, 5000), "NodeNames": ["a"]}).json()["NodeNames"]
    # b1 gone: online holds 40000 of GPU 0's 51920 MiB, and the small pod fits beside it again.
    svc.pod_event("DELETED", leaving)
    assert http.post("/filter", json={"Pod": small, "NodeNames": ["a", "b"]}).json()["NodeNames"] == ["a", "b"]
    # A nomination that cannot fit even once the node's leaving pods are gone (none are) closes nothing.
    huge = _pod("huge-online", 81000, 1000)
    huge["status"] = {"nominatedNodeName": "a"}
    svc.pod_event("ADDED", huge)
    assert "ns/huge-online" in svc.books.nominated
    r = http.post("/filter", json={"Pod": _pod("tiny", 1000, 1), "NodeNames": ["a"]}).json()
    assert r["NodeNames"] == ["a"], r


def test_bind_honours_the_preemptors_hold_as_filter_does() -> None:
    """A lower-priority pod that passed /filter just before the nomination became known must not bind into the room."""
    svc, http = _service()
    pods = _fill(svc)
    binder = svc.binder
    assert isinstance(binder, FakeBinder)
    online = _pod("online", 40000, 1000)
    online["status"] = {"nominatedNodeName": "a"}
    svc.pod_event("ADDED", online)
    leaving = copy.deepcopy(pods["b1"])
    leaving["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    svc.pod_event("MODIFIED", leaving)
    small = _pod("small-batch", 10000, 1)
    binder.pods["ns/small-batch"] = small

    def bind(pod: dict[str, Any]) -> dict[str, Any]:
        body = {"PodName": pod["metadata"]["name"], "PodNamespace": "ns", "PodUID": pod["metadata"]["uid"], "Node": "a"}
        out: dict[str, Any] = http.post("/bind", json=body).json()
        return out

    # b1 still terminating: node a is closed to the small pod, nothing reserved.
    assert "held for pod ns/online" in bind(small)["Error"]
    assert "ns/small-batch" not in svc.state.assignments
    # b1 gone: online's stand-in takes 40000 of GPU 0's 51920 MiB; a 40000 batch pod no longer fits anywhere on a.
    svc.pod_event("DELETED", leaving)
    big = _pod("big-batch", 40000, 1)
    binder.pods["ns/big-batch"] = big
    assert "no longer fits" in bind(big)["Error"]
    # The small pod fits beside the stand-in, and binds; the stand-in is gone after the call.
    assert bind(small).get("Error", "") == ""
    assert "ns/small-batch" in svc.state.assignments
    assert all(not k.startswith("nominated:") for k in svc.state.assignments)


class _StatusRace(BaseHTTPRequestHandler):
    """A pod whose status kube-scheduler rewrote (status.nominatedNodeName, after a preemption) after the version our
    watch delivered (7): a Binding on any version but 9 gets 409; GET shows version 9, bound to `bound_to` if set."""

    bound_to = ""
    bindings: list[dict[str, Any]] = []

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        pod = _pod("p", 1000, 0)
        pod["metadata"]["resourceVersion"] = "9"
        pod["status"] = {"nominatedNodeName": "a"}
        if self.bound_to:
            pod["spec"]["nodeName"] = self.bound_to
        self._send(200, pod)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bindings.append(body)
        if body["metadata"]["resourceVersion"] != "9" or self.bound_to:
            self._send(409, {"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409})
            return
        self._send(201, {"kind": "Status", "status": "Success"})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("bound_to", ["", "b"])
def test_a_binding_refused_by_a_status_write_in_between_is_sent_again_only_on_the_same_pod(bound_to: str) -> None:
    """Through the real KubeBinder: the Binding on the watched version is refused (409); the pod read then is the
    same pod at version 9, so the Binding, with the same assignment, goes again on 9. A pod bound elsewhere since
    is not bound again: the reservation is freed."""
    handler = type("Handler", (_StatusRace,), {"bound_to": bound_to, "bindings": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conf = kclient.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        state = ClusterState()
        state.upsert_node(NodeInventory("a", (GpuDevice("GPU-a-0", 0, "H100", MIB),)))
        # kube-scheduler's 5 s httpTimeout would be the deadline of the three apiserver calls; 30 s, so a loaded
        # machine's stall ends no call early (the retry path is the behaviour here, not the deadline)
        binder = KubeBinder(kclient.CoreV1Api(kclient.ApiClient(conf)))
        svc = ExtenderService(state, binder, options=ServiceOptions(bind_timeout_s=30.0))
        watched = _pod("p", 1000, 0)
        watched["metadata"]["resourceVersion"] = "7"
        svc.pod_event("ADDED", watched)
        body = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-p", "Node": "a"}
        err = TestClient(create_app(svc)).post("/bind", json=body).json()["Error"]
        versions = [b["metadata"]["resourceVersion"] for b in handler.bindings]
        if bound_to:
            assert "already bound to b" in err and versions == ["7"]
            assert "ns/p" not in svc.state.assignments and not len(svc.reservations)
        else:
            assert err == "" and versions == ["7", "9"]
            first, second = (b["metadata"]["annotations"] for b in handler.bindings)
            assert first[ann.POD_ASSIGNMENT] == second[ann.POD_ASSIGNMENT]
            assert ann.decode_assignment(second[ann.POD_ASSIGNMENT]) == svc.state.assignments["ns/p"]
    finally:
        server.shutdown()
        server.server_close()


def test_nodes_past_the_time_budget_are_left_out() -> None:
    from scheduler_extender.preempt import given_victims, victims_result
    from vgpu.pod import pod_info
    from vgpu.priority import Priority

    svc, _ = _service()
    _fill(svc)
    online = _pod("online", 40000, 1000)
    ticks = iter(range(100))
    given = given_victims({"a": _meta("uid-b3"), "b": _meta("uid-h0")}, None)
    out = victims_result(
        svc.state,
        svc.planner,
        svc.books,
        pod_info(online),
        Priority(1000),
        given,
        [],
        budget_s=1.5,
        clock=lambda: float(next(ticks)),
    )
    assert out == {"a": _meta("uid-b1")}  # node a examined at t=1, node b (t=2) past the 1.5 s budget


def test_every_preempt_call_is_counted_once_by_outcome() -> None:
    """A preemptor without a GPU request gets kube-scheduler's victims back, one with an invalid GPU request gets
    none; both were answered without a count before, so the outcome metric missed calls."""
    svc, http = _service()
    _fill(svc)
    cpu_only = _pod("cpu-only", 1, 1000)
    cpu_only["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    broken = _pod("broken", 1, 1000)
    broken["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "150"
    _pending(svc, cpu_only, broken)

    def count(outcome: str) -> float:
        value: float = svc.metrics.preemptions.labels(outcome)._value.get()
        return value

    given = {"a": _meta("uid-b3")}
    r = http.post("/preempt", json={"Pod": cpu_only, "NodeNameToMetaVictims": given})
    assert r.status_code == 200 and r.json()["NodeNameToMetaVictims"] == given
    assert count("no-gpu") == 1
    r = http.post("/preempt", json={"Pod": broken, "NodeNameToMetaVictims": given})
    assert r.status_code == 200 and r.json()["NodeNameToMetaVictims"] == {}
    assert count("cannot-fit") == 1
    assert count("answered") == count("no-node") == 0
