"""/bind takes the pod from the pod watch instead of a GET and sends one Binding on its version; a version the watch
has not caught up with is refused by the apiserver (409), read again and bound on only if the pod parses the same
(scheduler_extender.unbound_pods, scheduler_extender.bind)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler_extender import schema
from scheduler_extender.service import ExtenderService
from scheduler_extender.unbound_pods import UnboundPods
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _state
from vgpu.config import ResourceNames


def _versioned(name: str, version: str, pct: int = 50) -> dict[str, Any]:
    pod = _pod(name, pct)
    pod["metadata"]["resourceVersion"] = version
    return pod


@pytest.fixture
def setup() -> tuple[ExtenderService, FakeBinder]:
    binder = FakeBinder()
    return ExtenderService(_state(), binder), binder


def test_bind_takes_the_watched_pod_without_reading_it(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    pod = _versioned("p", "7")
    binder.pods["ns/p"] = pod
    svc.pod_event("ADDED", copy.deepcopy(pod))
    assert _bind(svc, pod, "a") == ""
    assert binder.reads == 0 and binder.sent == [("ns/p", "7")] and binder.written["ns/p"].node == "a"
    assert svc.state.assignments["ns/p"].node == "a"


def test_a_pod_the_watch_has_not_delivered_is_read(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    pod = _versioned("p", "7")
    binder.pods["ns/p"] = pod
    assert _bind(svc, pod, "a") == ""
    assert binder.reads == 1 and "ns/p" in binder.written


def test_a_watched_pod_under_another_uid_is_not_used(setup: tuple[ExtenderService, FakeBinder]) -> None:
    """The watch still shows an earlier pod of that name: the apiserver's answer decides (the UID the bind names)."""
    svc, binder = setup
    old = _versioned("p", "3")
    svc.pod_event("ADDED", old)
    new = _versioned("p", "9")
    binder.pods["ns/p"] = new
    assert _bind(svc, new, "a") == ""
    assert binder.reads == 1 and new["spec"]["nodeName"] == "a"


def test_a_stale_watched_version_is_read_again_and_bound_on_the_new_one(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    """kube-scheduler wrote the pod's status after the version the watch delivered: the conditional write is
    refused (409), the pod read once, and, unchanged in what placement depends on, written on its new version."""
    svc, binder = setup
    pod = _versioned("p", "7")
    svc.pod_event("ADDED", copy.deepcopy(pod))
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = "8"
    newer["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    binder.pods["ns/p"] = newer
    assert _bind(svc, pod, "a") == ""
    assert binder.reads == 1 and binder.sent == [("ns/p", "7"), ("ns/p", "8")]
    assert binder.written["ns/p"].node == "a" and newer["spec"]["nodeName"] == "a"
    assert svc.state.assignments["ns/p"] == binder.written["ns/p"] and not len(svc.reservations)


def test_a_pod_that_changed_since_the_watched_version_is_not_bound(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    """The apiserver's pod asks for more than the watched version the slices were reserved for: nothing is
    written, the slices are released, and kube-scheduler retries the pod."""
    svc, binder = setup
    pod = _versioned("p", "7", pct=20)
    svc.pod_event("ADDED", copy.deepcopy(pod))
    bigger = _versioned("p", "8", pct=90)
    bigger["metadata"]["uid"] = pod["metadata"]["uid"]
    binder.pods["ns/p"] = bigger
    err = _bind(svc, pod, "a")
    assert "the pod changed while it was being bound" in err
    assert "ns/p" not in binder.written and "ns/p" not in svc.state.assignments and not len(svc.reservations)
    assert not bigger["spec"].get("nodeName") and svc.state.totals()["memory_used_mib"] == 0
    assert binder.sent == [("ns/p", "7")] and "ns/p" not in svc.sync.unbound  # never sent again, nothing held


def test_a_pod_bound_since_the_watched_version_is_not_bound_again(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    svc, binder = setup
    pod = _versioned("p", "7")
    svc.pod_event("ADDED", copy.deepcopy(pod))
    bound = copy.deepcopy(pod)
    bound["metadata"]["resourceVersion"] = "8"
    bound["spec"]["nodeName"] = "b"
    binder.pods["ns/p"] = bound
    err = _bind(svc, pod, "a")
    assert "already bound to b" in err and binder.sent == [("ns/p", "7")]
    assert "ns/p" not in binder.written and "ns/p" not in svc.state.assignments and not len(svc.reservations)


def test_a_rebind_that_gets_no_answer_is_held_and_fenced_on_the_version_it_was_sent_on(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    """The Binding on the watched version is refused (409), the one on the version read then gets no answer and the
    pod reads unbound at that version: it may still land. The slices stay held past the grace until the fence, a
    write on the version that second Binding was sent on (not the watched one), makes sure it cannot."""
    svc, binder = setup
    now = [1000.0]
    svc.sync.clock = lambda: now[0]
    pod = _versioned("p", "7", pct=100)
    svc.pod_event("ADDED", copy.deepcopy(pod))
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = "8"
    binder.pods["ns/p"] = newer
    calls = []

    def bind(**kwargs: Any) -> None:
        calls.append(kwargs["version"])
        if len(calls) == 2:
            binder.sent.append(("ns/p", kwargs["version"]))
            raise TimeoutError("read timed out")
        FakeBinder.bind(binder, **kwargs)

    binder.bind = bind  # type: ignore[method-assign]
    err = _bind(svc, pod, "a")
    assert "binding outcome unknown" in err and calls == ["7", "8"] and binder.reads == 2
    held = svc.state.assignments["ns/p"]
    assert not len(svc.reservations) and "ns/p" in svc.sync.unbound
    svc.filter(schema.ExtenderArgs(Pod=newer, NodeNames=["a", "b"]))  # its retry does not free them
    assert "holds a live assignment" in _bind(svc, newer, "b")
    assert svc.state.assignments["ns/p"] == held and binder.fenced == []
    now[0] += svc.sync.bind_grace_s + 1
    svc.expire_unbound()
    assert binder.fenced == [("ns/p", "8")] and "ns/p" not in svc.state.assignments
    assert "ns/p" not in svc.sync.unbound


def test_an_unknown_binding_the_watch_shows_landed_keeps_its_slices_and_is_never_fenced(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    svc, binder = setup
    now = [1000.0]
    svc.sync.clock = lambda: now[0]
    pod = _versioned("p", "7")
    svc.pod_event("ADDED", copy.deepcopy(pod))
    binder.pods["ns/p"] = pod
    binder.bind_times_out = True
    assert "binding outcome unknown" in _bind(svc, pod, "a")
    held = svc.state.assignments["ns/p"]
    binder.bind_times_out = False
    FakeBinder.bind(
        binder, namespace="ns", name="p", uid=pod["metadata"]["uid"], version="7", node="a", assignment=held
    )
    svc.pod_event("MODIFIED", copy.deepcopy(pod))  # bound, the assignment on it: one event, one write
    now[0] += svc.sync.bind_grace_s + 1
    svc.expire_unbound()
    assert binder.fenced == [] and svc.state.assignments["ns/p"] == held and "ns/p" not in svc.sync.unbound


# -- the book itself ---------------------------------------------------------------------------------------------


def test_only_unbound_active_pods_asking_for_our_resources_are_kept() -> None:
    book = UnboundPods(ResourceNames())
    gpu = _versioned("gpu", "1")
    plain = {"metadata": {"name": "plain", "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]}}
    by_request = _versioned("req", "1")
    c = by_request["spec"]["containers"][0]
    c["resources"] = {"requests": {"nvidia.com/gpumem": "1000"}}
    for p in (gpu, plain, by_request):
        book.event("ADDED", p)
    assert book.get("ns/gpu") is gpu and book.get("ns/req") is by_request and book.get("ns/plain") is None
    bound = copy.deepcopy(gpu)
    bound["spec"]["nodeName"] = "a"
    book.event("MODIFIED", bound)
    assert book.get("ns/gpu") is None
    finished = {**by_request, "status": {"phase": "Succeeded"}}
    book.event("MODIFIED", finished)
    assert len(book) == 0
    book.event("ADDED", gpu)
    deleting = copy.deepcopy(gpu)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    book.event("MODIFIED", deleting)
    assert book.get("ns/gpu") is None
    book.event("ADDED", gpu)
    book.event("DELETED", gpu)
    assert len(book) == 0


def test_the_book_is_bounded_and_a_relist_replaces_it() -> None:
    book = UnboundPods(ResourceNames(), max_pods=2)
    pods = [_versioned(f"p{i}", "1") for i in range(3)]
    for p in pods:
        book.event("ADDED", p)
    assert len(book) == 2 and book.get("ns/p2") is None  # full: p2 is read with a GET when bound
    newer = copy.deepcopy(pods[0])
    newer["metadata"]["resourceVersion"] = "2"
    book.event("MODIFIED", newer)  # a kept pod is still updated when the book is full
    assert book.get("ns/p0") is newer
    book.replace([pods[2]])
    assert len(book) == 1 and book.get("ns/p2") is pods[2]


def test_a_stale_watched_version_that_cannot_be_read_again_frees_the_slices(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    """The 409 says the Binding was not applied; if the pod cannot be read to try again, nothing is held."""
    svc, binder = setup
    pod = _versioned("p", "7")
    svc.pod_event("ADDED", copy.deepcopy(pod))
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = "8"
    binder.pods["ns/p"] = newer
    binder.get_fails = True
    err = _bind(svc, pod, "a")
    assert "the pod changed while it was being bound" in err and "cannot read the pod" in err
    assert binder.sent == [("ns/p", "7")] and "ns/p" not in svc.state.assignments and not len(svc.reservations)
    assert "ns/p" not in svc.sync.unbound and not newer["spec"].get("nodeName")
