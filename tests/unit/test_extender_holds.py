"""Soft holds: a pod /prioritize ranked first keeps the next pods off its GPUs until it is bound, by lowering
their scores only (scheduler_extender.holds)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from scheduler_extender import schema
from scheduler_extender.holds import SoftHolds, steer
from scheduler_extender.service import ExtenderService
from tests.unit.test_extender_service import FakeBinder, _bind, _pod, _state
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice


def _whole_node_pod(name: str) -> dict[str, Any]:
    """Both GPUs of a node of _state(): two such pods never share a node."""
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "100"}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": str(uuid.uuid4())},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def _prios(svc: ExtenderService, pod: dict[str, Any]) -> dict[str, int]:
    answer = svc.prioritize(schema.ExtenderArgs(Pod=copy.deepcopy(pod), NodeNames=["a", "b"]))
    return {h["Host"]: h["Score"] for h in answer}


def _best(prios: dict[str, int]) -> str:
    return max(prios, key=prios.__getitem__)


@pytest.fixture
def setup() -> tuple[ExtenderService, FakeBinder]:
    binder = FakeBinder()
    return ExtenderService(_state(), binder), binder


def test_the_next_pod_is_steered_off_a_node_it_cannot_share_and_feasibility_is_unchanged(
    setup: tuple[ExtenderService, FakeBinder],
) -> None:
    svc, binder = setup
    p, q = _whole_node_pod("p"), _whole_node_pod("q")
    first = _prios(svc, p)
    top = _best(first)
    assert "ns/p" in svc.holds
    alone = _prios(svc, q)
    other = "b" if top == "a" else "a"
    assert _best(alone) == other and alone.get(top, 0) == 0  # p's node scores 0 for q, the other node wins
    filtered = svc.filter(schema.ExtenderArgs(Pod=copy.deepcopy(q), NodeNames=["a", "b"]))
    assert sorted(filtered["NodeNames"]) == ["a", "b"]  # a hold never makes a node infeasible
    binder.pods["ns/p"], binder.pods["ns/q"] = p, q
    assert _bind(svc, p, top) == "" and "ns/p" not in svc.holds  # bound: the hold is gone, the slices count
    assert _bind(svc, q, other) == ""  # no "no longer fits"


def test_a_pod_that_fits_beside_the_hold_keeps_its_scores(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, _ = setup
    before = _prios(svc, _pod("q", 30))
    svc.holds.drop("ns/q")
    _prios(svc, _pod("p", 30))  # 30 percent of one GPU: room for q beside it on the same GPU
    assert _prios(svc, _pod("q2", 30)) == before


def test_holds_expire_and_go_with_the_pod(setup: tuple[ExtenderService, FakeBinder]) -> None:
    svc, _ = setup
    now = [0.0]
    svc.holds.clock = lambda: now[0]
    p, q = _whole_node_pod("p"), _whole_node_pod("q")
    top = _best(_prios(svc, p))
    now[0] = svc.holds.ttl_s + 1  # p's bind never came
    assert _best(_prios(svc, q)) == top and "ns/p" not in svc.holds
    svc.pod_event("DELETED", q)
    assert "ns/q" not in svc.holds


def _assignment(node: str) -> Assignment:
    return Assignment(node, (ContainerAssignment("c", (DeviceSlice(f"GPU-{node}-0", 0, 1024, 10),)),))


def test_soft_holds_book() -> None:
    now = [0.0]
    holds = SoftHolds(ttl_s=5, clock=lambda: now[0])
    holds.hold("ns/p", "a", _assignment("a"))
    holds.hold("ns/q", "a", _assignment("a"))
    assert [h.key for h in holds.on("a", other_than="ns/q")] == ["ns/p"]
    holds.hold("ns/p", "b", _assignment("b"))  # prioritized again: the newer hold replaces the older
    assert [h.key for h in holds.on("a", other_than="")] == ["ns/q"] and len(holds) == 2
    now[0] = 6
    assert holds.on("a", other_than="") == [] and holds.on("b", other_than="") == [] and len(holds) == 0


def test_steer_only_lowers_best_first() -> None:
    prios = {"a": 10, "b": 9, "c": 8}
    assert steer(prios, lambda n: False) == (prios, "a")
    out, best = steer(prios, lambda n: n in ("a", "b"))
    assert out == {"a": 0, "b": 0, "c": 8} and best == "c" and prios == {"a": 10, "b": 9, "c": 8}
    out, best = steer(prios, lambda n: True)
    assert best is None and all(out[n] <= prios[n] for n in prios) and not any(out.values())
    assert steer({}, lambda n: True) == ({}, None)
    asked: list[str] = []
    steer({"a": 10, "b": 0}, lambda n: asked.append(n) or True)
    assert asked == ["a"]  # nodes scoring 0 are never weighed
