"""A bound pod's assignment must name the node the pod is bound to: anything else was written by hand."""

from __future__ import annotations

from typing import Any

from scheduler_extender.sync import StateSync
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.state import ClusterState


def _state() -> ClusterState:
    state = ClusterState()
    for n in ("x", "y"):
        state.upsert_node(NodeInventory(n, tuple(GpuDevice(f"GPU-{n}-{i}", i, "H100", 81920) for i in range(2))))
    return state


def _assignment(node: str) -> Assignment:
    return Assignment(node, (ContainerAssignment("c", (DeviceSlice(f"GPU-{node}-0", 0, 81920, 100),)),))


def _pod(node_name: str, assignment: Assignment) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "annotations": {ann.POD_ASSIGNMENT: ann.encode_assignment(assignment), ann.POD_BIND_PHASE: "allocating"},
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "c"}]},
    }


def test_a_bound_pods_assignment_for_another_node_reserves_nothing_and_is_reported() -> None:
    state = _state()
    problems: list[tuple[str, str]] = []
    sync = StateSync(state, on_problem=lambda kind, msg: problems.append((kind, msg)))
    sync.pod_event("ADDED", _pod("y", _assignment("x")))  # bound to y, the annotation holds a whole card on x
    assert "ns/p" not in state.assignments
    assert state.nodes["x"].by_uuid["GPU-x-0"].memory_used == 0
    assert problems and problems[0][0] == "assignment"
    assert "'x'" in problems[0][1] and "'y'" in problems[0][1]


def test_a_held_reservation_is_released_when_the_pod_turns_out_bound_elsewhere() -> None:
    state = _state()
    sync = StateSync(state)
    unbound = _pod("", _assignment("x"))  # an unbound pod's assignment: held for the bind grace
    sync.pod_event("ADDED", unbound)
    assert state.assignments["ns/p"].node == "x"
    sync.pod_event("MODIFIED", _pod("y", _assignment("x")))  # ... then bound to y by someone else
    assert "ns/p" not in state.assignments and "ns/p" not in sync.unbound


def test_a_bound_pods_assignment_for_its_own_node_is_applied() -> None:
    state = _state()
    sync = StateSync(state)
    sync.pod_event("ADDED", _pod("x", _assignment("x")))
    assert state.assignments["ns/p"] == _assignment("x")
