"""--filter-answers-one: /filter answers the one node /prioritize would rank first and leaves the pod's soft hold there
(scheduler_extender.service `_one_node`), so kube-scheduler binds it without scoring and never calls /prioritize."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from scheduler_extender import schema
from scheduler_extender.service import ExtenderService, ServiceOptions
from tests.unit.test_extender_holds import _whole_node_pod
from tests.unit.test_extender_preempt import _fill
from tests.unit.test_extender_preempt import _pod as _prio_pod
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _state
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.state import ClusterState

ONE = ServiceOptions(filter_answers_one=True)
NAMES = [f"n{i}" for i in range(12)]


def _cluster(config: PlacementConfig | None = None) -> ClusterState:
    """12 nodes of 2 or 4 GPUs (more than /prioritize's ten ranks), two GPU sizes."""
    state = ClusterState(config or PlacementConfig())
    for i, n in enumerate(NAMES):
        gpus, mib = (4, 81920) if i % 3 else (2, 40960)
        state.upsert_node(NodeInventory(n, tuple(GpuDevice(f"GPU-{n}-{g}", g, "H100", mib) for g in range(gpus))))
    return state


def _sized(name: str, pct: int, count: int = 1) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(count), "nvidia.com/gpumem-percentage": str(pct), "nvidia.com/gpucores": str(pct)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": str(uuid.uuid4())},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def _filter(svc: ExtenderService, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=list(names)))


def _ranked_first(svc: ExtenderService, pod: dict[str, Any], names: list[str]) -> tuple[dict[str, Any], str]:
    """What the usual /filter then /prioritize answer: the filter result and the node scored highest."""
    filtered = _filter(svc, pod, names)
    prios = svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=filtered["NodeNames"]))
    top = max(prios, key=lambda h: h["Score"])
    assert sum(1 for h in prios if h["Score"] == top["Score"]) == 1  # the rank mapping: one node ranked first
    return filtered, top["Host"]


def _service(state: ClusterState, options: ServiceOptions = ONE) -> ExtenderService:
    """A service whose soft holds' clock stands still: a loaded machine's pause never expires a hold mid-test."""
    svc = ExtenderService(state, FakeBinder(), options=options)
    svc.holds.clock = lambda: 0.0
    return svc


def _one_node_count(svc: ExtenderService, outcome: str) -> float:
    """vgpu_extender_one_node_answers_total{outcome} as the extender's /metrics exports it."""
    value = svc.metrics.rest.get_sample_value("vgpu_extender_one_node_answers_total", {"outcome": outcome})
    return value or 0.0


def _twins(options: ServiceOptions = ONE, config: PlacementConfig | None = None) -> tuple[ExtenderService, ...]:
    """The usual service and one with `options`, on equal states."""
    return tuple(_service(_cluster(config), o) for o in (ServiceOptions(), options))


@pytest.mark.parametrize("policy", ["default", "binpack", "spread"])
def test_filter_answers_the_node_prioritize_ranks_first_pod_after_pod(policy: str) -> None:
    usual, one = _twins(config=PlacementConfig(node_policy=policy))
    shapes = [(30, 1), (50, 1), (100, 1), (25, 2), (70, 1), (100, 2), (40, 1)]
    answered: set[str] = set()
    for i in range(30):
        pct, count = shapes[i % len(shapes)]
        pod = _sized(f"p{i}", pct, count)
        names = NAMES[i % 4 :] + NAMES[: i % 4]  # kube-scheduler's rotating start
        expected, best = _ranked_first(usual, pod, names)
        got = _filter(one, pod, names)
        if not expected["NodeNames"]:
            break  # full: both answer no node, alike
        assert got["NodeNames"] == [best], (i, got["NodeNames"], best)
        assert got["FailedNodes"] == expected["FailedNodes"]
        assert got["FailedAndUnresolvableNodes"] == expected["FailedAndUnresolvableNodes"]
        held = one.holds.on(best, other_than="")
        assert [h.key for h in held] == [f"ns/p{i}"]  # the hold /prioritize would have left, left by /filter
        answered.add(best)
        for svc in (usual, one):
            assert isinstance(svc.binder, FakeBinder)
            svc.binder.pods[f"ns/p{i}"] = copy.deepcopy(pod)
            assert _bind(svc, pod, best) == ""
        assert f"ns/p{i}" not in one.holds  # released at /bind
        assert one.state.assignments[f"ns/p{i}"] == usual.state.assignments[f"ns/p{i}"]
    assert i >= 10 and len(answered) >= 2, (i, answered)


def test_two_pods_filtered_back_to_back_get_different_nodes_and_both_bind() -> None:
    """Each pod takes both GPUs of a node: the second, filtered before the first is bound, is answered the other node,
    as /prioritize would have steered it."""
    svc = _service(_state())
    p, q = _whole_node_pod("p"), _whole_node_pod("q")
    first = _filter(svc, p, ["a", "b"])["NodeNames"]
    second = _filter(svc, q, ["a", "b"])["NodeNames"]
    assert len(first) == len(second) == 1 and first != second, (first, second)
    assert [h.key for h in svc.holds.on(first[0], other_than="")] == ["ns/p"]
    assert [h.key for h in svc.holds.on(second[0], other_than="")] == ["ns/q"]
    binder = svc.binder
    assert isinstance(binder, FakeBinder)
    binder.pods["ns/p"], binder.pods["ns/q"] = p, q
    assert _bind(svc, p, first[0]) == "" and "ns/p" not in svc.holds
    assert _bind(svc, q, second[0]) == "" and not len(svc.holds)  # no "no longer fits"
    assert _one_node_count(svc, "one") == 2 and _one_node_count(svc, "all-held") == 0


def test_a_pod_that_fits_beside_the_hold_is_answered_the_same_node() -> None:
    """A hold only steers pods that do not fit beside it: 30 % slices share the best node."""
    svc = _service(_state())
    first = _filter(svc, _pod("p", 30), ["a", "b"])["NodeNames"]
    assert _filter(svc, _pod("q", 30), ["a", "b"])["NodeNames"] == first


def test_every_best_node_held_answers_every_feasible_node() -> None:
    """Two whole-node pods hold both nodes: a third has no node free of holds, so the usual answer goes back (and
    /prioritize, called then, decides as without the setting); no hold is left for it."""
    svc = _service(_state())
    _filter(svc, _whole_node_pod("p"), ["a", "b"])
    _filter(svc, _whole_node_pod("q"), ["a", "b"])
    r = _whole_node_pod("r")
    assert sorted(_filter(svc, r, ["a", "b"])["NodeNames"]) == ["a", "b"]
    assert "ns/r" not in svc.holds
    assert svc.prioritize(schema.ExtenderArgs(Pod=r, NodeNames=["a", "b"])) == []  # both steered to 0
    assert _one_node_count(svc, "one") == 2 and _one_node_count(svc, "all-held") == 1


def test_hold_expires_and_goes_with_the_pod() -> None:
    svc = _service(_state())
    now = [0.0]
    svc.holds.clock = lambda: now[0]
    p, q = _whole_node_pod("p"), _whole_node_pod("q")
    top = _filter(svc, p, ["a", "b"])["NodeNames"]
    assert svc.holds.on(top[0], other_than="")[0].until == svc.holds.ttl_s  # /prioritize's lifetime
    now[0] = svc.holds.ttl_s + 1  # p's bind never came
    assert _filter(svc, q, ["a", "b"])["NodeNames"] == top and "ns/p" not in svc.holds
    svc.pod_event("DELETED", q)
    assert "ns/q" not in svc.holds


def test_a_pod_that_fits_nowhere_and_a_pod_without_gpus_are_answered_as_usual() -> None:
    usual, one = _twins()
    big = _sized("big", 100, 8)  # no node has 8 GPUs
    assert _filter(one, big, NAMES) == _filter(usual, big, NAMES)
    assert _filter(one, big, NAMES)["NodeNames"] == [] and not len(one.holds)
    plain = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}
    assert _filter(one, plain, NAMES)["NodeNames"] == NAMES  # no GPU asked: no opinion, kube-scheduler scores
    unknown = [*NAMES, "ghost"]
    got = _filter(one, _pod("p"), unknown)
    assert len(got["NodeNames"]) == 1 and "ghost" in got["FailedNodes"]


def test_prioritize_called_anyway_still_answers() -> None:
    """kube-scheduler does not call /prioritize for one feasible node; a client that does gets the usual ranking,
    and the pod's hold moves to the node ranked first, as before."""
    usual, one = _twins()
    pod = _pod("p", 50)
    chosen = _filter(one, pod, NAMES)["NodeNames"]
    assert one.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=chosen)) == [
        {"Host": chosen[0], "Score": 10}
    ]
    expected, best = _ranked_first(usual, pod, NAMES)
    feasible = expected["NodeNames"]
    assert one.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=feasible)) == usual.prioritize(
        schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=feasible)
    )
    assert [h.key for h in one.holds.on(best, other_than="")] == ["ns/p"] and len(one.holds) == 1


def test_node_list_mode_answers_one_node_object() -> None:
    usual, one = _twins()
    nodes = [{"metadata": {"name": n, "labels": {"i": str(i)}}} for i, n in enumerate(NAMES)]
    for i in range(6):
        pod = _sized(f"p{i}", 60)
        _, best = _ranked_first(usual, pod, NAMES)
        expected = usual.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), Nodes={"items": copy.deepcopy(nodes)}))
        got = one.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), Nodes={"items": copy.deepcopy(nodes)}))
        assert got["NodeNames"] is None and got["Nodes"]["items"] == [nodes[NAMES.index(best)]]
        assert len(expected["Nodes"]["items"]) > 1
        assert got["FailedNodes"] == expected["FailedNodes"]
        assert [h.key for h in one.holds.on(best, other_than="")] == [f"ns/p{i}"]
        for svc in (usual, one):
            assert isinstance(svc.binder, FakeBinder)
            svc.binder.pods[f"ns/p{i}"] = copy.deepcopy(pod)
            assert _bind(svc, pod, best) == ""


def test_narrow_filter_then_one_node_of_its_tier() -> None:
    """--narrow-filter with it: the tier is narrowed first (its other nodes failed, as without this setting), then
    its best node answered."""
    narrow = PlacementConfig(narrow_filter=True)
    usual, one = _twins(ServiceOptions(narrow_filter=True, filter_answers_one=True), config=narrow)
    usual.options = ServiceOptions(narrow_filter=True)
    for i in range(5):
        pod = _sized(f"p{i}", 40)
        expected, best = _ranked_first(usual, pod, NAMES)
        got = _filter(one, pod, NAMES)
        assert got["NodeNames"] == [best] and best in expected["NodeNames"]
        assert got["FailedNodes"] == expected["FailedNodes"]
        assert any("narrow filter" in why for why in got["FailedNodes"].values())
        for svc in (usual, one):
            assert isinstance(svc.binder, FakeBinder)
            svc.binder.pods[f"ns/p{i}"] = copy.deepcopy(pod)
            assert _bind(svc, pod, best) == ""


def _preempt_service(options: ServiceOptions) -> tuple[ExtenderService, dict[str, dict[str, Any]]]:
    """test_extender_preempt's cluster (node a: low-priority pods; node b: priority-2000 pods) plus an empty node c,
    with a preemptor nominated to a after its victim b1 left."""
    state = ClusterState()
    for n in ("a", "b", "c"):
        state.upsert_node(
            NodeInventory(n, tuple(GpuDevice(f"GPU-{n}-{i}", i, "H100", 81920, split_count=4) for i in range(2)))
        )
    svc = _service(state, options)
    pods = _fill(svc)
    svc.pod_event("DELETED", pods["b1"])  # GPU 0 of node a has 51920 MiB free, held for the preemptor
    online = _prio_pod("online", 40000, 1000)
    online["status"] = {"nominatedNodeName": "a"}
    svc.pod_event("ADDED", online)
    return svc, pods | {"online": online}


def test_a_preemptor_holding_room_keeps_it_and_the_lower_pod_is_answered_another_node() -> None:
    usual, _ = _preempt_service(ServiceOptions())
    one, pods = _preempt_service(ONE)
    late = _prio_pod("late-batch", 40000, 1)
    expected = _filter(usual, late, ["a", "b", "c"])
    got = _filter(one, late, ["a", "b", "c"])
    assert expected["NodeNames"] == ["c"] and got["NodeNames"] == ["c"]  # a is closed to it, b is full
    assert got["FailedNodes"] == expected["FailedNodes"] and {"a", "b"} <= got["FailedNodes"].keys()
    # The preemptor itself is asked about its nominated node alone first (evaluateNominatedNode): answered.
    assert _filter(one, pods["online"], ["a"])["NodeNames"] == ["a"]
    # Over every node it gets one of those that fit it, the one /prioritize ranks first.
    _, best = _ranked_first(usual, pods["online"], ["a", "b", "c"])
    assert _filter(one, pods["online"], ["a", "b", "c"])["NodeNames"] == [best]
    assert all(not k.startswith("nominated:") for k in one.state.assignments)


def test_the_setting_is_off_by_default() -> None:
    svc = _service(_state(), ServiceOptions())
    assert sorted(_filter(svc, _pod("p"), ["a", "b"])["NodeNames"]) == ["a", "b"] and not len(svc.holds)


def test_bind_writes_the_pods_own_container_names_after_another_pod_of_the_shape() -> None:
    """/bind reserves the shape's cached result (`Planner.cached_result`), which another pod of the same shape with
    other container names filled: the Binding's assignment names this pod's containers (the device plugin checks
    them against the pod's spec)."""
    svc = _service(_cluster(PlacementConfig(node_policy="binpack")))  # learns nothing: one epoch for both pods
    binder = svc.binder
    assert isinstance(binder, FakeBinder)
    first = _sized("first", 30)
    other = _sized("other", 30)
    other["spec"]["containers"][0]["name"] = "server"
    assert _filter(svc, first, NAMES)["NodeNames"]  # the shape's per-node cache now names container "c"
    (node,) = _filter(svc, other, NAMES)["NodeNames"]
    binder.pods["ns/other"] = other
    assert _bind(svc, other, node) == ""
    assert [c.name for c in binder.written["ns/other"].containers] == ["server"]
