"""A standby learns from its pod watch what a list of all pods would seed, so taking over lists nothing."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from scheduler_extender import schema
from scheduler_extender.learning import FED_PODS, RECENT_PODS
from scheduler_extender.service import ExtenderService
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _running, _state
from vgpu import annotations as ann


def _recorded(svc: ExtenderService) -> Counter[str]:
    """Every pod the service's policy is fed, by name (a count above 1 is a pod learned twice)."""
    fed: Counter[str] = Counter()
    policy = svc.planner.policy(svc.planner.config.node_policy)
    observe = policy.observe

    def record(pod: Any) -> None:
        observe(pod)
        fed[pod.name] += 1

    policy.observe = record  # type: ignore[method-assign]
    return fed


def _cluster() -> list[dict[str, Any]]:
    """What the leader left running: valid pods of two shapes, and the pods a seeding skips for each reason."""
    return [
        _running("p0", 50, "GPU-a-0"),
        _running("p1", 20, "GPU-a-1"),
        _running("p2", 20, "GPU-b-0"),
        _running("bad", 150, "GPU-b-1"),  # an invalid request
        _running("alien", 10, "GPU-b-1", annotations={ann.POD_NODE_POLICY: "no-such-policy"}),
        _pod("pending", 40),  # no assignment: not ours yet
        _running("done", 30, "GPU-b-1") | {"status": {"phase": "Succeeded"}},
    ]


def _seeded(svc: ExtenderService, reason: str | None = None) -> float | None:
    sample = svc.metrics.registry.get_sample_value
    if reason is None:
        return sample("vgpu_extender_learning_seeded_pods_total")
    return sample("vgpu_extender_learning_seed_skipped_pods_total", {"reason": reason})


def test_a_standby_fed_by_its_watch_learns_what_a_list_seeding_learns() -> None:
    pods = _cluster()
    listed = ExtenderService(_state(), FakeBinder())
    by_list = _recorded(listed)
    listed.replace_pods([], seed_learning=True)
    assert listed.seed_learning_from(copy.deepcopy(pods)) == 3  # what taking over with a list learned

    watched = ExtenderService(_state(), FakeBinder())
    by_watch = _recorded(watched)
    watched.replace_pods([], seed_learning=True)  # the standby started before the leader placed anything
    for pod in pods:  # each pod as the watch shows it: created unbound, then bound with our assignment, then again
        if ann.POD_ASSIGNMENT in (pod["metadata"].get("annotations") or {}):
            fresh = copy.deepcopy(pod)
            del fresh["metadata"]["annotations"][ann.POD_ASSIGNMENT]
            fresh["spec"].pop("nodeName", None)
            fresh.pop("status", None)
            watched.pod_event("ADDED", fresh)
            watched.pod_event("MODIFIED", copy.deepcopy(pod))
        else:
            watched.pod_event("ADDED", copy.deepcopy(pod))
        watched.pod_event("MODIFIED", copy.deepcopy(pod))  # a status update: never fed again

    assert by_watch == by_list == Counter({"p0": 1, "p1": 1, "p2": 1})
    a, b = (s.planner.policy(s.planner.config.node_policy) for s in (listed, watched))
    assert getattr(a, "counts", None) == getattr(b, "counts", None)  # the same learned workload
    assert watched.learning.learned == listed.learning.learned == 3
    assert _seeded(watched) == _seeded(listed) == 3
    for reason in ("invalid-request", "unknown-policy"):
        assert _seeded(watched, reason) == _seeded(listed, reason) == 1

    assert watched.seed_learning_from(copy.deepcopy(pods)) == 0  # a list now would add nothing
    assert sum(by_watch.values()) == 3


def _leading_with(name: str) -> tuple[ExtenderService, Counter[str], dict[str, Any]]:
    """A leading replica that learned nothing yet, what its policy is fed, and an unbound pod the apiserver holds."""
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder)
    fed = _recorded(svc)
    svc.replace_pods([], seed_learning=True)
    svc.set_leading(True, leader="me")
    pod = _pod(name, 20, resourceVersion="1")
    binder.pods[f"ns/{name}"] = pod
    return svc, fed, pod


def test_a_leaders_own_binds_are_not_learned_again_from_the_watch_or_a_relist() -> None:
    svc, fed, pod = _leading_with("mine")
    svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=["a", "b"]))
    assert fed == Counter({"mine": 1})  # fed as an arrival at /filter (within the bootstrap: at once)
    for other in range(RECENT_PODS):  # /filter's memory of it is gone; the bind still knows it
        svc.learning.first_seen(f"other-{other}")
    assert _bind(svc, pod, "a") == ""
    svc.pod_event("MODIFIED", copy.deepcopy(pod))  # the watch shows it bound with our assignment
    svc.replace_pods([copy.deepcopy(pod)])  # and so does a relist
    assert fed == Counter({"mine": 1})

    placed_by_old_leader = _running("theirs", 50, "GPU-b-0")  # its event arrives after the takeover
    svc.pod_event("ADDED", placed_by_old_leader)
    svc.pod_event("MODIFIED", copy.deepcopy(placed_by_old_leader))
    assert fed == Counter({"mine": 1, "theirs": 1})


def test_a_relist_learns_the_running_pods_the_watch_missed_once() -> None:
    svc = ExtenderService(_state(), FakeBinder())
    fed = _recorded(svc)
    first = [_running("p0", 50, "GPU-a-0")]
    svc.replace_pods(first, seed_learning=True)
    missed = _running("p1", 20, "GPU-a-1")  # placed while the watch was down (a 410, then a relist)
    svc.replace_pods([*first, missed])
    svc.replace_pods([*first, missed])
    svc.pod_event("MODIFIED", copy.deepcopy(missed))
    assert fed == Counter({"p0": 1, "p1": 1})
    assert svc.state.assignments.keys() == {"ns/p0", "ns/p1"}

    svc.pod_event("DELETED", missed)  # a deleted pod's UID is forgotten; a new pod of the same name is new
    again = _running("p1", 20, "GPU-a-1")
    svc.pod_event("ADDED", again)
    assert fed == Counter({"p0": 1, "p1": 2})


def test_a_pod_the_previous_leader_filtered_and_this_replica_binds_is_learned_once() -> None:
    """A failover between a pod's /filter (at the old leader) and its /bind (here): nothing fed it here, so the watch
    showing it bound feeds it, once; more events and a relist do not feed it again."""
    svc, fed, pod = _leading_with("handed-over")
    assert _bind(svc, pod, "a") == ""
    assert ann.POD_ASSIGNMENT in pod["metadata"]["annotations"]  # the bind wrote our assignment on it
    assert fed == Counter()  # no /filter here: not an arrival
    svc.pod_event("MODIFIED", copy.deepcopy(pod))
    svc.pod_event("MODIFIED", copy.deepcopy(pod))
    svc.replace_pods([copy.deepcopy(pod)])
    assert fed == Counter({"handed-over": 1})
    assert svc.learning.learned == 1


def test_the_memory_of_pods_fed_at_filter_is_bounded_and_forgets_deleted_pods() -> None:
    svc = ExtenderService(_state(), FakeBinder())
    learning = svc.learning
    for i in range(FED_PODS + 10):  # made-up pods a caller filters and never binds
        assert learning.first_seen(f"u{i}")
    assert not learning.knows("u0")  # the oldest fell out of both memories
    assert learning.knows(f"u{FED_PODS + 9}") and learning.knows(f"u{FED_PODS - RECENT_PODS}")
    assert not learning.first_seen(f"u{FED_PODS - RECENT_PODS}")  # fed already, out of /filter's recent memory
    learning.forget(f"u{FED_PODS - RECENT_PODS}")
    learning.keep_only([f"u{FED_PODS + 9}"])  # a relist that holds only this pod
    assert learning.knows(f"u{FED_PODS + 9}")
    assert not learning.knows(f"u{FED_PODS + 8 - RECENT_PODS}")
