"""ExtenderService and StateSync without HTTP: bind rollback, stale reservations, bind grace, learning."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from scheduler_extender import deadline, schema
from scheduler_extender.learning import LEARN_BOOTSTRAP
from scheduler_extender.service import ExtenderService, ServiceOptions
from scheduler_extender.sources.kube import KubeSource
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.placement import registry
from vgpu.placement.frag import shape_of
from vgpu.placement.fragaware import FragAware
from vgpu.pod import PodInfo, pod_info
from vgpu.state import ClusterState


class Refusal(Exception):
    """An apiserver answer with a status (as kubernetes.client.ApiException carries): nothing was applied."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.body = body


class FakeBinder:
    """In-memory apiserver stand-in for the Binder that can be told to fail each step. A Binding is checked as the
    apiserver checks it (kubernetes v1.34.4 BindingREST.setPodNodeAndMetadata): UID and resourceVersion
    preconditions, a pod bound already, each a 409 with nothing applied; one that applies sets spec.nodeName and
    the annotations it carries, and moves the pod's resourceVersion on."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.written: dict[str, Assignment] = {}  # the assignments Bindings carried onto pods
        self.sent: list[tuple[str, str]] = []  # (pod, the resourceVersion each Binding was sent on)
        self.fail_bind = False  # the apiserver refuses every Binding (403): nothing is applied
        self.bind_lands_anyway = False
        self.bind_times_out = False  # no answer, nothing applied (yet): the outcome is unknown to the extender
        self.get_fails = False  # reads fail once a Binding was tried: the check whether it landed fails too
        self.bind_tried = False
        self.reads = 0
        self.fenced: list[tuple[str, str]] = []  # (pod, the version the fence wrote on)

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        if self.get_fails and self.bind_tried:
            raise TimeoutError("read timed out")
        self.reads += 1
        return copy.deepcopy(self.pods.get(f"{namespace}/{name}"))

    def bind(
        self, *, namespace: str, name: str, uid: str, version: str, node: str, assignment: Assignment | None
    ) -> None:
        key = f"{namespace}/{name}"
        self.bind_tried = True
        self.sent.append((key, version))
        if self.fail_bind:
            raise Refusal(403, "pods/binding is forbidden")
        if self.bind_times_out and not self.bind_lands_anyway:
            raise TimeoutError("binding timed out")
        self._apply(key, uid, version, node, assignment)
        if self.bind_lands_anyway:
            raise TimeoutError("binding timed out")

    def _apply(self, key: str, uid: str, version: str, node: str, assignment: Assignment | None) -> None:
        pod = self.pods.get(key)
        if pod is None:
            raise Refusal(404, f"pods {key} not found")
        meta = pod["metadata"]
        current = meta.get("resourceVersion", "")
        if uid and meta.get("uid") != uid:
            raise Refusal(409, f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}")
        if version and version != current:
            raise Refusal(409, f"Precondition failed: ResourceVersion in precondition: {version}, now {current}")
        if pod["spec"].get("nodeName"):
            raise Refusal(409, f"pod {key} is already assigned to node {pod['spec']['nodeName']!r}")
        pod["spec"]["nodeName"] = node
        if assignment is not None:
            meta.setdefault("annotations", {}).update(
                {ann.POD_ASSIGNMENT: ann.encode_assignment(assignment), ann.POD_BIND_PHASE: "allocating"}
            )
            self.written[key] = assignment
        if current.isdigit():
            meta["resourceVersion"] = str(int(current) + 1)

    def fence(self, *, namespace: str, name: str, uid: str, version: str) -> bool:
        if self.get_fails:
            raise TimeoutError("read timed out")
        self.fenced.append((f"{namespace}/{name}", version))
        return not (self.pods.get(f"{namespace}/{name}") or {}).get("spec", {}).get("nodeName")


def _state() -> ClusterState:
    state = ClusterState()
    for n in ("a", "b"):
        state.upsert_node(NodeInventory(n, tuple(GpuDevice(f"GPU-{n}-{i}", i, "H100", 81920) for i in range(2))))
    return state


def _pod(name: str, pct: int = 50, **meta: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": str(pct), "nvidia.com/gpucores": str(pct)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": str(uuid.uuid4()), **meta},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def _bind(svc: ExtenderService, pod: dict[str, Any], node: str) -> str:
    m = pod["metadata"]
    args = schema.ExtenderBindingArgs(PodName=m["name"], PodNamespace="ns", PodUID=m["uid"], Node=node)
    return svc.bind(args)["Error"]


@pytest.fixture
def setup() -> tuple[ExtenderService, FakeBinder]:
    binder = FakeBinder()
    return ExtenderService(_state(), binder), binder


def test_bind_sends_one_binding_that_carries_the_assignment(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    pod = _pod("p", resourceVersion="7")
    binder.pods["ns/p"] = pod
    assert _bind(svc, pod, "a") == ""
    assert binder.sent == [("ns/p", "7")]  # one write, conditional on the version read
    assert binder.written["ns/p"].node == "a" and pod["spec"]["nodeName"] == "a"
    assert ann.decode_assignment(pod["metadata"]["annotations"][ann.POD_ASSIGNMENT]) == binder.written["ns/p"]
    assert svc.state.assignments["ns/p"] == binder.written["ns/p"] and not len(svc.reservations)


def test_a_refused_binding_frees_the_slices_and_writes_nothing(setup: tuple[ExtenderService, FakeBinder]) -> None:
    """The Binding carried the assignment: refused, nothing reached the pod, so nothing is undone there."""
    svc, binder = setup
    pod = _pod("p", resourceVersion="7")
    binder.pods["ns/p"] = pod
    binder.fail_bind = True
    err = _bind(svc, pod, "a")
    assert "binding failed" in err and "ns/p" in err and "forbidden" in err
    assert "ns/p" not in svc.state.assignments and not len(svc.reservations) and "ns/p" not in svc.sync.unbound
    assert binder.sent == [("ns/p", "7")] and binder.fenced == [] and "annotations" not in pod["metadata"]
    assert svc.state.totals()["memory_used_mib"] == 0
    binder.fail_bind = False  # kube-scheduler's retry binds at once: nothing was left held
    assert _bind(svc, pod, "a") == "" and svc.state.assignments["ns/p"].node == "a"


@pytest.mark.parametrize("answer", [TimeoutError("read timed out"), Refusal(504, "Timeout: request did not complete")])
def test_a_binding_without_an_answer_is_read_back_and_one_that_can_no_longer_land_frees_at_once(
    setup: tuple[ExtenderService, FakeBinder], answer: Exception
) -> None:
    """No answer (or the apiserver's own 504, whose handler goes on): the pod is read back. Unbound at the version
    the Binding was sent on, it may still land (held); unbound at a newer version, its precondition can never hold."""
    svc, binder = setup
    pod = _pod("p", resourceVersion="7")
    binder.pods["ns/p"] = pod

    def lost(**kwargs: Any) -> None:
        binder.sent.append(("ns/p", kwargs["version"]))
        pod["metadata"]["resourceVersion"] = "8"  # kube-scheduler wrote the pod's status meanwhile
        raise answer

    binder.bind = lost  # type: ignore[method-assign]
    err = _bind(svc, pod, "a")
    assert "binding failed" in err and "outcome unknown" not in err
    assert "ns/p" not in svc.state.assignments and not len(svc.reservations) and "ns/p" not in svc.sync.unbound
    assert binder.reads == 2  # the pod to bind, then the read-back


@pytest.mark.parametrize(
    ("answer", "may_land"),
    [
        (
            Refusal(
                500, "Internal Server Error", '{"reason":"InternalError","message":"etcdserver: request timed out"}'
            ),
            True,
        ),
        (
            Refusal(500, "Internal Server Error", '{"reason":"ServerTimeout","message":"the server cannot complete"}'),
            True,
        ),
        (
            Refusal(500, "Internal Server Error", '{"reason":"InternalError","message":"admission webhook crashed"}'),
            False,
        ),
        (Refusal(500, "Internal Server Error", "not json at all"), False),
    ],
)
def test_a_500_that_reports_a_storage_timeout_may_still_land(
    setup: tuple[ExtenderService, FakeBinder], answer: Refusal, may_land: bool
) -> None:
    """etcd can commit a write the apiserver gave up waiting for: such a 500 is read back and, the pod unbound at
    the version the Binding was sent on, its slices stay held. Any other 500 refused the write: freed at once."""
    svc, binder = setup
    pod = _pod("p", resourceVersion="7")
    binder.pods["ns/p"] = pod

    def lost(**kwargs: Any) -> None:
        binder.sent.append(("ns/p", kwargs["version"]))
        raise answer

    binder.bind = lost  # type: ignore[method-assign]
    err = _bind(svc, pod, "a")
    if may_land:
        assert "binding outcome unknown" in err and "ns/p" in svc.state.assignments and binder.reads == 2
    else:
        assert "binding failed" in err and "outcome unknown" not in err
        assert "ns/p" not in svc.state.assignments and not len(svc.reservations) and binder.reads == 1


def test_a_binding_never_sent_for_want_of_time_frees_at_once(setup: tuple[ExtenderService, FakeBinder]) -> None:
    """The deadline had passed before the Binding could be sent (the call was not made): it can never land, so
    nothing is held and nothing is read back."""
    svc, binder = setup
    pod = _pod("p", resourceVersion="7")
    binder.pods["ns/p"] = pod

    def late(**kwargs: Any) -> None:
        raise deadline.DeadlineExceeded("deadline passed 0.010 s ago; the call was not made")

    binder.bind = late  # type: ignore[method-assign]
    err = _bind(svc, pod, "a")
    assert "binding failed" in err and "was not made" in err and "outcome unknown" not in err
    assert "ns/p" not in svc.state.assignments and not len(svc.reservations) and binder.reads == 1


@pytest.mark.parametrize("check", ["reads_unbound", "read_fails"])
def test_a_binding_whose_outcome_is_unknown_keeps_its_slices_until_the_grace(
    check: str,
) -> None:
    """A Binding that got no answer may still be applied: freeing its slices let the next pod onto a GPU this one
    then ran on (over-commits under apiserver overload, benchmarks/scale.py). They stay held, also against the
    pod's own retry through /filter, until the watch shows the pod bound or the grace passes."""
    now = [1000.0]
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder, options=ServiceOptions(bind_grace_s=30))
    svc.sync.clock = lambda: now[0]
    pod = _pod("p", pct=100)
    binder.pods["ns/p"] = pod
    binder.bind_times_out = True
    binder.get_fails = check == "read_fails"
    err = _bind(svc, pod, "a")
    assert "binding outcome unknown" in err and "stay held" in err
    held = svc.state.assignments["ns/p"]
    assert not len(svc.reservations) and "annotations" not in pod["metadata"]

    binder.bind_times_out = binder.get_fails = False
    svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=["a"]))  # its own retry does not free them
    assert svc.state.assignments["ns/p"] == held
    others = [_pod(f"o{i}", pct=100) for i in range(2)]
    for other in others:
        binder.pods[f"ns/{other['metadata']['name']}"] = other
    errors = [_bind(svc, other, "a") for other in others]
    assert sum(e == "" for e in errors) == 1, errors  # node a has 2 GPUs: one is still held for p

    now[0] = 1031.0  # the Binding never showed up within the grace: released
    svc.expire_unbound()
    assert "ns/p" not in svc.state.assignments


def test_an_unknown_binding_that_shows_bound_keeps_its_slices(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    binder.bind_times_out = True
    assert "binding outcome unknown" in _bind(svc, pod, "a")
    held = svc.state.assignments["ns/p"]
    landed = copy.deepcopy(pod)  # the apiserver applied it after all; the watch brings the pod with its assignment
    landed["spec"]["nodeName"] = "a"
    landed["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(held),
        ann.POD_BIND_PHASE: "allocating",
    }
    svc.pod_event("MODIFIED", landed)
    svc.expire_unbound()
    assert svc.state.assignments["ns/p"] == held and "ns/p" not in svc.sync.unbound


def test_a_binding_that_timed_out_but_landed_counts_as_bound(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    binder.bind_lands_anyway = True
    assert _bind(svc, pod, "a") == ""
    assert "ns/p" in svc.state.assignments and "ns/p" not in svc.sync.unbound and not len(svc.reservations)


def test_recreated_pod_is_refused_by_uid(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    old = _pod("p")
    binder.pods["ns/p"] = _pod("p")  # same name, new UID
    err = _bind(svc, old, "a")
    assert "UID is" in err and old["metadata"]["uid"] in err and "ns/p" not in svc.state.assignments


def test_a_pod_filtered_again_drops_its_stale_reservation(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, _binder = setup
    pod = _pod("p", 100)
    a = Assignment("a", (ann.ContainerAssignment("c", (ann.DeviceSlice("GPU-a-0", 0, 81920, 100),)),))
    written = copy.deepcopy(pod)  # a bind wrote it, the Binding never landed: an unbound reservation
    written["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(a),
        ann.POD_BIND_PHASE: "allocating",
    }
    svc.pod_event("MODIFIED", written)
    assert "ns/p" in svc.state.assignments and "ns/p" in svc.sync.unbound
    result = svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=["a"]))
    assert result["NodeNames"] == ["a"]  # both GPUs free again: the old reservation was released
    assert "ns/p" not in svc.state.assignments


def test_assignment_without_binding_expires_after_the_grace() -> None:
    now = [1000.0]
    svc = ExtenderService(_state(), FakeBinder(), options=ServiceOptions(bind_grace_s=30))
    svc.sync.clock = lambda: now[0]
    a = Assignment("a", (ann.ContainerAssignment("c", (ann.DeviceSlice("GPU-a-0", 0, 40960, 50),)),))
    pod = _pod("p")
    pod["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(a),
        ann.POD_BIND_PHASE: "allocating",
        ann.POD_BIND_TIME: "990.0",
    }
    svc.pod_event("ADDED", pod)
    assert "ns/p" in svc.state.assignments  # may still land: reserved, from when the extender first saw it
    now[0] = 1029.0  # bind-time 990 + 30 is long past: the pod's own time does not count
    svc.expire_unbound()
    assert "ns/p" in svc.state.assignments
    now[0] = 1031.0
    svc.expire_unbound()
    assert "ns/p" not in svc.state.assignments
    svc.pod_event("MODIFIED", pod)  # a later event of the same stale pod does not re-reserve
    assert "ns/p" not in svc.state.assignments
    pod["spec"]["nodeName"] = "a"  # ... but the binding landing does
    svc.pod_event("MODIFIED", pod)
    assert svc.state.assignments["ns/p"] == a


def _recording_learner() -> tuple[ExtenderService, list[str], list[float]]:
    """A service whose policy records the pods it is fed, on a clock the test moves (`now[0]`)."""
    observed: list[str] = []
    svc = ExtenderService(_state(), FakeBinder(), options=ServiceOptions(relearn_interval_s=10))
    now = [0.0]
    svc.learning.clock = lambda: now[0]
    policy = svc.planner.policy(svc.planner.config.node_policy)
    policy.observe = lambda pod: observed.append(pod.name)  # type: ignore[method-assign]
    return svc, observed, now


def test_learning_is_batched_after_the_bootstrap() -> None:
    svc, observed, now = _recording_learner()
    for i in range(LEARN_BOOTSTRAP + 5):
        svc.filter(schema.ExtenderArgs(Pod=_pod(f"p{i}", 10), NodeNames=["a", "b"]))
    assert len(observed) == LEARN_BOOTSTRAP  # the bootstrap pods at once, then held back for the interval
    now[0] = 11.0
    svc.filter(schema.ExtenderArgs(Pod=_pod("late", 10), NodeNames=["a"]))
    assert len(observed) == LEARN_BOOTSTRAP + 6 and observed[-1] == "late"
    svc.filter(schema.ExtenderArgs(Pod=_pod("late", 10) | {}, NodeNames=["a"]))  # a new UID, held
    assert len(observed) == LEARN_BOOTSTRAP + 6


def test_pending_pods_gauge_follows_filter_results(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, binder = setup
    big = _pod("big", 100)
    big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"  # no node has 3 GPUs
    svc.filter(schema.ExtenderArgs(Pod=big, NodeNames=["a", "b"]))
    gauge = svc.metrics.registry.get_sample_value
    assert gauge("vgpu_extender_pending_pods") == 1
    small = _pod("small", 10)
    binder.pods["ns/small"] = small
    svc.filter(schema.ExtenderArgs(Pod=small, NodeNames=["a"]))
    assert gauge("vgpu_extender_pending_pods") == 1
    svc.pod_event("DELETED", big)
    assert gauge("vgpu_extender_pending_pods") == 0
    assert _bind(svc, small, "a") == "" and gauge("vgpu_extender_inflight_binds") == 0


def test_prioritize_reuses_the_parse_of_the_pod_filter_got_and_a_changed_pod_is_parsed_again(
    setup: tuple[ExtenderService, FakeBinder], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, _binder = setup
    parsed: list[str] = []

    def counting(pod: dict[str, Any], *args: Any) -> PodInfo:
        parsed.append(pod["metadata"]["name"])
        return pod_info(pod, *args)

    monkeypatch.setattr("scheduler_extender.service.pod_info", counting)  # what every verb parses with
    pod = _pod("p", 10)
    filtered = svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=["a", "b"]))
    wire_copy = copy.deepcopy(pod)  # what /prioritize decodes from its own body: equal, not the same object
    assert svc.prioritize(schema.ExtenderArgs(Pod=wire_copy, NodeNames=filtered["NodeNames"]))
    assert parsed == ["p"]
    changed = copy.deepcopy(pod)
    changed["metadata"]["annotations"] = {ann.POD_NODE_POLICY: "tetris"}  # same UID, different pod: parsed again
    assert svc.prioritize(schema.ExtenderArgs(Pod=changed, NodeNames=["a", "b"])) == []
    assert parsed == ["p", "p"]
    bad = _pod("bad", 150)  # an invalid request is never kept: each verb refuses it again
    for _ in range(2):
        assert svc.filter(schema.ExtenderArgs(Pod=bad, NodeNames=["a"]))["NodeNames"] == []
    assert parsed == ["p", "p", "bad", "bad"]


def test_a_bad_policy_annotation_is_refused_and_does_not_poison_learning() -> None:
    observed: list[str] = []
    svc = ExtenderService(_state(), FakeBinder())
    policy = svc.planner.policy(svc.planner.config.node_policy)
    policy.observe = lambda pod: observed.append(pod.name)  # type: ignore[method-assign]
    bad = _pod("bad", 10, annotations={ann.POD_NODE_POLICY: "tetris"})
    result = svc.filter(schema.ExtenderArgs(Pod=bad, NodeNames=["a", "b"]))
    assert result["NodeNames"] == [] and "tetris" in result["FailedAndUnresolvableNodes"]["a"]
    svc.filter(schema.ExtenderArgs(Pod=_pod("good", 10), NodeNames=["a"]))
    assert observed == ["good"] and svc.learning.queued == 0


@pytest.mark.parametrize("experiment", sorted(registry.EXPERIMENTAL))
def test_a_pod_naming_a_benchmark_experiment_is_refused_on_every_node_with_the_allowed_values(experiment: str) -> None:
    svc = ExtenderService(_state(), FakeBinder())
    pod = _pod("exp", 10, annotations={ann.POD_NODE_POLICY: experiment})
    result = svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=["a", "b"]))
    assert result["NodeNames"] == []
    reasons = result["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"a", "b"}
    for reason in reasons.values():
        assert f"annotation vgpu.io/node-policy: placement policy {experiment!r} is a benchmark experiment" in reason
        assert f"allowed: {', '.join(registry.production_names())}" in reason
    assert experiment not in svc.planner._policies  # never instantiated for a pod


def _running(name: str, pct: int, gpu: str, **meta: Any) -> dict[str, Any]:
    """A bound pod holding one of our assignments, as the apiserver lists it after an extender restart."""
    pod = _pod(name, pct, **meta)
    node = gpu.split("-")[1]
    a = Assignment(node, (ann.ContainerAssignment("c", (ann.DeviceSlice(gpu, int(gpu[-1]), 40960, 50),)),))
    pod["metadata"].setdefault("annotations", {})[ann.POD_ASSIGNMENT] = ann.encode_assignment(a)
    pod["metadata"]["annotations"][ann.POD_BIND_PHASE] = ann.BindPhase.ALLOCATED.value
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def test_the_first_pod_list_seeds_learning_and_a_relist_does_not() -> None:
    svc = ExtenderService(_state(), FakeBinder())
    api = type("Api", (), {"list_node": None, "list_pod_for_all_namespaces": None})()
    source = KubeSource(api, svc)
    finished = _running("done", 30, "GPU-b-1") | {"status": {"phase": "Succeeded"}}
    pods = [
        _running("p0", 50, "GPU-a-0"),
        _running("p1", 50, "GPU-a-1"),
        _running("p2", 20, "GPU-b-0"),
        _running("bad", 150, "GPU-b-1"),  # an invalid request: skipped, never stops the seeding
        _pod("pending", 40),  # no assignment: not ours yet
        finished,
    ]
    source.pods.replace(pods)  # the reflector's first list
    assert len(svc.state.assignments) == 4  # the state is rebuilt before replace returns; learning in the background
    assert source.seeded.wait(30)  # a background thread: a loaded machine may start it late
    policy = svc.planner.policy(svc.planner.config.node_policy)
    assert isinstance(policy, FragAware)
    shape = {pct: shape_of(svc._parse(_pod("x", pct)), with_memory=policy.with_memory) for pct in (20, 50)}
    assert policy.seen == 3 and dict(policy.counts) == {shape[50]: 2, shape[20]: 1}
    assert len(svc.state.assignments) == 4  # the state itself is rebuilt as before
    sample = svc.metrics.registry.get_sample_value
    assert sample("vgpu_extender_learning_seeded_pods_total") == 3
    assert sample("vgpu_extender_learning_seed_skipped_pods_total", {"reason": "invalid-request"}) == 1

    source.pods.replace(pods)  # a relist after a 410: the same pods are not counted again
    assert policy.seen == 3 and sample("vgpu_extender_learning_seeded_pods_total") == 3

    svc.filter(schema.ExtenderArgs(Pod=pods[0], NodeNames=["a", "b"]))  # a seeded pod is not "first seen"
    svc.filter(schema.ExtenderArgs(Pod=_pod("new", 20), NodeNames=["a", "b"]))
    assert policy.seen == 4 and policy.counts[shape[20]] == 2


def test_taking_over_seeds_only_the_pods_not_seeded_before() -> None:
    """A standby seeded its learning at its first list; on taking over it learns the pods placed since."""
    svc = ExtenderService(_state(), FakeBinder())
    first = [_running("p0", 50, "GPU-a-0"), _running("p1", 20, "GPU-a-1")]
    svc.replace_pods(first, seed_learning=True)
    policy = svc.planner.policy(svc.planner.config.node_policy)
    assert isinstance(policy, FragAware) and policy.seen == 2
    later = [*first, _running("p2", 20, "GPU-b-0"), _pod("pending", 40)]
    assert svc.seed_learning_from(later) == 1  # p2 only: p0, p1 were seeded, the pending pod holds nothing
    assert policy.seen == 3
    assert svc.seed_learning_from(later) == 0  # a second takeover of the same process would add nothing
    assert svc.metrics.registry.get_sample_value("vgpu_extender_learning_seeded_pods_total") == 3


def test_seeded_pods_count_towards_the_bootstrap() -> None:
    svc, observed, now = _recording_learner()
    running = [_running(f"r{i}", 10, "GPU-a-0") for i in range(LEARN_BOOTSTRAP)]
    svc.replace_pods(running, seed_learning=True)
    assert len(observed) == LEARN_BOOTSTRAP  # one observe per pod, in one batch
    svc.filter(schema.ExtenderArgs(Pod=_pod("next", 10), NodeNames=["a"]))
    assert len(observed) == LEARN_BOOTSTRAP  # past the bootstrap: held for the relearn interval
    now[0] = 11.0
    svc.filter(schema.ExtenderArgs(Pod=_pod("later", 10), NodeNames=["a"]))
    assert observed[LEARN_BOOTSTRAP:] == ["next", "later"]


def test_the_same_names_asked_again_see_a_node_that_joined_or_left(setup: tuple[ExtenderService, FakeBinder]) -> None:
    """The verbs keep which of the names they were last asked about have an inventory; a node joining or leaving
    must show in the very next answer to the same names."""
    svc, _binder = setup
    names = ["a", "b", "c"]
    first = svc.filter(schema.ExtenderArgs(Pod=_pod("p1", 10), NodeNames=list(names)))
    assert first["NodeNames"] == ["a", "b"] and "c" in first["FailedNodes"]
    svc.state.upsert_node(NodeInventory("c", (GpuDevice("GPU-c-0", 0, "H100", 81920),)))
    pod = _pod("p2", 10)
    joined = svc.filter(schema.ExtenderArgs(Pod=pod, NodeNames=list(names)))
    assert joined["NodeNames"] == ["a", "b", "c"] and joined["FailedNodes"] == {}
    svc.state.remove_node("a")
    prios = svc.prioritize(schema.ExtenderArgs(Pod=pod, NodeNames=list(joined["NodeNames"])))
    assert prios and {h["Host"] for h in prios} <= {"b", "c"}
    left = svc.filter(schema.ExtenderArgs(Pod=_pod("p3", 10), NodeNames=list(names)))
    assert left["NodeNames"] == ["b", "c"] and "a" in left["FailedNodes"]


def test_messages_to_kube_scheduler_carry_no_format_verbs() -> None:
    """kube-scheduler formats its FailedScheduling event with the failure text as the format string: a `%` in a
    filter reason or a bind error would be mangled ("%!m(MISSING)"), so none reaches it; the meaning stays."""
    svc = ExtenderService(_state(), FakeBinder())
    too_big = _pod("big", pct=100)
    too_big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"  # 2 GPUs per node here
    result = svc.filter(schema.ExtenderArgs(Pod=too_big, NodeNames=["a", "b"]))
    reasons = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    assert set(reasons) == {"a", "b"}
    assert all("%" not in why and "percent" in why for why in reasons.values()), reasons
    assert schema.binding_result("bind ns/p to a: 100% cores")["Error"] == "bind ns/p to a: 100 percent cores"


def test_an_unknown_binding_stays_held_past_the_grace_until_it_is_fenced() -> None:
    """A Binding stuck in an apiserver whose etcd is down lands when etcd is back, long after the grace: its slices
    are released only once a write on its version succeeded (the fence), never on the grace alone (an over-commit
    in tests/e2e/test_chaos_e2e.py, etcd restarted)."""
    now = [1000.0]
    binder = FakeBinder()
    svc = ExtenderService(_state(), binder, options=ServiceOptions(bind_grace_s=30))
    svc.sync.clock = lambda: now[0]
    pod = _pod("p", pct=100)
    binder.pods["ns/p"] = pod
    binder.bind_times_out = binder.get_fails = True
    assert "binding outcome unknown" in _bind(svc, pod, "a")
    held = svc.state.assignments["ns/p"]
    now[0] = 1031.0  # past the grace, the apiserver still unreachable: nothing can be fenced, nothing is released
    svc.expire_unbound()
    svc.replace_pods([copy.deepcopy(pod)])  # nor by a relist that shows the pod unbound and without assignment
    svc.expire_unbound()
    assert svc.state.assignments["ns/p"] == held and binder.fenced == []
    binder.get_fails = False  # the apiserver answers again; the pod is still unbound: fenced, then released
    svc.expire_unbound()
    assert binder.fenced == [("ns/p", "")] and "ns/p" not in svc.state.assignments


def test_an_unknown_binding_the_fence_finds_landed_keeps_its_slices(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    svc, binder = setup
    now = [1000.0]
    svc.sync.clock = lambda: now[0]
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    binder.bind_times_out = True
    assert "binding outcome unknown" in _bind(svc, pod, "a")
    held = svc.state.assignments["ns/p"]
    pod["spec"]["nodeName"] = "a"  # it landed; the watch has not shown it yet
    now[0] += svc.sync.bind_grace_s + 1
    svc.expire_unbound()
    assert binder.fenced == [("ns/p", "")] and svc.state.assignments["ns/p"] == held


def test_an_unbound_assignment_another_writer_left_refuses_the_bind_until_filter_drops_it(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    """An extender of an earlier release wrote the assignment (PATCH) before its Binding: during an upgrade the
    pod may show it unbound. It stays held as a reservation (the Binding may still come), so a bind is refused;
    kube-scheduler's retry starts with /filter, which drops the pod's own unbound reservation, and then binds."""
    svc, binder = setup
    pod = _pod("p")
    binder.pods["ns/p"] = pod
    other = copy.deepcopy(pod)
    other["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(
            Assignment("a", (ContainerAssignment("c", (DeviceSlice("GPU-a-0", 0, 40960, 50),)),))
        ),
        ann.POD_BIND_PHASE: "allocating",
    }
    svc.pod_event("ADDED", other)
    assert "ns/p" in svc.sync.unbound and svc.state.assignments["ns/p"].node == "a"
    assert "holds a live assignment on a" in _bind(svc, pod, "b") and binder.sent == []
    svc.filter(schema.ExtenderArgs(Pod=other, NodeNames=["a", "b"]))
    assert "ns/p" not in svc.state.assignments
    assert _bind(svc, pod, "b") == "" and svc.state.assignments["ns/p"].node == "b"
