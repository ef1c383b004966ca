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


def _masks(keys: list[str], facts: Mapping[str, VictimFacts]) -> tuple[list[str], list[int]]:
    """The holders in eviction order and the subsets (bitmasks over them) to consider, fewest members first: every
    subset up to `EXACT_HOLDERS` holders, else the prefixes of the eviction order."""
    order = sorted(keys, key=lambda k: cost_of((k,), facts))
    n = len(order)
    if n <= EXACT_HOLDERS:
        return order, sorted(range(1, 1 << n), key=int.bit_count)
    return order, [(1 << size) - 1 for size in range(1, n + 1)]


def _gpu_sets(
    node: NodeState, pod: PodInfo, config: PlacementConfig, can_go: set[str], facts: Mapping[str, VictimFacts]
) -> dict[str, list[tuple[Cost, tuple[str, ...]]]]:
    """Per GPU: the cheapest victim sets after which the pod's first slice fits there (empty tuple: fits now).

    A superset of a set that works never costs less, so only sets none of whose subsets worked are checked, and
    the arithmetic (memory, SMs, sharers freed) screens them before the full rule check (`slice_blocker`)."""
    req = pod.request.containers[0]
    out: dict[str, list[tuple[Cost, tuple[str, ...]]]] = {}
    for u in node.gpus:
        dev = u.device
        mem, cores = req.memory_on(dev.memory_mib), req.cores_on(dev.memory_mib)
        if slice_blocker(u, mem, cores, pod.role, config) is None:
            out[dev.uuid] = [(cost_of((), facts), ())]
            continue
        held: dict[str, list[int]] = {}
        for h in u.holders:
            if h.pod_key in can_go:
                e = held.setdefault(h.pod_key, [0, 0, 0])
                e[0] += h.memory_mib
                e[1] += h.cores
                e[2] += 1
        if not held:
            continue
        order, masks = _masks(list(held), facts)
        mem_need = u.memory_used + mem - int(dev.memory_mib * config.memory_scaling)
        core_need = u.cores_used + cores - int(dev.cores * config.core_scaling)
        share_need = u.sharers + 1 - dev.split_count
        found: list[tuple[Cost, tuple[str, ...]]] = []
        worked: list[int] = []
        vals = [held[k] for k in order]
        freed: dict[int, tuple[int, int, int]] = {0: (0, 0, 0)}
        for mask in masks:
            low = mask & -mask
            rest = freed.get(mask ^ low)
            v = vals[low.bit_length() - 1]
            if rest is None:  # a prefix mask whose parent was not enumerated
                rest = (0, 0, 0)
                for i in range(low.bit_length(), len(order)):
                    if mask >> i & 1:
                        w = vals[i]
                        rest = (rest[0] + w[0], rest[1] + w[1], rest[2] + w[2])
            f = freed[mask] = (rest[0] + v[0], rest[1] + v[1], rest[2] + v[2])
            if f[0] < mem_need or f[1] < core_need or f[2] < share_need:
                continue
            if any(w & mask == w for w in worked):
                continue
            members = [order[i] for i in range(len(order)) if mask >> i & 1]
            if slice_blocker(_reduced(u, set(members)), mem, cores, pod.role, config) is None:
                worked.append(mask)
                found.append((cost_of(members, facts), tuple(members)))
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
    gpus = sorted(per_gpu, key=lambda g: per_gpu[g][0][0])
    # Each GPU's cheapest set first; its runners-up only when no combination of the cheapest ones is confirmed.
    for width in (1, CANDIDATES_PER_GPU) if k > 1 else (CANDIDATES_PER_GPU,):
        options: list[tuple[Cost, frozenset[str]]] = []
        for combo in itertools.islice(itertools.combinations(gpus, k), MAX_COMBINATIONS):
            for picks in itertools.product(*(per_gpu[g][:width] for g in combo)):
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
