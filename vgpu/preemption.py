"""Which slices to evict on one node so a higher-priority pod fits: the cheapest victim set, or None.

The cost of a victim set, compared in this order (smaller is better):
1. how many victims a PodDisruptionBudget protects (a protected pod only when no unprotected set works),
2. the victims' priorities as a multiset, highest first (lowest priority first: three priority-1 pods before
   one priority-2 pod, and a set is cheaper than any superset),
3. the number of victims,
4. the least progress lost: the largest sum of creation times (the youngest pods),
5. the pod keys, so that equal costs are decided the same way every time.

Search: the pod's slices land on whole GPUs, so each GPU's candidate sets are the subsets of its own eligible
holders (all of them up to `EXACT_HOLDERS` per GPU, else the prefixes of the eviction order), kept when the
pod's slice then fits there. A pod needing k GPUs takes one set on each of k GPUs (their union, every
combination of GPUs up to `MAX_COMBINATIONS`). Every choice is confirmed by `vgpu.fit.fit_node` on the node with
the victims removed, so role rules, topology and the kubelet's view hold as at /filter. The cost order is
monotone under union, so for victims holding one GPU each the result is the exhaustive minimum (tests check it
against brute force over every subset of the node's pods).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpu.config import PlacementConfig
from vgpu.fit import FitFailure, GpuRank, NodePlacement, fit_node
from vgpu.pod import PodInfo
from vgpu.priority import Priority
from vgpu.roles import Role
from vgpu.state import GpuUsage, NodeState, slice_blocker

EXACT_HOLDERS = 12  # 4,096 subsets of one GPU's holders; more sharers than this search prefixes only
MAX_COMBINATIONS = 256  # GPU combinations tried for a multi-GPU pod
CANDIDATES_PER_GPU = 4  # sufficient sets per GPU kept for confirmation

Cost = tuple[int, tuple[Priority, ...], int, float, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class VictimFacts:
    """What the choice needs about a pod that holds slices."""

    priority: Priority
    created: float = 0.0  # creationTimestamp, seconds since the epoch: larger = younger = less progress lost
    protected: bool = False  # evicting it would violate a PodDisruptionBudget


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    victims: tuple[str, ...]  # pod keys, in eviction order
    placement: NodePlacement  # where the preemptor fits once they are gone
    cost: Cost


def cost_of(victims: Iterable[str], facts: Mapping[str, VictimFacts]) -> Cost:
    keys = tuple(sorted(victims))
    fs = [facts[k] for k in keys]
    return (
        sum(f.protected for f in fs),
        tuple(sorted((f.priority for f in fs), reverse=True)),
        len(fs),
        -sum(f.created for f in fs),
        keys,
    )


def eligible(node: NodeState, preemptor: Priority, facts: Mapping[str, VictimFacts], exclude: str = "") -> set[str]:
    """Pods on the node the preemptor may evict: known facts and a strictly lower PriorityClass value."""
    return {k for k in node.pods if k != exclude and k in facts and preemptor.may_preempt(facts[k].priority)}


def without(node: NodeState, keys: Iterable[str]) -> NodeState:
    """A copy of the node with these pods' slices gone (host cpu/memory kept: conservative)."""
    gone = set(keys)
    gpus = [_reduced(u, gone) for u in node.gpus]
    pods = {k: a for k, a in node.pods.items() if k not in gone}
    roles: Counter[tuple[Role, str | None]] = Counter((a.role, a.model) for a in pods.values())
    out = NodeState(
        inventory=node.inventory,
        gpus=gpus,
        by_uuid={u.device.uuid: u for u in gpus},
        cpu_used=node.cpu_used,
        memory_used=node.memory_used,
        pods=pods,
        role_models=roles,
        version=-1,
    )
    out.topology_memo = node.topology_memo
    return out


def _reduced(u: GpuUsage, gone: set[str]) -> GpuUsage:
    r = GpuUsage(u.device)
    for h in u.holders:
        if h.pod_key not in gone:
            r.add(h)
    return r


def _subsets(keys: list[str], facts: Mapping[str, VictimFacts]) -> Iterable[tuple[str, ...]]:
    """Non-empty subsets of one GPU's eligible holders: all of them, or eviction-order prefixes past the limit."""
    if len(keys) <= EXACT_HOLDERS:
        for size in range(1, len(keys) + 1):
            yield from itertools.combinations(keys, size)
        return
    order = sorted(keys, key=lambda k: cost_of((k,), facts))
    for size in range(1, len(order) + 1):
        yield tuple(order[:size])


def _gpu_sets(
    node: NodeState, pod: PodInfo, config: PlacementConfig, can_go: set[str], facts: Mapping[str, VictimFacts]
) -> dict[str, list[tuple[Cost, tuple[str, ...]]]]:
    """Per GPU: the cheapest victim sets after which the pod's first slice fits there (empty tuple: fits now)."""
    req = pod.request.containers[0]
    out: dict[str, list[tuple[Cost, tuple[str, ...]]]] = {}
    for u in node.gpus:
        dev = u.device
        mem, cores = req.memory_on(dev.memory_mib), req.cores_on(dev.memory_mib)
        if slice_blocker(u, mem, cores, pod.role, config) is None:
            out[dev.uuid] = [(cost_of((), facts), ())]
            continue
        keys = sorted({h.pod_key for h in u.holders if h.pod_key in can_go})
        found: list[tuple[Cost, tuple[str, ...]]] = []
        for subset in _subsets(keys, facts):
            if slice_blocker(_reduced(u, set(subset)), mem, cores, pod.role, config) is None:
                found.append((cost_of(subset, facts), subset))
        found.sort()
        if found:
            out[dev.uuid] = found[:CANDIDATES_PER_GPU]
    return out


def choose_victims(
    node: NodeState,
    pod: PodInfo,
    config: PlacementConfig,
    rank: GpuRank,
    facts: Mapping[str, VictimFacts],
    preemptor: Priority,
) -> Choice | None:
    """The cheapest set of lower-priority pods on this node whose eviction lets `pod` fit; None when the pod fits
    already (nothing to evict) or no set of them is enough."""
    if not pod.request.containers or isinstance(fit_node(node, pod, config, rank), NodePlacement):
        return None
    can_go = eligible(node, preemptor, facts, exclude=pod.key)
    if not can_go:
        return None
    per_gpu = _gpu_sets(node, pod, config, can_go, facts)
    need = max(c.count for c in pod.request.containers)
    best: Choice | None = None
    tried: set[frozenset[str]] = set()
    for k in range(need, pod.request.total_vgpus + 1):
        best = _best_over(node, pod, config, rank, facts, per_gpu, k, tried, best)
        if best is not None:
            break
    return best


def _best_over(
    node: NodeState,
    pod: PodInfo,
    config: PlacementConfig,
    rank: GpuRank,
    facts: Mapping[str, VictimFacts],
    per_gpu: dict[str, list[tuple[Cost, tuple[str, ...]]]],
    k: int,
    tried: set[frozenset[str]],
    best: Choice | None,
) -> Choice | None:
    if len(per_gpu) < k:
        return best
    options: list[tuple[Cost, frozenset[str]]] = []
    gpus = sorted(per_gpu, key=lambda g: per_gpu[g][0][0])
    for combo in itertools.islice(itertools.combinations(gpus, k), MAX_COMBINATIONS):
        for picks in itertools.product(*(per_gpu[g] for g in combo)):
            union = frozenset(itertools.chain.from_iterable(p[1] for p in picks))
            if union and union not in tried:
                tried.add(union)
                options.append((cost_of(union, facts), union))
    options.sort()
    for cost, union in options:
        if best is not None and best.cost <= cost:
            break
        fit = fit_node(without(node, union), pod, config, rank)
        if isinstance(fit, FitFailure):
            continue
        order = tuple(sorted(union, key=lambda v: cost_of((v,), facts)))
        return Choice(node.name, order, fit, cost)
    return best
