"""scheduler_extender.assignment_memo: a pod's watch events decode its assignment text once (the Binding's text is
known from the bind that encoded it), what they decode is what decode_assignment gives, bad texts are never kept,
the memo stays bounded, and a pod's deletion still frees its slices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler_extender import assignment_memo
from scheduler_extender.kube import KubeBinder
from scheduler_extender.service import ExtenderService
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _state
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.errors import CodecError


def _a(node: str = "n1", cores: int = 20) -> Assignment:
    return Assignment(node, (ContainerAssignment("vllm", (DeviceSlice("GPU-1", 3, 1024, cores),)),), ann.Role.DECODE)


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    assignment_memo.forget_all()
    yield
    assignment_memo.forget_all()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ann.decode_assignment was asked to decode."""
    calls: list[str] = []
    real = ann.decode_assignment

    def counted(text: str) -> Assignment:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(ann, "decode_assignment", counted)
    return calls


def test_a_text_the_bind_encoded_is_not_decoded_again(decodes: list[str]) -> None:
    a = _a()
    text = assignment_memo.encode(a)
    assert text == ann.encode_assignment(a)
    assert assignment_memo.decode(text) is a and decodes == []


def test_a_text_read_is_decoded_once_and_equals_what_decode_assignment_gives(decodes: list[str]) -> None:
    text = ann.encode_assignment(_a(cores=30))
    first = assignment_memo.decode(text)
    assert first == ann.decode_assignment(text)
    decodes.clear()
    assert assignment_memo.decode(text) is first and decodes == []
    assert assignment_memo.decode(ann.encode_assignment(_a(cores=40))).containers[0].devices[0].cores == 40


def test_a_text_that_does_not_decode_raises_every_time(decodes: list[str]) -> None:
    for _ in range(2):
        with pytest.raises(CodecError):
            assignment_memo.decode('{"version": 1, "node": 7}')
    assert len(decodes) == 2


def test_the_memo_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assignment_memo, "LIMIT", 8)
    texts = [assignment_memo.encode(_a(node=f"n{i}")) for i in range(20)]
    assert len(assignment_memo._by_text) <= 8
    # a text cleared away is decoded again, to the same assignment
    assert assignment_memo.decode(texts[0]) == _a(node="n0")


def test_the_kube_binder_sends_the_text_it_remembers(monkeypatch: pytest.MonkeyPatch, decodes: list[str]) -> None:
    sent: dict[str, Any] = {}
    monkeypatch.setattr("scheduler_extender.kube.create_binding", lambda api, **kw: sent.update(kw))
    a = _a()
    KubeBinder(api=None).bind(namespace="ns", name="p", uid="u", version="7", node="n1", assignment=a)  # type: ignore[arg-type]
    text = sent["annotations"][ann.POD_ASSIGNMENT]
    assert text == ann.encode_assignment(a) and assignment_memo.decode(text) is a and decodes == []


def test_the_watch_decodes_a_pods_assignment_once_and_its_deletion_frees_the_slices(decodes: list[str]) -> None:
    """The Binding's event, a status write and the deletion's MODIFIED event all carry the same text: one decode
    (FakeBinder writes the text as the apiserver would, without the memo), and the DELETED event frees the slices."""
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)
    pod = _pod("p", 50, resourceVersion="1")
    binder.pods["ns/p"] = pod
    svc.pod_event("ADDED", dict(pod))
    assert _bind(svc, pod, "a") == ""
    held = svc.state.assignments["ns/p"]
    decodes.clear()
    for extra in ({}, {"resourceVersion": "3"}, {"deletionTimestamp": "2026-12-02T07:01:00Z"}):
        event = {**pod, "metadata": {**pod["metadata"], **extra}}
        svc.pod_event("MODIFIED", event)
        assert svc.state.assignments["ns/p"] == held
    assert len(decodes) == 1
    svc.pod_event("DELETED", {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "x"}})
    assert "ns/p" not in svc.state.assignments and "ns/p" not in svc.state.orphans
