"""One replay run: every arrival goes through `Planner.evaluate` and the node kube-scheduler would pick.

Modes of choosing among the planner's feasible nodes:
- `best`: the highest fine score; ties go to the node first in the seed's fixed node order (the paper).
- `prioritize`: what kube-scheduler does with our /prioritize answer: integer 0..10 priorities
  (`to_priorities`, the default rank mapping), then a uniformly random node of the top bucket.
- `narrow`: the narrow filter (docs/architecture.md, pipeline step 5): /filter keeps only the top bucket, /prioritize then re-buckets
  those nodes (skipped when only one is left) and kube-scheduler picks randomly in the new top bucket.
- `prioritize-minmax`, `narrow-minmax`: the same with min-max buckets, to show what that mapping costs.

`percentage` (kube-scheduler's `percentageOfNodesToScore`): None asks the planner about every node, as the paper's
replays do. A number asks it, per pod, only about the nodes kube-scheduler would send the extender: it walks its node
list from where the last pod's walk stopped and stops at the `nodes_to_find`-th node that passes its own filters
(`kube_window`); 0 is its adaptive default.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from vgpu.config import PlacementConfig
from vgpu.planner import Evaluation, NodeResult, Planner, PriorityMapping, to_priorities
from vgpu.pod import PodInfo
from vgpu.replay.protocol import arrivals, node_order
from vgpu.replay.trace import NodeRow, PodRow, to_inventory, to_pod_info
from vgpu.state import ClusterState, HostUse, NodeState

Mode = Literal["best", "prioritize", "narrow", "prioritize-minmax", "narrow-minmax"]
MODES: tuple[Mode, ...] = ("best", "prioritize", "narrow", "prioritize-minmax", "narrow-minmax")


@dataclass(slots=True)
class RunResult:
    policy: str
    seed: int
    mode: Mode
    capacity_milli: int
    arrived: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    failed: int = 0
    wall_seconds: float = 0.0
    percentage: int | None = None  # percentageOfNodesToScore; None: every node
    names_per_pod: float = 0.0  # nodes the planner was asked about, on average

    @property
    def pods(self) -> int:
        return len(self.arrived)


# kubernetes v1.34.4 pkg/scheduler/schedule_one.go: minFeasibleNodesToFind, minFeasibleNodesPercentageToFind.
MIN_NODES_TO_FIND = 100
MIN_PERCENTAGE_TO_FIND = 5


def percentage_problem(percentage: int) -> str | None:
    """What is wrong with a percentageOfNodesToScore, for the caller to name its own setting; None: nothing."""
    return None if 0 <= percentage <= 100 else "allowed 0 (adaptive) to 100"


def nodes_to_find(percentage: int, nodes: int) -> int:
    """kube-scheduler's `numFeasibleNodesToFind` (kubernetes v1.34.4 pkg/scheduler/schedule_one.go): with 0, its
    adaptive percentage, 50 less one point per 125 nodes and at least 5; never fewer than 100 nodes, nor than all."""
    if problem := percentage_problem(percentage):
        raise ValueError(f"percentageOfNodesToScore {percentage}: {problem}")
    if nodes < MIN_NODES_TO_FIND:
        return nodes
    if percentage == 0:
        percentage = max(50 - nodes // 125, MIN_PERCENTAGE_TO_FIND)
    return max(nodes * percentage // 100, MIN_NODES_TO_FIND)


def kube_fits(node: NodeState, pod: PodInfo) -> bool:
    """What kube-scheduler's own filters check before the extender hears of a node: host CPU and memory
    (NodeResourcesFit), the `nvidia.com/gpu` replicas the device plugin advertises (one per GPU and sharer) against
    the ones held, and the GPU models the pod allows (a node affinity on the model label)."""
    inv = node.inventory
    if inv.cpu_milli and node.cpu_used + pod.cpu_milli > inv.cpu_milli:
        return False
    if inv.memory_mib and node.memory_used + pod.memory_mib > inv.memory_mib:
        return False
    count = sum(c.count for c in pod.request.containers)
    if count:
        replicas = sum(u.device.split_count - u.sharers for u in node.gpus)
        if count > replicas:
            return False
        if pod.gpu_models is not None and not any(u.device.model in pod.gpu_models for u in node.gpus):
            return False
    return True


def kube_window(
    state: ClusterState, order: Sequence[str], start: int, pod: PodInfo, wanted: int
) -> tuple[list[str], int]:
    """The nodes kube-scheduler sends the extender for `pod` and where its next walk starts: from `start` along
    `order`, every node it checks until `wanted` pass its filters (`findNodesThatPassFilters`, which checks in
    parallel and may look at a few more); the start moves on by the nodes checked (`schedulePod`:
    `nextStartNodeIndex += processedNodes`)."""
    nodes, total = state.nodes, len(order)
    window: list[str] = []
    checked = 0
    while checked < total and len(window) < wanted:
        name = order[(start + checked) % total]
        checked += 1
        if kube_fits(nodes[name], pod):
            window.append(name)
    return window, (start + checked) % total


def capacity_milli(nodes: Sequence[NodeRow]) -> int:
    return 1000 * sum(n.gpus for n in nodes)


def _pick_best(ev: Evaluation, rank: dict[str, int]) -> str:
    best_name = ""
    best_key = (float("-inf"), 0)
    for name, res in ev.feasible.items():
        key = (res.score, -rank[name])
        if key > best_key:
            best_key, best_name = key, name
    return best_name


def _top_bucket(results: dict[str, NodeResult], mapping: PriorityMapping) -> list[str]:
    prios = to_priorities({n: r.score for n, r in results.items()}, mapping)
    top = max(prios.values())
    return [n for n, p in prios.items() if p == top]


def choose(ev: Evaluation, mode: Mode, rank: dict[str, int], rng: random.Random) -> str | None:
    """The node the pod lands on, or None when nothing is feasible."""
    if not ev.feasible:
        return None
    if mode == "best":
        return _pick_best(ev, rank)
    mapping: PriorityMapping = "minmax" if mode.endswith("-minmax") else "rank"
    top = _top_bucket(ev.feasible, mapping)
    if mode.startswith("narrow") and len(top) > 1:
        top = _top_bucket({n: ev.feasible[n] for n in top}, mapping)
    top.sort(key=rank.__getitem__)  # deterministic per seed, independent of dict order
    return top[rng.randrange(len(top))]


def replay(
    nodes: Sequence[NodeRow],
    pods: Sequence[PodRow],
    policy: str,
    seed: int,
    *,
    mode: Mode = "best",
    pods_limit: int | None = None,
    percentage: int | None = None,
) -> RunResult:
    """Replay one seed of the protocol with `policy` from the registry; pods only arrive, failures are dropped.
    `percentage`: see the module's docstring."""
    started = time.perf_counter()
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    cap = capacity_milli(gpu_nodes)
    seq = arrivals(pods, seed, cap)
    if pods_limit is not None:
        seq = seq[:pods_limit]
    state = ClusterState(PlacementConfig(node_policy=policy, experimental_policies=True))  # experiments are its job
    for node_row in gpu_nodes:
        state.upsert_node(to_inventory(node_row))
    planner = Planner(state)
    pol = planner.policy(policy)
    rank = {name: i for i, name in enumerate(node_order([n.name for n in gpu_nodes], seed))}
    # kube-scheduler's node list: a fixed order of its own (its node tree's), not the seed's tie-break order. Walking
    # windows along the tie-break order would make `best` take each window's first node, spreading the pods.
    kube_order = sorted(rank)
    wanted = None if percentage is None else nodes_to_find(percentage, len(kube_order))
    start = asked = 0
    rng = random.Random(f"ties-{seed}")
    # A policy built on a-priori workload knowledge (fgd, as in the paper) sees the trace up front instead
    # of learning from arrivals; every other policy only ever sees pods as they arrive.
    prior = bool(getattr(pol, "trace_prior", False))
    if prior:
        for j, row in enumerate(sorted(pods, key=lambda p: p.name)):
            pol.observe(to_pod_info(row, f"prior-{j:06d}"))
    out = RunResult(policy=policy, seed=seed, mode=mode, capacity_milli=cap, percentage=percentage)
    arrived = allocated = 0
    for i, row in enumerate(seq):
        pod = to_pod_info(row, f"{i:06d}-{row.name}")
        if not prior:
            pol.observe(pod)
        if wanted is None:
            ev = planner.evaluate(pod)
            asked += len(kube_order)
        else:
            window, start = kube_window(state, kube_order, start, pod, wanted)
            ev = planner.evaluate(pod, window)
            asked += len(window)
        name = choose(ev, mode, rank, rng)
        if name is None:
            out.failed += 1
        else:
            placement = ev.feasible[name].placement
            assert placement is not None
            state.apply(pod.key, placement.assignment(pod), HostUse(pod.cpu_milli, pod.memory_mib))
            allocated += row.gpu_demand_milli
        arrived += row.gpu_demand_milli
        out.arrived.append(arrived)
        out.allocated.append(allocated)
    out.names_per_pod = asked / max(len(seq), 1)
    out.wall_seconds = time.perf_counter() - started
    return out
