"""Replaying pods through the planner without a cluster: the placement loop of the CLI demo and benchmarks.

Each pod goes through exactly what the extender does for it — `Planner.evaluate`, the best-scored node,
`ClusterState.apply` — so a replay shows the placements the real scheduler path would make. Pure: the
callers load files and print.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu.annotations import Assignment
from vgpu.clusterfile import ClusterFileError
from vgpu.config import PlacementConfig, RequestDefaults, ResourceNames
from vgpu.devices import NodeInventory
from vgpu.errors import CapacityError, RequestError, UnknownPolicyError
from vgpu.planner import Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.state import ClusterState, HostUse


@dataclass(frozen=True, slots=True)
class Placed:
    """A pod that got a node and concrete GPU slices."""

    pod: PodInfo
    assignment: Assignment
    score: float
    feasible_nodes: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """A pod that could not be placed; `node_reasons` holds every node's own reason."""

    pod_key: str
    reason: str
    pod: PodInfo | None = None
    node_reasons: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ReplayResult:
    placed: list[Placed] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def build_state(
    nodes: Iterable[NodeInventory],
    allocations: Iterable[tuple[str, Assignment]] = (),
    config: PlacementConfig | None = None,
) -> ClusterState:
    """A cluster state holding these nodes and existing allocations.

    Raises ClusterFileError naming the offending `allocations.<i>` entry when an allocation refers to a
    node or GPU that is not in the inventory, or would go over a GPU's capacity — a cluster file with
    impossible allocations is a broken file, not a state to display.
    """
    state = ClusterState(config)
    for inv in nodes:
        state.upsert_node(inv)
    for i, (key, assignment) in enumerate(allocations):
        if assignment.node not in state.nodes:
            raise ClusterFileError(
                f"invalid cluster file: allocations.{i}.assignment.node: unknown node {assignment.node!r} (pod {key})"
            )
        try:
            state.apply(key, assignment)
        except CapacityError as exc:
            raise ClusterFileError(f"invalid cluster file: allocations.{i}: {exc}") from None
    return state


def _summary(failed: int, unresolvable: int) -> str:
    if not failed + unresolvable:
        return "no node has a vGPU inventory"
    return f"0/{failed + unresolvable} nodes fit ({unresolvable} could not even when empty)"


def place(planner: Planner, pod: PodInfo) -> Placed | Rejected:
    """Evaluate every node, take the best, apply it to the planner's state (or say why not)."""
    if pod.request.is_empty:
        return Rejected(pod.key, "asks for no vGPU resources", pod)
    if pod.key in planner.state.assignments or pod.key in planner.state.orphans:
        return Rejected(pod.key, "a pod with this namespace/name already holds slices", pod)
    try:
        planner.evaluate(pod, node_names=())  # checks the pod's policy annotations, naming a bad one
    except UnknownPolicyError as exc:
        return Rejected(pod.key, str(exc), pod)
    # The policy learns the arriving shape before it scores nodes for it (NodePolicy.observe).
    planner.observe(pod)
    evaluation = planner.evaluate(pod)
    best = evaluation.best()
    if best is None:
        reasons = {**evaluation.failed, **evaluation.unresolvable}
        summary = _summary(len(evaluation.failed), len(evaluation.unresolvable))
        return Rejected(pod.key, summary, pod, dict(sorted(reasons.items())))
    node, result = best
    assert result.placement is not None  # feasible results always carry a placement
    assignment = result.placement.assignment(pod)
    try:
        planner.state.apply(pod.key, assignment, HostUse(pod.cpu_milli, pod.memory_mib))
    except CapacityError as exc:
        return Rejected(pod.key, str(exc), pod, {node: str(exc)})
    return Placed(pod, assignment, result.score, len(evaluation.feasible))


def replay(
    planner: Planner,
    pods: Iterable[Mapping[str, Any]],
    *,
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
    track_host_resources: bool = False,
) -> ReplayResult:
    """Place Kubernetes Pod objects one after another, in order, onto the planner's state."""
    out = ReplayResult()
    for raw in pods:
        meta = raw.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or ''}"
        try:
            info = pod_info(raw, names, defaults, track_host_resources=track_host_resources)
        except RequestError as exc:
            out.rejected.append(Rejected(key, str(exc)))
            continue
        outcome = place(planner, info)
        if isinstance(outcome, Placed):
            out.placed.append(outcome)
        else:
            out.rejected.append(outcome)
    return out
