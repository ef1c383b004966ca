"""The preemption books keep a pod's PodMeta across watch events that cannot change it (bound, status, deleting) and
make it again when its labels or UID change (scheduler_extender.preempt.Books.pod_event)."""

from __future__ import annotations

import copy
from typing import Any

from scheduler_extender.preempt import Books, pod_meta
from vgpu import annotations as ann


def _pod(uid: str = "u1", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": "5",
            "creationTimestamp": "2026-12-02T05:00:00Z",
            "labels": dict(labels),
        },
        "spec": {"priority": 7, "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


def test_events_that_leave_labels_and_uid_keep_the_same_meta() -> None:
    books = Books()
    pod = _pod(app="x")
    books.pod_event("ADDED", pod)
    first = books.pods["ns/p"]
    bound = copy.deepcopy(pod)
    bound["metadata"]["resourceVersion"] = "6"
    bound["spec"]["nodeName"] = "n1"
    bound["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    books.pod_event("MODIFIED", bound)
    deleting = copy.deepcopy(bound)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-02T05:01:00Z"
    books.pod_event("MODIFIED", deleting)
    assert books.pods["ns/p"] is first and first == pod_meta(deleting)
    assert "ns/p" in books.terminating


def test_a_label_change_or_another_uid_makes_it_again() -> None:
    books = Books()
    books.pod_event("ADDED", _pod(app="x"))
    first = books.pods["ns/p"]
    high = _pod(app="x", **{ann.LABEL_PRIORITY: "0"})  # the webhook's priority label: the priority changes
    books.pod_event("MODIFIED", high)
    assert books.pods["ns/p"] == pod_meta(high) and books.pods["ns/p"].priority != first.priority
    recreated = _pod(uid="u2", app="x", **{ann.LABEL_PRIORITY: "0"})
    books.pod_event("ADDED", recreated)
    assert books.pods["ns/p"].uid == "u2" and books.pods["ns/p"] == pod_meta(recreated)
    books.pod_event("DELETED", recreated)
    assert "ns/p" not in books.pods
