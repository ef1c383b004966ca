"""The extender's verbs against hostile input from a caller that passed mutual TLS: what they answer, and that what
they leave behind (reservations, the planner's per-shape memos) answers the next honest call as a fresh service would.

kube-scheduler sends each node once, but nothing stops a caller from sending a name many times, names that are no
node, empty or 100,000-character names, odd pods, binds for pods never filtered or to nodes that left. What
kube-scheduler does with an answer (kubernetes pkg/scheduler/extender.go, `HTTPExtender.Filter`, read at commit
02850301e61b): every NodeName returned must have been asked ("claims a filtered node ... which is not found in the
input node list" fails the whole call), FailedNodes and FailedAndUnresolvableNodes are maps, and any status but 200
fails the verb (`send`: "failed %v with extender at URL %v, code %v"). So: returned names are asked names, a name is
in one answer set only, duplicates change no verdict, and only BadRequest (HTTP 400) may leave a verb.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from scheduler_extender import schema
from scheduler_extender.app import _serve
from scheduler_extender.holds import DEFAULT_TTL_S
from scheduler_extender.pending import TTL_S, Pending
from scheduler_extender.preempt import given_victims
from scheduler_extender.requeue import Requeuer
from scheduler_extender.service import NO_INVENTORY, BadRequest, ExtenderService, ServiceOptions
from scheduler_extender.sources.kube import KubeSource
from tests.unit.test_extender_service import FakeBinder
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.state import ClusterState

H100, T4 = 81920, 16384


def _cluster(policy: str) -> ClusterState:
    """Nodes where a 20-80 GiB slice fits (some partly used, so scores differ and tie), T4 nodes where it can never
    fit (unresolvable) and full nodes where it does not fit now (failed)."""
    state = ClusterState(PlacementConfig(node_policy=policy))
    for i in range(14):
        gpus = tuple(GpuDevice(f"GPU-n{i:02d}-{g}", g, "H100", H100) for g in range(1 + i % 3))
        state.upsert_node(NodeInventory(f"n{i:02d}", gpus))
    for i in range(2):
        state.upsert_node(NodeInventory(f"t{i}", (GpuDevice(f"GPU-t{i}", 0, "T4", T4),)))
        state.upsert_node(NodeInventory(f"full{i}", (GpuDevice(f"GPU-full{i}", 0, "H100", H100),)))
        state.apply(f"ns/hog{i}", _slice(f"full{i}", f"GPU-full{i}", H100, 100))
    for i, mib in enumerate((10000, 30000, 50000, 10000)):  # partly used: scores differ, two of them tie
        state.apply(f"ns/part{i}", _slice(f"n{i:02d}", f"GPU-n{i:02d}-0", mib, 10))
    return state


def _slice(node: str, uuid: str, mib: int, cores: int) -> Assignment:
    return Assignment(node, (ContainerAssignment("c", (DeviceSlice(uuid, 0, mib, cores),)),))


def _pod(name: str, mib: int = 40000, cores: int = 50, *, count: int = 1, uid: str = "") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(count), "nvidia.com/gpumem": str(mib), "nvidia.com/gpucores": str(cores)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "resourceVersion": "1"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def _service(policy: str = "binpack", **options: Any) -> ExtenderService:
    """A service whose clocks stand still (soft holds, bind grace, relearn interval): two services fed the same
    calls decide the same however loaded the machine is."""
    svc = ExtenderService(_cluster(policy), FakeBinder(), options=ServiceOptions(**options))
    svc.holds.clock = svc.sync.clock = svc.learning.clock = lambda: 1000.0
    return svc


def _pods(svc: ExtenderService) -> dict[str, dict[str, Any]]:
    """The pods the service's stand-in apiserver holds."""
    assert isinstance(svc.binder, FakeBinder)
    return svc.binder.pods


def _fill(svc: ExtenderService, node: str) -> None:
    """The pod watch shows a pod bound to `node` holding every GPU of it whole."""
    gpus = svc.state.nodes[node].inventory.gpus
    slices = tuple(DeviceSlice(g.uuid, g.index, g.memory_mib, 100) for g in gpus)
    assignment = Assignment(node, (ContainerAssignment("c", slices),))
    meta: dict[str, Any] = {"name": f"fill-{node}", "namespace": "ns", "uid": f"uid-fill-{node}"}
    meta["annotations"] = {ann.POD_ASSIGNMENT: ann.encode_assignment(assignment)}
    svc.pod_event("ADDED", {"metadata": meta, "spec": {"nodeName": node, "containers": []}})
    assert svc.state.assignments[f"ns/fill-{node}"] == assignment


def _names(svc: ExtenderService) -> list[str]:
    return list(svc.state.nodes)


def _filter(svc: ExtenderService, pod: dict[str, Any], names: list[str], *, items: bool = False) -> dict[str, Any]:
    if items:
        nodes = schema.NodeList(items=[{"metadata": {"name": n}} for n in names])
        return svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), Nodes=nodes))
    return svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=list(names)))


def _passed(answer: dict[str, Any]) -> list[str]:
    if answer["Nodes"] is not None:
        return [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
    names: list[str] = answer["NodeNames"]
    return names


def _verdicts(answer: dict[str, Any], asked: list[str]) -> dict[str, tuple[str, str]]:
    """Each asked name's verdict ("passed", "failed" or "unresolvable", with the reason), after checking what
    kube-scheduler relies on: every returned name was asked, no name is in two answer sets, every name is answered."""
    passed, failed, unresolvable = _passed(answer), answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
    assert set(passed) <= set(asked), f"answered names never asked: {set(passed) - set(asked)}"
    assert not set(passed) & set(failed), f"passed and failed: {set(passed) & set(failed)}"
    assert not set(passed) & set(unresolvable), f"passed and unresolvable: {set(passed) & set(unresolvable)}"
    assert not set(failed) & set(unresolvable), f"failed and unresolvable: {set(failed) & set(unresolvable)}"
    out = {n: ("passed", "") for n in passed}
    out.update({n: ("failed", why) for n, why in failed.items()})
    out.update({n: ("unresolvable", why) for n, why in unresolvable.items()})
    assert set(out) == set(asked), f"names asked and not answered: {set(asked) - set(out)}"
    return out


MODES: dict[str, dict[str, Any]] = {
    "names": {},  # the shipped call: NodeNames in, the planner's filter_names / _filter_covered / _filter_every
    "narrow": {"narrow_filter": True},  # the subset evaluation path (`_known_names`, `Planner.evaluate`, `passing`)
    "items": {},  # the full NodeList mode
}


def _duplicated(names: list[str]) -> dict[str, list[str]]:
    return {
        "all-twice": names + names,
        "one-name-many-times": [names[5]] * 50 + names,
        "some-twice-scattered": [n for n in names for _ in range(1 + (len(n) + ord(n[-1])) % 2)],
        "half-twice": names[::2] * 2,
        "failed-and-unresolvable-twice": ["full0", "t0", "full0", "n04", "t0", "n04"],
    }


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("case", list(_duplicated([f"n{i:02d}" for i in range(16)])))
def test_a_list_with_duplicates_gets_the_verdicts_of_the_list_without_them(mode: str, warm: bool, case: str) -> None:
    """Cold: the duplicated list is the shape's first call (its memo is made over it, `_Memo.names` holds names
    twice). Warm: the shape's memo covers every node and its positions are kept (`Planner._positions`: an honest
    call over every name went through `_filter_every` twice first). Either way the verdicts are those of a fresh
    service asked each name once, and the honest call over every name afterwards answers as the fresh one does."""
    items = mode == "items"
    svc, fresh = _service(**MODES[mode]), _service(**MODES[mode])
    every = _names(svc)
    asked = _duplicated(every)[case]
    pod = _pod("p")
    if warm:
        for s in (svc, fresh):
            _filter(s, pod, every, items=items)
            _filter(s, pod, every, items=items)
    got = _verdicts(_filter(svc, pod, asked, items=items), asked)
    want = _verdicts(_filter(fresh, pod, list(dict.fromkeys(asked)), items=items), list(dict.fromkeys(asked)))
    assert got == want
    # Again: cold, the names now equal the memo's own (`_filter_covered` asks `_positions` about them).
    assert _verdicts(_filter(svc, pod, asked, items=items), asked) == want
    for s in (svc, fresh):  # the watch shows a pod filling n05 (asked 50 times in one case): kept positions move
        _fill(s, "n05")
    want = _verdicts(_filter(fresh, pod, list(dict.fromkeys(asked)), items=items), list(dict.fromkeys(asked)))
    assert _verdicts(_filter(svc, pod, asked, items=items), asked) == want
    kinds = {v[0] for v in got.values()}
    assert "passed" in kinds and kinds & {"failed", "unresolvable"}  # the case decides more than one way
    for _ in range(2):  # the next honest calls: over the memo the hostile call left, then through its positions
        assert _filter(svc, pod, every, items=items) == _filter(fresh, pod, every, items=items)


@pytest.mark.parametrize("policy", ["binpack", "spread", "default"])
@pytest.mark.parametrize("filtered_first", [False, True])
def test_prioritize_scores_each_host_once_as_without_duplicates(policy: str, filtered_first: bool) -> None:
    """kube-scheduler adds each HostPriority entry to its host's total (so a host listed twice would score twice):
    every host is listed once, was asked, and scores as when each name is asked once. More than ten nodes fit, with
    ties, so the rank mapping's cut at the tenth is crossed by names asked twice."""
    svc, fresh = _service(policy), _service(policy)
    every = _names(svc)
    pod = _pod("p", 20000, 20)
    if filtered_first:
        for s in (svc, fresh):
            _filter(s, pod, every)
    for asked in (every + every[:6], every[::-1] + every[3:9] * 3, [every[2]] * 40, every[:4] * 2 + ["ghost", ""]):
        got = svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=asked))
        hosts = [h["Host"] for h in got]
        assert len(hosts) == len(set(hosts)) and set(hosts) <= set(asked), hosts
        want = fresh.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=list(dict.fromkeys(asked))))
        assert {h["Host"]: h["Score"] for h in got} == {h["Host"]: h["Score"] for h in want}


ODD_NAMES = ["", "ghost", "x" * 100_000, "n\u00f6de-\u2603", "n01 ", "N01", "n01\x00", "n01/../n02", "\U0001f600" * 50]


@pytest.mark.parametrize("mode", list(MODES))
def test_names_that_are_no_node_fail_with_the_no_inventory_reason_and_are_not_remembered(mode: str) -> None:
    """Empty, 100,000-character, unicode, near-miss (case, space, NUL) and made-up names each fail once with the
    no-inventory reason, never as unresolvable (a node may join), beside real names answered as usual; afterwards
    the honest call answers as a fresh service does (no such name entered a memo or the state)."""
    items = mode == "items"
    svc, fresh = _service(**MODES[mode]), _service(**MODES[mode])
    every = _names(svc)
    pod = _pod("p")
    asked = ODD_NAMES + every[:8] + ODD_NAMES + every
    got = _verdicts(_filter(svc, pod, asked, items=items), asked)
    assert {n: got[n] for n in ODD_NAMES} == dict.fromkeys(ODD_NAMES, ("failed", NO_INVENTORY))
    want = _verdicts(_filter(fresh, pod, every, items=items), every)
    assert {n: got[n] for n in every} == want
    assert _names(svc) == every
    assert _filter(svc, pod, every, items=items) == _filter(fresh, pod, every, items=items)


def test_the_count_of_preempt_candidates_is_bounded_like_the_names_of_filter() -> None:
    """/preempt runs a victim search under the state lock for each candidate node the body names: 15,001 made-up
    nodes were all searched. The count is bounded by --max-node-names as /filter's names are."""
    svc = _service(max_node_names=3)
    pod = _pod("p")
    _pods(svc)["ns/p"] = copy.deepcopy(pod)
    victims = {f"full{i}": {"Pods": [{"UID": f"uid-hog{i}"}]} for i in range(4)}
    with pytest.raises(BadRequest, match=r"preempt: 4 nodes in one call; at most 3 allowed \(--max-node-names\)"):
        svc.preempt(schema.ExtenderPreemptionArgs(Pod=copy.deepcopy(pod), NodeNameToMetaVictims=victims))
    del victims["full3"]
    assert isinstance(svc.preempt(schema.ExtenderPreemptionArgs(Pod=pod, NodeNameToMetaVictims=victims)), dict)


def test_the_count_of_names_is_bounded_and_the_refusal_says_by_what() -> None:
    """--max-node-names (15,000) counts names as sent, duplicates included: 15,000 copies of one name are
    answered (that name once, consistently), 15,001 or 100,000 names are a 400 naming the count and the setting."""
    svc = _service()
    pod = _pod("p")
    answer = _filter(svc, pod, ["n05"] * 15_000)
    assert _verdicts(answer, ["n05"]) == {"n05": ("passed", "")}
    for verb in (svc.filter, svc.prioritize):
        for count in (15_001, 100_000):
            with pytest.raises(
                BadRequest, match=rf"{count} nodes in one call; at most 15000 allowed \(--max-node-names\)"
            ):
                verb(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=["n05"] * count))
    with pytest.raises(BadRequest, match="neither Nodes nor NodeNames"):
        svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(pod)))


# -- odd pods and odd bodies: a result or a 400 that names the field, never another exception (HTTP 500) ----------

_FORGED = ann.encode_assignment(_slice("n05", "GPU-n05-0", H100, 100))


def _odd_pods() -> dict[str, dict[str, Any]]:
    def edit(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
        pod = _pod("h", uid="uid-h")
        change(pod)
        return pod

    def limits(pod: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = pod["spec"]["containers"][0]["resources"]["limits"]
        return found

    def annotate(annotations: dict[str, str]) -> Callable[[dict[str, Any]], object]:
        return lambda pod: pod["metadata"].update(annotations=annotations)

    return {
        "no-metadata": edit(lambda p: p.pop("metadata")),
        "no-spec": edit(lambda p: p.pop("spec")),
        "no-uid-no-name": edit(lambda p: p.update(metadata={})),
        "no-containers": edit(lambda p: p["spec"].update(containers=[])),
        "null-fields": edit(lambda p: p.update(metadata=None, spec={"containers": None}, status=None)),
        "containers-same-name": edit(
            lambda p: p["spec"]["containers"].append(copy.deepcopy(p["spec"]["containers"][0]))
        ),
        "gpu-in-init-container": edit(
            lambda p: p["spec"].update(initContainers=copy.deepcopy(p["spec"]["containers"]))
        ),
        "huge-annotation": edit(annotate({"a": "v" * 300_000})),
        "forged-assignment": edit(annotate({ann.POD_ASSIGNMENT: _FORGED, ann.POD_BIND_PHASE: "allocated"})),
        "garbage-assignment": edit(annotate({ann.POD_ASSIGNMENT: "{not json", ann.POD_BIND_PHASE: "??"})),
        "unknown-node-policy": edit(annotate({ann.POD_NODE_POLICY: "nope"})),
        "unknown-gpu-policy": edit(annotate({ann.POD_GPU_POLICY: "nope"})),
        "odd-gpu-models": edit(annotate({ann.POD_USE_GPU_MODELS: ",,\u2603,"})),
        "odd-nvlink": edit(annotate({ann.POD_REQUIRE_NVLINK: "maybe"})),
        "odd-sizing": edit(annotate({ann.POD_MODEL_SERVER_SIZING: "{{{"})),
        "says-bound": edit(lambda p: p["spec"].update(nodeName="n05")),
        "says-bound-to-ghost": edit(lambda p: p["spec"].update(nodeName="ghost")),
        "deleting": edit(lambda p: p["metadata"].update(deletionTimestamp="2020-01-01T00:00:00Z")),
        "finished": edit(lambda p: p.update(status={"phase": "Succeeded"})),
        "priority-a-string": edit(lambda p: p["spec"].update(priority="high")),
        "priority-2^100": edit(lambda p: p["spec"].update(priority=2**100)),
        "unicode-name": edit(lambda p: p["metadata"].update(name="\u2603" * 1000)),
        "gpu-0": edit(lambda p: limits(p).update({"nvidia.com/gpu": "0"})),
        "gpu-negative": edit(lambda p: limits(p).update({"nvidia.com/gpu": "-1"})),
        "gpu-10^20": edit(lambda p: limits(p).update({"nvidia.com/gpu": "1" + "0" * 20})),
        "gpu-a-number": edit(lambda p: limits(p).update({"nvidia.com/gpu": 1})),
        "gpu-2^100": edit(lambda p: limits(p).update({"nvidia.com/gpu": 2**100})),
        "gpu-arabic-digit": edit(lambda p: limits(p).update({"nvidia.com/gpu": "\u0661"})),
        "mem-10^20": edit(lambda p: limits(p).update({"nvidia.com/gpumem": "1" + "0" * 20})),
        "cores-1e308": edit(lambda p: limits(p).update({"nvidia.com/gpucores": 1e308})),
    }


def _lists(every: list[str]) -> dict[str, list[str]]:
    return {"every": every, "twice": every + every, "empty-list": [], "odd-names": ODD_NAMES}


@pytest.mark.parametrize("pod_case", list(_odd_pods()))
def test_odd_pods_are_answered_or_refused_by_field_never_raised(pod_case: str) -> None:
    """Each odd pod through the HTTP handler's own path (`scheduler_extender.app._serve`: the wire model, the pod's
    field types, the verb) for /filter (names and NodeList modes) and /prioritize over every kind of name list, then
    /bind of it: only results and BadRequest come out, a filter answer keeps kube-scheduler's rules, and the honest
    pod's next calls answer as a fresh service's."""
    pod = _odd_pods()[pod_case]
    svc, fresh = _service(), _service()
    for name, asked in _lists(_names(svc)).items():
        bodies = {
            "filter": {"Pod": pod, "NodeNames": asked},
            "filter-items": {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": n}} for n in asked]}},
            "prioritize": {"Pod": pod, "NodeNames": asked},
        }
        for verb, body in bodies.items():
            model, call = schema.ExtenderArgs, svc.prioritize if verb == "prioritize" else svc.filter
            try:
                out = _serve(json.dumps(body).encode(), verb.split("-")[0], model, call)
            except BadRequest as exc:
                assert str(exc).startswith(f"{verb.split('-')[0]}: "), exc
                continue
            if verb == "prioritize":
                hosts = [h["Host"] for h in out]
                assert len(hosts) == len(set(hosts)) and set(hosts) <= set(asked), (name, hosts)
            else:
                _verdicts(out, list(dict.fromkeys(asked)))
    _pods(svc)["ns/h"] = copy.deepcopy(pod)
    bind = {"PodName": "h", "PodNamespace": "ns", "PodUID": "uid-h", "Node": "n05"}
    out = _serve(json.dumps(bind).encode(), "bind", schema.ExtenderBindingArgs, svc.bind)
    assert set(out) == {"Error"}
    _pods(svc).pop("ns/h")
    if out["Error"] == "":  # bound: the fresh service gets the same pod bound, so the honest pod meets the same node
        _pods(fresh)["ns/h"] = copy.deepcopy(pod)
        assert fresh.bind(schema.ExtenderBindingArgs(**bind))["Error"] == ""
    # /prioritize left the odd pod a soft hold, as for any pod (kube-scheduler's bodies are not checked against the
    # apiserver there); a pod that never binds holds nothing once the hold's 5 s are over.
    svc.holds.clock = fresh.holds.clock = lambda: 1000.0 + DEFAULT_TTL_S
    _honest_round(svc, fresh, _pod("honest"))


def _honest_round(svc: ExtenderService, fresh: ExtenderService, pod: dict[str, Any]) -> None:
    """/filter over every node, /prioritize over what passed, /bind to the best: the same on both services."""
    answers = []
    for s in (svc, fresh):
        f = _filter(s, pod, _names(s))
        prios = s.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=list(f["NodeNames"])))
        best = max(prios, key=lambda h: h["Score"])["Host"]
        _pods(s)[f"ns/{pod['metadata']['name']}"] = copy.deepcopy(pod)
        m = pod["metadata"]
        err = s.bind(schema.ExtenderBindingArgs(PodName=m["name"], PodNamespace="ns", PodUID=m["uid"], Node=best))
        answers.append((f, prios, best, err, sorted(s.state.assignments.items()), len(s.reservations)))
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"Pod": {}, "NodeNames": [1, 2]}, "filter: invalid ExtenderArgs: NodeNames.0: Input should be a valid string"),
        ({"Pod": {}, "NodeNames": "n01"}, "filter: invalid ExtenderArgs: NodeNames: Input should be a valid array"),
        ({"NodeNames": ["n01"]}, "filter: invalid ExtenderArgs: Pod: Field required"),
        ({"Pod": [], "NodeNames": ["n01"]}, "filter: invalid ExtenderArgs: Pod: Input should be an object"),
        ({"Pod": {}, "NodeNames": None, "Nodes": None}, "filter: the request carries neither Nodes nor NodeNames"),
        (
            {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "n01"}}, {"metadata": {"name": 5}}]}},
            "Nodes.items[1].metadata.name: expected a string",
        ),
        ({"Pod": {}, "Nodes": {"items": [{"metadata": "n01"}]}}, "Nodes.items[0].metadata.name: expected a string"),
        ({"Pod": {"metadata": "x"}, "NodeNames": []}, "filter: invalid ExtenderArgs: Pod.metadata: expected an object"),
        (
            {"Pod": {"spec": {"containers": [{"name": "c", "resources": {"limits": []}}]}}, "NodeNames": []},
            "Pod.spec.containers[0].resources.limits: expected an object, got an array",
        ),
        (
            {"Pod": {"metadata": {"annotations": {ann.POD_ASSIGNMENT: {"node": "n01"}}}}, "NodeNames": []},
            "Pod.metadata.annotations['vgpu.io/assignment']: expected a string, got an object",
        ),
    ],
)
def test_malformed_bodies_are_a_400_that_names_the_field(body: dict[str, Any], says: str) -> None:
    svc = _service()
    with pytest.raises(BadRequest) as refused:
        _serve(json.dumps(body).encode(), "filter", schema.ExtenderArgs, svc.filter)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"PodName": "", "PodNamespace": "ns", "Node": "n01"}, "PodName: String should have at least 1 character"),
        ({"PodName": "p", "PodNamespace": "ns", "Node": ""}, "Node: String should have at least 1 character"),
        ({"PodName": "p", "PodNamespace": "ns"}, "Node: Field required"),
        ({"PodName": ["p"], "PodNamespace": "ns", "Node": "n01"}, "PodName: Input should be a valid string"),
        ({"PodName": "p", "PodNamespace": "ns", "Node": "n" * 254}, "Node: String should have at most 253 characters"),
        ({"PodName": "p" * 254, "PodNamespace": "ns", "Node": "n01"}, "PodName: String should have at most 253"),
        ({"PodName": "p", "PodNamespace": "n" * 64, "Node": "n01"}, "PodNamespace: String should have at most 63"),
        (
            {"PodName": "p", "PodNamespace": "ns", "PodUID": "u" * 129, "Node": "n01"},
            "PodUID: String should have at most 128",
        ),
    ],
)
def test_malformed_binds_are_a_400_that_names_the_field(body: dict[str, Any], says: str) -> None:
    svc = _service()
    with pytest.raises(BadRequest, match="bind: invalid ExtenderBindingArgs") as refused:
        _serve(json.dumps(body).encode(), "bind", schema.ExtenderBindingArgs, svc.bind)
    assert says in str(refused.value)


def test_a_bind_naming_a_huge_node_is_refused_in_a_short_answer_that_changes_nothing() -> None:
    """A refused bind names its node in the answer, the log line and the pod's event: a 16 MiB Node (under the body
    limit) was repeated in each. Names longer than kube holds are a 400 before the verb runs, its message bounded."""
    svc = _service()
    pod = _pod("p", uid="uid-p")
    _pods(svc)["ns/p"] = copy.deepcopy(pod)
    before = dict(svc.state.assignments)
    body = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-p", "Node": "n" * (8 << 20)}
    with pytest.raises(BadRequest) as refused:
        _serve(json.dumps(body).encode(), "bind", schema.ExtenderBindingArgs, svc.bind)
    assert "Node: String should have at most 253 characters" in str(refused.value)
    assert len(str(refused.value)) <= 2048
    assert svc.state.assignments == before and not svc.binder.bind_tried  # type: ignore[attr-defined]
    # The longest name kube allows still reaches the verb, and is refused there as a node it does not know.
    answer = _serve(json.dumps({**body, "Node": "n" * 253}).encode(), "bind", schema.ExtenderBindingArgs, svc.bind)
    assert "n" * 253 in answer["Error"] and svc.state.assignments == before


def test_a_forged_assignment_in_a_filter_body_changes_neither_the_answer_nor_the_state() -> None:
    """vgpu.io/assignment and bind-phase in a /filter body are the caller's text, not the apiserver's: the pod is
    answered as the same pod without them, and no slice is taken or freed."""
    svc, fresh = _service(), _service()
    forged = _pod("p")
    forged["metadata"]["annotations"] = {ann.POD_ASSIGNMENT: _FORGED, ann.POD_BIND_PHASE: "allocated"}
    forged["spec"]["nodeName"] = ""
    before = dict(svc.state.assignments)
    assert _filter(svc, forged, _names(svc)) == _filter(fresh, _pod("p"), _names(fresh))
    assert svc.state.assignments == before


# -- /bind: refusals name the pod, the node and why, and change nothing -------------------------------------------


def _bind_args(pod: dict[str, Any], node: str, **override: str) -> schema.ExtenderBindingArgs:
    m = pod["metadata"]
    fields = {"PodName": m["name"], "PodNamespace": "ns", "PodUID": m["uid"], "Node": node, **override}
    return schema.ExtenderBindingArgs(**fields)


BIND_REFUSALS: dict[str, tuple[str, dict[str, str], str]] = {
    # case: (node, fields overridden, what the error says besides the pod and the node)
    "node-never-known": ("ghost", {}, f"no longer fits: {NO_INVENTORY}"),
    "node-name-unicode": ("n\u00f6de-\u2603", {}, f"no longer fits: {NO_INVENTORY}"),
    "node-name-longest": ("n" * 253, {}, f"no longer fits: {NO_INVENTORY}"),  # longer: a 400 (schema.MAX_NAME)
    "node-left": ("n07", {}, f"no longer fits: {NO_INVENTORY}"),
    "node-full": (
        "full0",
        {},
        "no longer fits: container 'c' needs 1 vGPU(s) of 40000 MiB/50% cores; 0 of 1 GPUs can host one (GPU memory full on 1)",
    ),
    "card-too-small": (
        "t1",
        {},
        "no longer fits: container 'c' needs 1 vGPU(s) of 40000 MiB/50% cores; 0 of 1 GPUs can host one (card too small on 1)",
    ),
    "pod-not-in-apiserver": ("n05", {"PodName": "nobody"}, "pod not found"),
    "uid-mismatch": ("n05", {"PodUID": "forged"}, "the pod's UID is uid-p, the bind names forged; refused"),
}


@pytest.mark.parametrize("case", list(BIND_REFUSALS))
@pytest.mark.parametrize("filtered", [False, True], ids=["never-filtered", "filtered"])
def test_a_refused_bind_names_what_was_wrong_and_leaves_the_state_as_it_was(case: str, filtered: bool) -> None:
    """Binds for a pod never filtered, or filtered and then bound elsewhere than /filter answered: to no node, a
    node that left, a node where it does not fit, for a pod the apiserver lacks or under another UID. Each is
    refused with the pod, the node and the reason, holds no slice, and the next honest pod is placed as on a fresh
    service that saw the same node leave."""
    node, override, says = BIND_REFUSALS[case]
    svc, fresh = _service(), _service()
    pod = _pod("p")
    _pods(svc)["ns/p"] = copy.deepcopy(pod)
    if filtered:
        _filter(svc, pod, _names(svc)[:6])  # the bind then names a node this /filter was not asked about
    if case == "node-left":
        for s in (svc, fresh):
            s.node_event("DELETED", {"metadata": {"name": "n07"}})
    before = dict(svc.state.assignments)
    args = _bind_args(pod, node, **override)
    error = svc.bind(args)["Error"]
    assert error == f"bind ns/{args.PodName} to {node}: {says}".replace("%", " percent")
    assert svc.state.assignments == before and not len(svc.reservations) and not svc.sync.unbound
    fresh_pod = copy.deepcopy(pod)
    _pods(fresh)["ns/p"] = fresh_pod
    if filtered:
        _filter(fresh, pod, _names(fresh)[:6])
    _honest_round(svc, fresh, _pod("honest"))


def test_a_bind_for_a_pod_never_filtered_to_a_node_no_filter_answered_binds_where_it_fits() -> None:
    """kube-scheduler binds to a node of its own choosing (its filter plugins and scores add to ours), so /bind
    decides on fresh state alone, not on what /filter last answered: a node the last /filter was not asked about,
    for a pod /filter never saw, binds there when the pod fits; the slices are the ones a fit there takes."""
    svc = _service()
    seen, unseen = _pod("seen"), _pod("unseen")
    for p in (seen, unseen):
        _pods(svc)[f"ns/{p['metadata']['name']}"] = copy.deepcopy(p)
    _filter(svc, seen, ["n04", "n05"])
    assert svc.bind(_bind_args(unseen, "n10"))["Error"] == ""
    assert svc.state.assignments["ns/unseen"].node == "n10" and not len(svc.reservations)
    assert svc.bind(_bind_args(unseen, "n11"))["Error"].startswith("bind ns/unseen to n11: already bound to n10")


# -- hostile calls interleaved with an honest workload ------------------------------------------------------------


def _workload(policy: str, options: dict[str, Any], seed: int, hostile: bool) -> list[object]:
    """40 pods of four shapes, each filtered over every node, prioritized over what passed and bound to the best,
    while nodes leave and join and pods are deleted. With `hostile`, before each honest pod: one to four calls of
    a caller sending duplicated, halved, unknown, empty and NodeList names for that pod, /prioritize over names
    twice, and binds refused for a node that is none, a pod that is none and a UID that is not the pod's. The trace
    of the honest calls' answers, the state and the binds in flight must not tell the two runs apart."""
    svc = _service(policy, **options)
    trace: list[object] = []
    rng = random.Random(seed)
    shapes = [(20000, 30), (40000, 50), (H100, 100), (8000, 10)]
    for r in range(40):
        names = _names(svc)
        mib, cores = shapes[r % len(shapes)]
        pod = _pod(f"p{r}", mib, cores)
        _pods(svc)[f"ns/p{r}"] = copy.deepcopy(pod)
        if hostile:
            for _ in range(rng.randint(1, 4)):
                kind = rng.choice(["dups", "first-many", "half-twice", "unknown", "empty", "items", "prio", "binds"])
                asked = {
                    "dups": names + rng.sample(names, k=5),
                    "first-many": [names[0]] * 7 + names + names,
                    "half-twice": rng.sample(names, k=len(names) // 2) * 2,
                    "unknown": [*names, "ghost", "", "x" * 300, names[1] + " ", *names[:3]],
                    "empty": [],
                }.get(kind, names)
                if kind == "items":
                    _filter(svc, pod, asked + asked[:4], items=True)
                elif kind == "prio":
                    svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=asked + asked[:6] + ["x"]))
                elif kind == "binds":
                    assert svc.bind(_bind_args(pod, "ghost", PodUID="forged"))["Error"]
                    assert svc.bind(_bind_args(pod, names[0], PodName="nobody", PodUID="u"))["Error"]
                    assert svc.bind(_bind_args(pod, names[0], PodUID="forged"))["Error"]
                else:
                    _filter(svc, pod, asked)
        answer = _filter(svc, pod, names)
        trace.append(("filter", r, answer))
        prios = svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=list(answer["NodeNames"])))
        trace.append(("prioritize", r, prios))
        best = max(prios, key=lambda h: h["Score"])["Host"] if prios else (answer["NodeNames"] or [None])[0]
        if best is not None:
            trace.append(("bind", r, best, svc.bind(_bind_args(pod, best))["Error"]))
        if r % 7 == 3:  # a node leaves
            svc.node_event("DELETED", {"metadata": {"name": names[(r * 5) % len(names)]}})
        if r % 11 == 5:  # a node joins
            inventory = ann.encode_inventory((GpuDevice(f"GPU-new{r}", 0, "H100", H100),))
            svc.node_event("ADDED", {"metadata": {"name": f"new{r}", "annotations": {ann.NODE_INVENTORY: inventory}}})
        if r % 9 == 8 and f"ns/p{r - 4}" in _pods(svc):  # a pod is deleted
            svc.pod_event("DELETED", _pods(svc)[f"ns/p{r - 4}"])
    trace.append(("state", sorted(svc.state.assignments.items()), len(svc.reservations), dict(svc.sync.unbound)))
    return trace


@pytest.mark.parametrize("policy", ["binpack", "default"])
@pytest.mark.parametrize("options", [{}, {"narrow_filter": True}, {"filter_answers_one": True}], ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_hostile_calls_leave_the_honest_workload_placed_as_without_them(
    policy: str, options: dict[str, Any], seed: int
) -> None:
    honest = _workload(policy, options, seed, hostile=False)
    for a, b in zip(honest, _workload(policy, options, seed, hostile=True), strict=True):
        assert a == b


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_the_pod_itself_filtered_again_frees_its_unbound_reservation_and_a_bound_body_frees_nothing(verb: str) -> None:
    """What a fix of a forged body freeing another pod's reservation must keep (docs/extender.md): the pod that
    holds an unbound reservation (an earlier release's assignment written before its Binding), scheduled again under
    its own UID, was not bound, so its slices are released before it is scored; a body saying the pod is bound never
    frees anything."""
    svc = _service()
    legacy = _pod("legacy", uid="uid-legacy")
    legacy["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(_slice("n05", "GPU-n05-0", H100, 100))
    }
    svc.pod_event("ADDED", copy.deepcopy(legacy))
    assert "ns/legacy" in svc.sync.unbound
    call = svc.filter if verb == "filter" else svc.prioritize
    says_bound = _pod("legacy", uid="uid-legacy")
    says_bound["spec"]["nodeName"] = "n05"
    call(schema.ExtenderArgs(Pod=says_bound, NodeNames=_names(svc)))
    assert "ns/legacy" in svc.state.assignments
    call(schema.ExtenderArgs(Pod=_pod("legacy", uid="uid-legacy"), NodeNames=_names(svc)))
    assert "ns/legacy" not in svc.state.assignments and "ns/legacy" not in svc.sync.unbound


def test_preempt_for_a_pod_naming_an_unknown_policy_answers_no_node_instead_of_raising() -> None:
    """A pod annotated vgpu.io/node-policy: nope after admission (annotations are mutable; the webhook acts on CREATE)
    gets every node unresolvable from /filter, so kube-scheduler calls /preempt for it. Parsing it succeeds, the
    policy is resolved only in victims_result (Planner.rank_on): UnknownPolicyError escaped there (HTTP 500)."""
    svc = _service()
    pod = _pod("p")
    pod["metadata"]["annotations"] = {ann.POD_NODE_POLICY: "nope"}
    _pods(svc)["ns/p"] = copy.deepcopy(pod)
    args = schema.ExtenderPreemptionArgs(Pod=pod, NodeNameToMetaVictims={"full0": {"Pods": [{"UID": "uid-hog0"}]}})
    assert svc.preempt(args) == {"NodeNameToMetaVictims": {}}


@pytest.mark.parametrize(
    ("victims", "says"),
    [
        (
            {"NodeNameToMetaVictims": {"full0": {"Pods": 5}}},
            'NodeNameToMetaVictims["full0"].Pods: expected an array of pods (or null), got a number',
        ),
        (
            {"NodeNameToMetaVictims": {"full0": {"Pods": True}}},
            'NodeNameToMetaVictims["full0"].Pods: expected an array of pods (or null), got a boolean',
        ),
        (
            {"NodeNameToMetaVictims": {"full0": {"pods": 1.5}}},
            'NodeNameToMetaVictims["full0"].Pods: expected an array of pods (or null), got a number',
        ),
        (
            {"NodeNameToVictims": {"full0": {"Pods": 3}}},
            'NodeNameToVictims["full0"].Pods: expected an array of pods (or null), got a number',
        ),
        (
            {"NodeNameToVictims": {"full0": {"Pods": [{"metadata": "x"}]}}},
            'NodeNameToVictims["full0"].Pods[0].metadata: expected an object (or null), got a string',
        ),
        (
            {"NodeNameToVictims": {"full0": {"Pods": [{"metadata": ["u"]}]}}},
            'NodeNameToVictims["full0"].Pods[0].metadata: expected an object (or null), got an array',
        ),
        (
            {"NodeNameToMetaVictims": {"full0": {"Pods": [{"UID": 7}]}}},
            'NodeNameToMetaVictims["full0"].Pods[0].UID: expected a string (or null), got a number',
        ),
        (
            {"NodeNameToMetaVictims": {"full0": {"Pods": ["u"]}}},
            'NodeNameToMetaVictims["full0"].Pods[0]: expected an object (or null), got a string',
        ),
        (
            {"NodeNameToMetaVictims": {"full0": []}},
            'NodeNameToMetaVictims["full0"]: expected an object (Pods, NumPDBViolations) (or null), got an array',
        ),
        (
            {"NodeNameToMetaVictims": {"gpu-1.example.com": {"NumPDBViolations": "2"}}},
            'NodeNameToMetaVictims["gpu-1.example.com"].NumPDBViolations: expected an integer (or null), got a string',
        ),
    ],
    ids=[
        "meta-pods-int",
        "meta-pods-bool",
        "meta-pods-float-lowercase-key",
        "pods-int",
        "pod-metadata-string",
        "pod-metadata-list",
        "meta-uid-int",
        "meta-pod-string",
        "node-list",
        "dotted-node-violations-string",
    ],
)
def test_preempt_victims_of_the_wrong_json_type_are_a_400_naming_the_field(victims: dict[str, Any], says: str) -> None:
    """scheduler_extender.preempt.given_victims iterated `Pods` whatever its type and called .get on a victim's
    metadata: TypeError / AttributeError, HTTP 500, before the pod was even looked at. Go's encoding/json would not
    decode such a body either: a 400 that names the field."""
    svc = _service()
    pod = _pod("p")
    _pods(svc)["ns/p"] = copy.deepcopy(pod)
    body = json.dumps({"Pod": pod, **victims}).encode()
    with pytest.raises(BadRequest) as refused:
        _serve(body, "preempt", schema.ExtenderPreemptionArgs, svc.preempt)
    # The whole answer: the field's path (node names hold dots: quoted), what it is and what is allowed.
    assert str(refused.value) == f"preempt: invalid ExtenderPreemptionArgs: {says}", refused.value


@pytest.mark.parametrize(
    ("victims", "uids"),
    [
        ({"full0": {"Pods": 5}}, []),
        (
            {"full0": {"Pods": [{"metadata": "x"}, 3, None, {"metadata": {"uid": 9}}, {"Metadata": {"UID": "u1"}}]}},
            ["u1"],
        ),
        ({"full0": "x", "full1": None, "t0": {"Pods": [{"metadata": ["uid"]}], "NumPDBViolations": "2"}}, []),
    ],
    ids=["pods-int", "odd-victims", "odd-nodes"],
)
def test_given_victims_skips_what_is_not_a_victim_when_the_wire_model_was_bypassed(
    victims: dict[str, Any], uids: list[str]
) -> None:
    """The verb's own reading never raises on a body the wire model did not check (model_construct): what is not a
    victim with a string UID is skipped; keys match case-insensitively, as Go's encoding/json matches them."""
    got = given_victims(None, victims)
    assert set(got) == set(victims)
    assert all(n == 0 for _, n in got.values())
    assert [u for given, _ in got.values() for u in given] == uids


def _whole_gpu_cluster() -> ClusterState:
    state = ClusterState()
    for n in ("a", "b", "c"):
        state.upsert_node(NodeInventory(n, (GpuDevice(f"GPU-{n}", 0, "H100", H100),)))
    return state


def test_a_bind_refused_for_another_uid_leaves_the_real_pods_soft_hold() -> None:
    """BindVerb.bind dropped the named pod's soft hold before reading the pod: a bind refused because its PodUID is
    not the pod's ended the real pod's hold, so the next pod of the shape is ranked onto the GPU the real pod is
    about to be bound to (the collision holds exist to prevent)."""
    answers = []
    for hostile in (False, True):
        svc = ExtenderService(_whole_gpu_cluster(), FakeBinder())
        svc.holds.clock = lambda: 1000.0
        p, q = _pod("p", H100, 100), _pod("q", H100, 100)
        for pod in (p, q):
            _pods(svc)[f"ns/{pod['metadata']['name']}"] = copy.deepcopy(pod)
        f = _filter(svc, p, ["a", "b", "c"])
        svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(p), NodeNames=f["NodeNames"]))
        if hostile:
            assert "the bind names forged; refused" in svc.bind(_bind_args(p, "zzz", PodUID="forged"))["Error"]
        f = _filter(svc, q, ["a", "b", "c"])
        answers.append(svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(q), NodeNames=f["NodeNames"])))
    assert answers[1] == answers[0]


def test_a_bind_without_a_pod_uid_is_refused_as_documented() -> None:
    """docs/extender.md ("What /bind refuses"): "the pod's UID must equal PodUID". PodUID is optional in the wire
    model (schema.ExtenderBindingArgs, default "") and bind.held_pod checked the UID only when one was given, so a
    bind naming no UID bound whatever pod then had that name (kube-scheduler always sends binding.UID, pkg/scheduler/
    extender.go `HTTPExtender.Bind`; /preempt refuses a body without metadata.uid as `uid-mismatch`)."""
    svc = _service()
    recreated = _pod("p", uid="uid-recreated")
    _pods(svc)["ns/p"] = copy.deepcopy(recreated)
    error = svc.bind(schema.ExtenderBindingArgs(PodName="p", PodNamespace="ns", Node="n05"))["Error"]
    assert error == "bind ns/p to n05: the bind names no pod UID (PodUID); the pod's UID must equal it, refused"
    assert "ns/p" not in svc.state.assignments and not len(svc.reservations) and not svc.sync.unbound


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_forged_body_does_not_free_another_pods_unbound_reservation(verb: str) -> None:
    """Reservations.release_stale dropped the unbound reservation kept under the body's namespace/name (an
    assignment an earlier extender release wrote before its Binding, which may still land) without comparing the
    body's UID with the pod's: any caller naming that pod freed its slices, and the next pod could be placed onto
    them. The pod itself, under its own UID, still frees them (the test above)."""
    svc = _service()
    legacy = _pod("legacy", uid="uid-legacy")
    legacy["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(_slice("n05", "GPU-n05-0", H100, 100))
    }
    svc.pod_event("ADDED", legacy)
    assert "ns/legacy" in svc.state.assignments and "ns/legacy" in svc.sync.unbound
    forged = _pod("legacy", uid="uid-forged")
    call = svc.filter if verb == "filter" else svc.prioritize
    call(schema.ExtenderArgs(Pod=forged, NodeNames=_names(svc)))
    assert "ns/legacy" in svc.state.assignments


def test_a_refused_bind_naming_a_pods_uid_does_not_stop_that_pod_being_learned() -> None:
    """ExtenderService.bind marks PodUID as "being bound by this replica" (Learning.binding) before the pod is read
    or its UID checked. A bind refused outright (no such pod, another node, a forged name) that named the UID of a
    pod not filtered yet made that pod's first /filter not "first seen": fragaware never learned it (nor when the
    watch showed it running). Learning.binding now keeps only UIDs /filter saw."""
    hostile, fresh = _service("default"), _service("default")
    pod = _pod("p")
    for s in (hostile, fresh):
        _pods(s)["ns/p"] = copy.deepcopy(pod)
    assert hostile.bind(_bind_args(pod, "ghost", PodName="someone-else"))["Error"].endswith("pod not found")
    for s in (hostile, fresh):
        _filter(s, pod, _names(s))
    assert hostile.learning.learned == fresh.learning.learned == 1


def test_refused_binds_with_made_up_uids_are_not_remembered() -> None:
    """Each refused bind left its PodUID in Learning._seeded, dropped only by a DELETED event for that UID or a
    relist: 200 binds with 64 KiB made-up UIDs held 12.5 MiB (tracemalloc), without bound. (The wire model now
    refuses a UID over 128 characters; made-up ones of the longest allowed are still not remembered.)"""
    svc = _service("default")
    uids = [f"made-up-{i}-" + "u" * 100 for i in range(50)]
    for uid in uids:
        assert svc.bind(_bind_args(_pod("nobody"), "n01", PodUID=uid))["Error"].endswith("pod not found")
    assert not [uid for uid in uids if svc.learning.knows(uid)]


def test_the_bind_verb_reports_a_pod_as_being_bound_only_once_it_is_read_under_its_uid() -> None:
    """BindVerb's `binding` hook (Learning.binding, once service.py passes it) hears the UID of the pod read under
    the bind's PodUID, before its slices are reserved, and nothing of a bind refused for another UID, a pod the
    apiserver lacks or no UID at all."""
    svc = _service()
    heard: list[str] = []
    svc._bind = dataclasses.replace(svc._bind, binding=heard.append)
    pod = _pod("p")
    _pods(svc)["ns/p"] = copy.deepcopy(pod)
    for refused in (_bind_args(pod, "n05", PodUID="forged"), _bind_args(pod, "n05", PodName="nobody")):
        assert svc.bind(refused)["Error"]
    assert svc.bind(schema.ExtenderBindingArgs(PodName="p", PodNamespace="ns", Node="n05"))["Error"]
    assert heard == []
    assert svc.bind(_bind_args(pod, "full0"))["Error"].endswith("GPU memory full on 1)")  # read, then refused
    assert svc.bind(_bind_args(pod, "n05"))["Error"] == ""
    assert heard == ["uid-p", "uid-p"]


def _requeued_service() -> tuple[ExtenderService, Requeuer]:
    requeuer = Requeuer(lambda namespace, name, uid: None, max_pods=50, clock=lambda: 1000.0)
    svc = ExtenderService(_cluster("binpack"), FakeBinder(), options=ServiceOptions(), requeuer=requeuer)
    return svc, requeuer


def test_made_up_pods_rejected_at_filter_do_not_take_every_nudge_from_real_ones() -> None:
    """Pending keeps every pod key /filter rejected until a watch event for that key (bound, deleted), which a
    made-up pod never gets; each release nudged the oldest 50 and dropped the rest. 50 made-up pods rejected first
    took all 50 slots on every release for ever: a real rejected pod was never nudged (requeue outcome "dropped").
    Now every pending pod is queued and at most 50 go out an interval, earliest due first."""
    svc, requeuer = _requeued_service()
    for i in range(50):
        _filter(svc, _pod(f"made-up-{i}", count=64), _names(svc))  # 64 GPUs: fits nowhere
    real = _pod("real", count=64)  # a pod the apiserver holds, rejected after them
    _pods(svc)["ns/real"] = copy.deepcopy(real)
    assert _filter(svc, real, _names(svc))["NodeNames"] == []
    svc.pod_event("DELETED", {"metadata": {"name": "part0", "namespace": "ns"}})  # a release: pending pods nudged
    assert "ns/made-up-0" in requeuer.pending()  # the nudge went out
    assert "ns/real" in requeuer.pending()


def test_what_pending_keeps_is_bounded_by_what_kube_would_hold_by_count_and_by_time() -> None:
    """200 made-up pods with 64 KiB names held 25 MiB in Pending (tracemalloc), without bound: a name kube would not
    hold is not kept, at most MAX_PENDING are (the oldest rejections go first, their queued nudges forgotten), and an
    entry lasts TTL_S after its pod's last rejection (kube-scheduler retries a real one sooner)."""
    now = [1000.0]
    requeuer = Requeuer(lambda namespace, name, uid: None, max_pods=50, clock=lambda: now[0])
    svc = ExtenderService(_cluster("binpack"), FakeBinder(), requeuer=requeuer)
    svc.pending = Pending(requeuer, on_count=svc.metrics.pending.set, max_pods=3, clock=lambda: now[0])
    for name in ("n" * 254, "ok-" + "n" * 250):
        _filter(svc, _pod(name, count=64, uid="uid-long-name"), _names(svc))
    long_uid = _pod("long-uid", count=64)
    long_uid["metadata"]["uid"] = "u" * 129
    _filter(svc, long_uid, _names(svc))
    assert list(svc.pending) == ["ns/ok-" + "n" * 250]
    for i in range(4):
        now[0] += 1
        _filter(svc, _pod(f"p{i}", count=64), _names(svc))
    assert list(svc.pending) == ["ns/p1", "ns/p2", "ns/p3"]
    svc.pending.capacity_freed()
    assert set(requeuer.pending()) == {"ns/p1", "ns/p2", "ns/p3"}
    now[0] += TTL_S - 1.5  # p1 rejected TTL_S ago, p2 and p3 later
    svc.pending.capacity_freed()
    assert list(svc.pending) == ["ns/p2", "ns/p3"] and set(requeuer.pending()) == {"ns/p2", "ns/p3"}
    now[0] += 2
    _filter(svc, _pod("p3", count=64), _names(svc))  # rejected again: its time starts again
    assert list(svc.pending) == ["ns/p3"]
    svc.pending.keep_only(["ns/other"])  # a pod list without it
    assert list(svc.pending) == [] and requeuer.pending() == {}


def test_a_pending_pod_deleted_while_the_watch_was_down_is_dropped_by_the_relist() -> None:
    """A relist releases whatever the list no longer holds, and so does Pending: a rejected pod deleted while the
    watch was down would otherwise be nudged (404, "gone") on every later release until its entry expired."""
    svc, _ = _requeued_service()
    gone = _pod("gone", count=64)
    _filter(svc, gone, _names(svc))
    assert "ns/gone" in svc.pending
    svc.replace_pods([])  # the relist after a watch failure: the pod is not there any more
    assert "ns/gone" not in svc.pending


def test_a_pod_rejected_after_the_relist_was_read_stays_pending() -> None:
    """The pod list is read at one moment and applied seconds later (40k pods: ~3 s to parse, ~3 s to apply); a pod
    created after the read, and rejected by /filter meanwhile, is not in the list but is pending all the same: the
    relist dropped it, and the release that made room for it did not nudge it. Only entries rejected before the
    list was read and missing from it are dropped."""
    svc, _ = _requeued_service()
    now = [100.0]
    svc.pending.clock = lambda: now[0]
    gone = _pod("gone", count=64)
    _filter(svc, gone, _names(svc))  # deleted later, while the watch was down
    now[0] = 110.0
    listed_at = now[0]  # the relist's read
    now[0] = 112.0
    _filter(svc, _pod("new", count=64), _names(svc))  # created after the read, rejected before the list is applied
    svc.replace_pods([], listed_at=listed_at)
    assert list(svc.pending) == ["ns/new"]
    svc.replace_pods([])  # no time known (the file source): what the list does not hold goes, as before
    assert list(svc.pending) == []


def test_the_kube_source_tells_the_relist_when_its_list_was_read() -> None:
    """The pods reflector notes when it read the list; KubeSource hands that to replace_pods, so a pod /filter
    rejected while the list was on its way (here: during the list call itself) stays pending."""
    svc, _ = _requeued_service()

    def list_pods(**_: Any) -> Any:
        _filter(svc, _pod("new", count=64), _names(svc))  # created after the read, rejected meanwhile
        return SimpleNamespace(data=orjson.dumps({"metadata": {"resourceVersion": "7"}, "items": []}))

    source = KubeSource(SimpleNamespace(list_node=None, list_pod_for_all_namespaces=list_pods), svc)
    source.pods._list()
    assert list(svc.pending) == ["ns/new"]


def test_a_first_call_with_a_duplicate_does_not_keep_the_shape_off_the_every_name_path() -> None:
    """Planner._memo_for keeps each name once when it makes a shape's memo, as `_extend` does. Were a hostile first
    call's duplicate kept, the memo's names would never equal an honest call's again, and no later /filter of the
    shape would take `_filter_every` while the memo lives (answers right, but at 5,000 nodes x 8 GPUs, median of 150
    interleaved calls: 0.22 -> 0.79 ms a /filter on an empty cluster, 5.9 -> 10.1 ms with all but 10 nodes full)."""
    kept = []
    for hostile in (False, True):
        svc = _service()
        every, pod = _names(svc), _pod("p")
        if hostile:
            _filter(svc, pod, [*every, every[0]])
        for _ in range(2):
            _filter(svc, pod, every)
        (memo,) = svc.planner._memo.values()
        kept.append((memo.names == every, memo.positions is not None))
    assert kept[1] == kept[0] == (True, True)


def test_a_pod_bound_after_the_relist_was_read_keeps_its_slices() -> None:
    """A pod created after the list was read, and bound by this extender before the list is applied, is not in the
    list: the relist released its slices until the watch (from the list's version) showed it bound again, and a pod
    placed meanwhile could be put on the same GPU. A reservation this extender made after the read is kept."""
    svc, _ = _requeued_service()
    now = [100.0]
    svc.sync.clock = lambda: now[0]
    listed_at = now[0]
    now[0] = 103.0
    pod = _pod("late", count=1)
    _pods(svc)["ns/late"] = copy.deepcopy(pod)
    names = _names(svc)
    assert _filter(svc, pod, names)["NodeNames"]
    assert (
        svc.bind(schema.ExtenderBindingArgs(PodName="late", PodNamespace="ns", PodUID="uid-late", Node=names[0]))[
            "Error"
        ]
        == ""
    )
    held = svc.state.assignments["ns/late"]
    svc.replace_pods([], listed_at=listed_at)
    assert svc.state.assignments.get("ns/late") == held
    svc.replace_pods([])  # no time known: what the list does not hold is released, as before
    assert "ns/late" not in svc.state.assignments
