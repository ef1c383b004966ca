"""Review of this session's warm-path changes to the planner and the extender's /filter (the config id, the last pod's
policy and shape, the stand-in pod made once a shape, /filter over names that may lack an inventory, the positions
kept for /filter over every name): each answer against the plain uncached one, hostile names, and a verb thread
running while another's answer is still being written."""

from __future__ import annotations

import dataclasses
import gc
import threading
import uuid
from typing import Any

import pytest

from scheduler_extender import schema
from scheduler_extender.service import NO_INVENTORY, ExtenderService
from tests.conftest import make_container, make_info, make_node
from tests.unit.test_extender_service import FakeBinder
from tests.unit.test_fit_fast import SHAPES, _cluster
from tests.unit.test_planner_subsets import _oracle
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.planner import Planner
from vgpu.pod import PodInfo
from vgpu.state import ClusterState


def _two_gpu_pod(name: str, container: str, *, model: str | None = "m1") -> PodInfo:
    """A decode pod of `model` asking two whole GPUs from one container named `container`."""
    role = None if model is None else "decode"
    return make_info(name, role=role, model=model, containers=[make_container(container, gpu=2)])


def _small_cluster(policy: str = "default") -> ClusterState:
    state = ClusterState(PlacementConfig(node_policy=policy))
    state.upsert_node(make_node("one-gpu", 1))  # too small for a two-GPU pod: fails naming the pod's container
    state.upsert_node(make_node("two-gpu", 2))
    return state


def _relabel(state: ClusterState, name: str, step: int) -> None:
    """A new version of the node (a label changed): no cached result holds for it."""
    state.upsert_node(dataclasses.replace(state.nodes[name].inventory, labels={"step": str(step)}))


def _reasons(answer: tuple[list[str], dict[str, str], dict[str, str]]) -> dict[str, str]:
    """FailedNodes and FailedAndUnresolvableNodes of a `filter_names` answer together."""
    return {**answer[1], **answer[2]}


def test_a_stand_in_evaluated_afresh_names_the_asking_pods_containers() -> None:
    """A node that runs neither model is evaluated through `_absent`'s stand-in. Re-evaluated after it changed (no
    cached result to reuse), /filter's FailedNodes reason must name the asking pod's container, as the uncached
    evaluation does: the stand-in made once a shape is the first pod's, with that pod's container names. (binpack: no
    node classes, whose shared failure names the first pod's containers too, before the stand-in as after it.)"""
    state = _small_cluster("binpack")
    p = Planner(state)
    first, second = _two_gpu_pod("first", "alpha"), _two_gpu_pod("second", "beta")
    names = ["one-gpu", "two-gpu"]
    for step in range(2):  # the first pass (`_fill`), then a re-evaluation through the stand-in: the first pod's
        assert "'alpha'" in _reasons(p.filter_names(first, list(names), unknown=NO_INVENTORY))["one-gpu"]
        _relabel(state, "one-gpu", step)
    got = p.filter_names(second, list(names), unknown=NO_INVENTORY)
    want = p.evaluate_node("one-gpu", second).failure
    assert want is not None and "'beta'" in want.reason
    assert _reasons(got)["one-gpu"] == want.reason


@pytest.mark.parametrize("policy", ["default", "binpack"])
@pytest.mark.parametrize("model", ["m1", None])
def test_failed_nodes_name_the_asking_pods_containers(model: str | None, policy: str) -> None:
    """/filter's FailedNodes reasons (kube-scheduler's FailedScheduling event) name the asking pod's containers, as the
    uncached evaluation does, not those of the pod of the same shape whose evaluation the per-shape cache or a node
    class kept; and a pod named like the first still shares the first's evaluation."""
    state = _small_cluster(policy)
    p = Planner(state)
    first, second = _two_gpu_pod("first", "alpha", model=model), _two_gpu_pod("second", "beta", model=model)
    names = ["one-gpu", "two-gpu"]
    p.filter_names(first, list(names), unknown=NO_INVENTORY)
    got = p.filter_names(second, list(names), unknown=NO_INVENTORY)
    want = _oracle(p, second, names)
    assert "'beta'" in want.unresolvable["one-gpu"]
    assert (got[1], got[2]) == (want.failed, want.unresolvable)
    again = _two_gpu_pod("third", "alpha", model=model)
    assert p.filter_names(again, list(names), unknown=NO_INVENTORY)[2] == _oracle(p, again, names).unresolvable


def test_equal_configs_share_an_id_and_an_id_is_never_another_configs() -> None:
    """`_config_id` through configs swapped in and dropped (ids of freed objects are reused by CPython): equal
    configs one number, different ones different numbers, whatever object identity each had."""
    state = ClusterState(PlacementConfig())
    p = Planner(state)
    seen: dict[PlacementConfig, int] = {}
    for step in range(40):
        config = PlacementConfig(memory_scaling=1.0 + (step % 4) / 10)  # a new object each time, four values
        state.config = config
        got = p._config_id()
        assert seen.setdefault(dataclasses.replace(config), got) == got
        assert p._config_id() == got  # the identity shortcut
        del config
        gc.collect()
    assert len(set(seen.values())) == 4


def test_a_pod_object_per_content_the_last_pod_kept_by_identity() -> None:
    """`_resolved` keeps the last PodInfo object's policy and shape: another object, even one at a freed object's
    address, is resolved anew (a pod naming another policy gets that policy's answer)."""
    state = _cluster(0, "default", nodes=12)
    p = Planner(state)
    names = sorted(state.nodes)
    for step in range(6):
        policy = ["binpack", "spread"][step % 2]
        pod = make_info(f"p{step}", annotations={"vgpu.io/node-policy": policy}, **SHAPES[0])  # type: ignore[arg-type]
        assert p._resolved(pod)[0].name == policy
        got = p.filter_names(pod, list(names), unknown=NO_INVENTORY)
        assert p.priorities_for(pod, got[0]) == Planner(state).priorities_for(pod, list(got[0]))
        del pod
        gc.collect()


def test_hostile_names_get_the_plain_answer_and_leave_the_memo_as_it_was() -> None:
    """Names a caller controls: thousands of names never known, duplicates, a node's name with a space, empty names.
    The answer is the uncached one (unknown names failed with the extender's reason); nothing of them enters the
    shape's memo, and the next plain call over every node is answered as a fresh planner answers it."""
    state = _cluster(1, "default", nodes=30)
    p = Planner(state)
    pod = make_info("h", **SHAPES[1])  # type: ignore[arg-type]
    names = list(state.nodes)
    p.filter_names(pod, list(names), unknown=NO_INVENTORY)  # the memo covers every node: the fast path's case
    hostile = [f"ghost-{i}" for i in range(5000)] + names * 3 + [names[0] + " ", "", "\x00"]
    got = p.filter_names(pod, hostile, unknown=NO_INVENTORY)
    want = _oracle(p, pod, [n for n in hostile if n in state.nodes])
    assert got[0] == [n for n in hostile if n in want.feasible]
    assert got[1] == {**want.failed, **{n: NO_INVENTORY for n in hostile if n not in state.nodes}}
    assert got[2] == want.unresolvable
    for memo in p._memo.values():
        assert memo.name_set <= set(state.nodes)
    again = p.filter_names(pod, list(names), unknown=NO_INVENTORY)
    fresh = Planner(state).filter_names(pod, list(names))
    assert again[0] == fresh[0]
    assert again[1] == fresh[1]
    assert again[2] == fresh[2]


def _service_pod(name: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": str(uuid.uuid4())},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def test_a_filter_answer_is_whole_when_another_verb_thread_runs_right_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """/filter over every node may answer FailedNodes with the planner's memoised evaluation's own dict, which the next
    call of the shape refreshes in place. Another verb thread (a second scheduler, /preempt) may take the state lock
    the moment this call leaves it: the answer must already be copied by then, each asked node in exactly one of
    NodeNames, FailedNodes and FailedAndUnresolvableNodes, as the state was under the lock."""
    state = ClusterState(PlacementConfig(node_policy="binpack"))  # learns nothing: both pods share one memo
    for n in ("a", "b"):
        state.upsert_node(NodeInventory(n, tuple(GpuDevice(f"GPU-{n}-{i}", i, "H100", 81920) for i in range(2))))
    full = tuple(DeviceSlice(uuid=f"GPU-a-{i}", index=i, memory_mib=81920, cores=100) for i in range(2))
    state.apply("ns/filler", Assignment(node="a", containers=(ContainerAssignment("c", full),)))
    svc = ExtenderService(state, FakeBinder())
    names = ["a", "b"]
    other_ran: list[bool] = []

    def other_verb_thread() -> None:
        """What another verb thread does once it has the lock: a release, then /filter for a pod of the same shape."""
        if not svc.lock.acquire(blocking=False):
            other_ran.append(False)  # the first call still holds it: it runs after the answer is written
            return
        try:
            state.release("ns/filler")
            svc.filter(schema.ExtenderArgs(Pod=_service_pod("other"), NodeNames=list(names)))
            other_ran.append(True)
        finally:
            svc.lock.release()

    real = schema.filter_result

    def written_later(**kw: Any) -> dict[str, Any]:
        if not other_ran:
            t = threading.Thread(target=other_verb_thread)
            t.start()
            t.join()
        return real(**kw)

    monkeypatch.setattr(schema, "filter_result", written_later)
    out = svc.filter(schema.ExtenderArgs(Pod=_service_pod("first"), NodeNames=list(names)))
    assert other_ran
    answered = [*out["NodeNames"], *out["FailedNodes"], *out["FailedAndUnresolvableNodes"]]
    assert sorted(answered) == names  # "a" failed (full under the lock), "b" passed
    assert out["NodeNames"] == ["b"]
