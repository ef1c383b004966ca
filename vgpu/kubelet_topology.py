"""The kubelet's Topology Manager and device manager rules, as written in k8s.io/kubernetes v1.34.4, and what
they mean for the GPUs a container of ours can get (docs/device-plugin.md, "Topology Manager agreement").

The kubelet never sees our assignment: it sees `count` interchangeable replicas `<uuid>::<n>` with the NUMA
node(s) the plugin advertises for each. Its choice of NUMA node for a container depends only on how many
replicas are free on each NUMA node, and on a tie it takes the lowest NUMA node. It then offers
GetPreferredAllocation only the replicas on that NUMA node — so an assignment on another NUMA node cannot be
served, whatever the plugin answers. This module reproduces those rules (pure, no I/O) so that the extender
assigns only GPU sets the kubelet will offer, and refuses before binding what the kubelet would refuse.

Sources (k8s.io/kubernetes@v1.34.4), each function names the one it follows:
  pkg/kubelet/cm/devicemanager/topology_hints.go  GetTopologyHints, GetPodTopologyHints,
                                                   generateDeviceTopologyHints, deviceHasTopologyAlignment
  pkg/kubelet/cm/devicemanager/manager.go         devicesToAllocate, filterByAffinity
  pkg/kubelet/cm/topologymanager/policy.go        filterProvidersHints, mergePermutation, HintMerger
  pkg/kubelet/cm/topologymanager/policy_{none,best_effort,restricted,single_numa_node}.go
  pkg/kubelet/cm/topologymanager/bitmask/bitmask.go IterateBitMasks, IsNarrowerThan, IsLessThan
Other hint providers (CPU manager `static` with a Guaranteed pod, memory manager) are inputs the model
takes; the extender cannot see their state and passes none ("no preference").
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from vgpu.errors import CodecError

Policy = Literal["none", "best-effort", "restricted", "single-numa-node"]
Scope = Literal["container", "pod"]
POLICIES: tuple[Policy, ...] = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES: tuple[Scope, ...] = ("container", "pod")
Mask = frozenset[int]


@dataclass(frozen=True, slots=True)
class NodePolicy:
    """What the node inventory says about the node's kubelet (written by the device plugin).

    `numa_advertised`: whether the plugin sends each replica's NUMA node in ListAndWatch (TopologyInfo);
    without it the device manager has no topology preference and offers every free replica.
    `numa_nodes`: the machine's NUMA nodes as the kubelet counts them (cadvisor); empty = the GPUs' ones.
    """

    policy: Policy = "none"
    scope: Scope = "container"
    numa_advertised: bool = True
    numa_nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"topology manager policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.scope not in SCOPES:
            raise ValueError(f"topology manager scope {self.scope!r} is not one of {', '.join(SCOPES)}")
        if any(n < 0 or n > 63 for n in self.numa_nodes):
            raise ValueError(f"NUMA node ids must be 0..63 (the kubelet's bitmask), got {list(self.numa_nodes)}")

    @property
    def narrows(self) -> bool:
        """Whether the kubelet can narrow which replicas it offers (a policy other than none, NUMA advertised)."""
        return self.policy != "none" and self.numa_advertised


# --- in the node inventory annotation ------------------------------------------------------------------

FIELD = "kubelet"  # the inventory annotation's field for NodePolicy (docs/device-plugin.md)


def policy_to_obj(p: NodePolicy) -> dict[str, Any]:
    return {"policy": p.policy, "scope": p.scope, "numaAdvertised": p.numa_advertised, "numaNodes": list(p.numa_nodes)}


def with_policy(inventory: str, p: NodePolicy | None) -> str:
    """The inventory annotation value (vgpu.annotations.encode_inventory) with the `kubelet` field added."""
    if p is None:
        return inventory
    obj = json.loads(inventory)
    obj[FIELD] = policy_to_obj(p)
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def policy_of(inventory: str) -> NodePolicy | None:
    """The `kubelet` field of an inventory annotation value; None when absent (an older plugin: the
    extender then assumes policy none, as before). CodecError names what is wrong."""
    from vgpu.annotations import NODE_INVENTORY as key  # here: vgpu.annotations imports vgpu.devices, which imports us

    try:
        obj = json.loads(inventory)
    except json.JSONDecodeError:
        return None  # vgpu.annotations.decode_inventory reports it
    raw = obj.get(FIELD) if isinstance(obj, dict) else None
    if raw is None:
        return None
    where = f"field {FIELD!r}"
    if not isinstance(raw, dict):
        raise CodecError(key=key, reason=f"{where} must be an object")
    nodes = raw.get("numaNodes", [])
    advertised = raw.get("numaAdvertised", True)
    if not isinstance(nodes, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes):
        raise CodecError(key=key, reason=f"{where}: numaNodes must be a list of NUMA node ids")
    if not isinstance(advertised, bool):
        raise CodecError(key=key, reason=f"{where}: numaAdvertised must be true or false")
    try:
        return NodePolicy(
            policy=raw.get("policy", "none"), scope=raw.get("scope", "container"),
            numa_advertised=advertised, numa_nodes=tuple(nodes),
        )  # fmt: skip
    except ValueError as exc:
        raise CodecError(key=key, reason=f"{where}: {exc}") from None


def advertises_numa(policy: Policy, mode: Literal["auto", "always", "never"]) -> bool:
    """The device plugin's choice (docs/device-plugin.md): under `auto`, NUMA is advertised except under
    best-effort — there it would only move pods to the lowest NUMA node and refuse the rest, never align more
    than the CPU manager does on its own; restricted and single-numa-node keep it, and the extender follows."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return policy != "best-effort"


# --- bitmask.go --------------------------------------------------------------------------------------


def mask_value(mask: Mask) -> int:
    return sum(1 << n for n in mask)


def is_narrower(a: Mask, b: Mask) -> bool:
    """bitMask.IsNarrowerThan: fewer bits, or as many and a smaller integer value (lower NUMA nodes)."""
    if len(a) == len(b):
        return mask_value(a) < mask_value(b)
    return len(a) < len(b)


def iterate_masks(nodes: Sequence[int]) -> list[Mask]:
    """bitmask.IterateBitMasks: every non-empty subset, by size, then in combination order."""
    return [frozenset(c) for k in range(1, len(nodes) + 1) for c in itertools.combinations(nodes, k)]


def show(mask: Mask | None) -> str:
    return "any" if mask is None else "{" + ",".join(str(n) for n in sorted(mask)) + "}"


# --- topology hints -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hint:
    """topologymanager.TopologyHint; `mask` None is the kubelet's nil affinity ("any NUMA node")."""

    mask: Mask | None
    preferred: bool

    def __str__(self) -> str:
        return f"{show(self.mask)}{'' if self.preferred else ' (not preferred)'}"


def device_hints(
    topology: Mapping[str, Mask], available: Set[str], request: int, numa_nodes: Sequence[int]
) -> list[Hint] | None:
    """GetTopologyHints for one resource: None when no device has topology (no preference), [] when fewer
    than `request` devices are free, else generateDeviceTopologyHints. `topology`: every device the plugin
    advertises (healthy or not) and its NUMA nodes; `available`: the free healthy ones."""
    if not any(topology.values()):
        return None
    if len(available) < request:
        return []
    min_affinity = len(numa_nodes)
    hints: list[Hint] = []
    for mask in iterate_masks(numa_nodes):
        in_mask = sum(1 for nodes in topology.values() if nodes & mask)
        if in_mask >= request and len(mask) < min_affinity:
            min_affinity = len(mask)
        if sum(1 for d in available if topology[d] & mask) >= request:
            hints.append(Hint(mask, False))
    return [Hint(h.mask, h.mask is not None and len(h.mask) == min_affinity) for h in hints]


# --- policy.go ----------------------------------------------------------------------------------------


def _filter_providers(providers: Sequence[list[Hint] | None]) -> list[list[Hint]]:
    """filterProvidersHints: no preference -> one preferred any-NUMA hint; no possible hint -> one
    non-preferred any-NUMA hint."""
    out: list[list[Hint]] = []
    for hints in providers:
        if hints is None:
            out.append([Hint(None, True)])
        elif not hints:
            out.append([Hint(None, False)])
        else:
            out.append(list(hints))
    return out


def _merge_permutation(default: Mask, permutation: Sequence[Hint]) -> Hint:
    preferred = True
    masks: list[Mask] = []
    for h in permutation:
        if h.mask is not None:
            masks.append(h.mask)
            if h.mask != masks[0]:
                preferred = False
        if not h.preferred:
            preferred = False
    merged = default
    for m in masks:
        merged = merged & m
    return Hint(merged, preferred)


def _narrowest(hints: Sequence[Hint]) -> Hint | None:
    best: Hint | None = None
    for h in hints:
        if h.mask is None:
            continue
        if best is None or (best.mask is not None and is_narrower(h.mask, best.mask)):
            best = h
    return best


def _best_non_preferred_count(hints: Sequence[Sequence[Hint]]) -> int:
    """maxOfMinAffinityCounts."""
    best = 0
    for resource in hints:
        n = _narrowest(resource)
        if n is not None and n.mask is not None:
            best = max(best, len(n.mask))
    return best


def _fitter(current: Hint, candidate: Hint) -> Hint:
    """compareNUMAAffinityMasks without prefer-closest-numa-nodes: the narrower mask, current on equality."""
    assert current.mask is not None and candidate.mask is not None
    if candidate.mask == current.mask:
        return current
    return current if is_narrower(current.mask, candidate.mask) else candidate


def _compare(current: Hint | None, candidate: Hint, best_count: int) -> Hint | None:
    """HintMerger.compare, case by case as in policy.go."""
    assert candidate.mask is not None
    if len(candidate.mask) == 0:
        return current
    if current is None:
        return candidate
    assert current.mask is not None
    if not current.preferred and candidate.preferred:
        return candidate
    if current.preferred and not candidate.preferred:
        return current
    if current.preferred and candidate.preferred:
        return _fitter(current, candidate)
    cur, cand = len(current.mask), len(candidate.mask)
    if cur > best_count:
        return _fitter(current, candidate)
    if cur == best_count:
        return current if cand != best_count else _fitter(current, candidate)
    if cand > best_count:
        return current
    if cand == best_count:
        return candidate
    if cand > cur:
        return candidate
    if cand < cur:
        return current
    return _fitter(current, candidate)


def _merge(hints: list[list[Hint]], numa_nodes: Sequence[int]) -> Hint:
    """HintMerger.Merge over every permutation of the providers' hints."""
    default = frozenset(numa_nodes)
    best_count = _best_non_preferred_count(hints)
    best: Hint | None = None
    for permutation in itertools.product(*hints):
        best = _compare(best, _merge_permutation(default, permutation), best_count)
    return best if best is not None else Hint(default, False)


def merge(policy: Policy, providers: Sequence[list[Hint] | None], numa_nodes: Sequence[int]) -> tuple[Hint, bool]:
    """Policy.Merge: the container's (or pod's) affinity and whether the policy admits it."""
    if policy == "none":
        return Hint(None, False), True
    filtered = _filter_providers(providers)
    if policy == "single-numa-node":
        filtered = [
            [h for h in r if h.preferred and (h.mask is None or len(h.mask) == 1)] for r in filtered
        ]  # filterSingleNumaHints
        best = _merge(filtered, numa_nodes)
        if best.mask == frozenset(numa_nodes):
            best = Hint(None, best.preferred)
        return best, best.preferred
    best = _merge(filtered, numa_nodes)
    return best, policy == "best-effort" or best.preferred


# --- devicesToAllocate ---------------------------------------------------------------------------------

Preferred = Callable[[list[str], list[str], int], list[str]]


@dataclass(frozen=True, slots=True)
class Allocation:
    """What devicesToAllocate did for one container: the replicas chosen, what it offered the plugin's
    GetPreferredAllocation (None: not asked), and which replicas it took without the plugin's say
    (`forced`: the aligned set taken whole; `fallback`: picked in Go map order, i.e. any of them)."""

    chosen: tuple[str, ...]
    offered: tuple[str, ...] | None
    must_include: tuple[str, ...] = ()
    forced: tuple[str, ...] = ()
    fallback: tuple[str, ...] = ()


def filter_by_affinity(
    topology: Mapping[str, Mask], available: Iterable[str], hint: Mask | None
) -> tuple[list[str], list[str], list[str]]:
    """filterByAffinity: (aligned, unaligned, no affinity). A device on several NUMA nodes is aligned as soon
    as one of them is in the hint."""
    avail = sorted(available)
    if hint is None or not any(topology.values()):
        return [], [], avail
    aligned = [d for d in avail if topology[d] & hint]
    unaligned = [d for d in avail if topology[d] and not topology[d] & hint]
    none = [d for d in avail if not topology[d]]
    return aligned, unaligned, none


def devices_to_allocate(
    topology: Mapping[str, Mask], available: Set[str], needed: int, hint: Mask | None, preferred: Preferred
) -> Allocation:
    """devicesToAllocate for a first allocation (nothing reused or already held by the container)."""
    if len(available) < needed:
        raise ValueError(f"requested number of devices unavailable: requested {needed}, available {len(available)}")
    chosen: list[str] = []
    forced: list[str] = []
    fallback: list[str] = []

    def take(devices: Iterable[str], into: list[str] | None = None) -> bool:
        for d in devices:
            if len(chosen) == needed:
                break
            if d not in chosen:
                chosen.append(d)
                if into is not None:
                    into.append(d)
        return len(chosen) == needed

    aligned, unaligned, none = filter_by_affinity(topology, available, hint)
    if needed < len(aligned):
        offered = tuple(aligned)
        answer = preferred(list(offered), [], needed)
        if take(d for d in answer if d in aligned) or take(aligned, fallback):
            return Allocation(tuple(chosen), offered, (), (), tuple(fallback))
        raise AssertionError("unreachable: aligned holds more than needed")
    if take(aligned, forced):
        return Allocation(tuple(chosen), None, (), tuple(forced))
    offered = tuple(sorted(available))
    must = tuple(chosen)
    answer = preferred(list(offered), list(must), needed)
    if take(d for d in answer if d in available):
        return Allocation(tuple(chosen), offered, must, tuple(forced))
    take(unaligned, fallback) or take(none, fallback)
    return Allocation(tuple(chosen), offered, must, tuple(forced), tuple(fallback))


# --- what the extender needs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuReplicas:
    """One GPU as the kubelet sees it: `total` replicas advertised, `free` of them healthy and unallocated."""

    uuid: str
    numa: int | None
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class Offer:
    """The GPUs the kubelet will let one container have.

    `refusal`: the kubelet (or its fallback) cannot give this container distinct GPUs we choose - the
    extender refuses the node with it. Otherwise a GPU set is served iff it lies in `allowed` (None: any)
    and contains `required` (replicas the kubelet takes before asking the plugin)."""

    hint: Hint
    allowed: frozenset[str] | None = None
    required: frozenset[str] = frozenset()
    refusal: str | None = None
    note: str = ""

    @property
    def why(self) -> str:
        """A GPU left out because the kubelet will not offer it, as vgpu.fit lists blocked GPUs."""
        return f"not offered by the kubelet: {self.note}"

    def allows(self, uuid: str) -> bool:
        return self.refusal is None and (self.allowed is None or uuid in self.allowed)

    def problem(self, chosen: Iterable[str]) -> str | None:
        """Why a chosen GPU set would not be served, or None."""
        got = set(chosen)
        if self.refusal is not None:
            return self.refusal
        if self.allowed is not None and not got <= self.allowed:
            return f"{self.note}; GPUs {sorted(got - self.allowed)} would not be offered"
        if not self.required <= got:
            return f"{self.note}; it takes a replica of each of {sorted(self.required)} before asking the plugin"
        return None


def _replica_view(gpus: Sequence[GpuReplicas]) -> tuple[dict[str, Mask], set[str], dict[str, str]]:
    topology: dict[str, Mask] = {}
    available: set[str] = set()
    owner: dict[str, str] = {}
    for g in gpus:
        nodes: Mask = frozenset() if g.numa is None else frozenset({g.numa})
        for n in range(g.total):
            rid = f"{g.uuid}::{n}"
            topology[rid] = nodes
            owner[rid] = g.uuid
            if n < g.free:
                available.add(rid)
    return topology, available, owner


def node_numa(node: NodePolicy, gpus: Sequence[GpuReplicas]) -> tuple[int, ...]:
    if node.numa_nodes:
        return node.numa_nodes
    return tuple(sorted({g.numa for g in gpus if g.numa is not None}))


def _per_numa(gpus: Sequence[GpuReplicas]) -> str:
    free: dict[int | None, int] = {}
    for g in gpus:
        free[g.numa] = free.get(g.numa, 0) + g.free
    return ", ".join(f"NUMA {'?' if n is None else n}: {c}" for n, c in sorted(free.items(), key=lambda t: t[0] or 0))


def container_offer(
    node: NodePolicy,
    gpus: Sequence[GpuReplicas],
    count: int,
    *,
    hint_gpus: Sequence[GpuReplicas] | None = None,
    hint_count: int | None = None,
) -> Offer | None:
    """What the kubelet will offer a container asking `count` vGPUs on this node now; None when it offers
    every free replica (policy none, or no NUMA advertised). `hint_gpus`, `hint_count`: the state and request
    the hint is computed for (under the pod scope: the pod's total, before its first container)."""
    if not node.narrows or count < 1:
        return None
    numa_nodes = node_numa(node, gpus)
    if not numa_nodes:
        return None
    topology, available, owner = _replica_view(gpus)
    if hint_gpus is None:
        hints = device_hints(topology, available, hint_count or count, numa_nodes)
    else:
        h_topology, h_available, _ = _replica_view(hint_gpus)
        hints = device_hints(h_topology, h_available, hint_count or count, numa_nodes)
    hint, admit = merge(node.policy, [hints], numa_nodes)
    what = f"the kubelet's Topology Manager ({node.policy}, {node.scope} scope)"
    if not admit:
        return Offer(
            hint,
            refusal=f"{what} would refuse {hint_count or count} vGPU(s): no preferred NUMA alignment "
            f"(hints {', '.join(map(str, hints or [])) or 'none'}; free replicas {_per_numa(gpus)})",
        )
    aligned, _, _ = filter_by_affinity(topology, available, hint.mask)
    if hint.mask is None or not aligned:
        return Offer(hint)
    on = f"{what} aligns this container to NUMA {show(hint.mask)} (free replicas {_per_numa(gpus)})"
    if count < len(aligned):
        return Offer(
            hint, allowed=frozenset(owner[d] for d in aligned), note=f"{on}, where it offers only its replicas"
        )
    per_gpu: dict[str, int] = {}
    for d in aligned:
        per_gpu[owner[d]] = per_gpu.get(owner[d], 0) + 1
    doubled = sorted(u for u, n in per_gpu.items() if n > 1)
    if doubled:
        return Offer(
            hint,
            refusal=f"{on} and takes all {len(aligned)} free replicas there before asking the plugin: "
            f"two vGPUs of one container on GPU {doubled[0]}",
        )
    required = frozenset(per_gpu)
    outside = frozenset(g.uuid for g in gpus if g.free > 0)
    return Offer(hint, allowed=outside, required=required, note=f"{on} and takes all {len(aligned)} free there first")


@dataclass(frozen=True, slots=True)
class Admission:
    """The kubelet's verdict on one pod, container by container (the model of the whole admission)."""

    admitted: bool
    reason: str = ""
    hints: dict[str, Hint] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)


def admit_pod(
    node: NodePolicy,
    gpus: Sequence[GpuReplicas],
    containers: Sequence[tuple[str, int]],
    preferred: Callable[[str], Preferred],
    *,
    other_providers: Sequence[list[Hint] | None] = (),
) -> Admission:
    """Topology Manager admission then devicesToAllocate for each container in order (containerScope.Admit /
    podScope.Admit), with the plugin's GetPreferredAllocation `preferred(container)`. Replicas chosen for a
    container are no longer free for the next. Returns which replicas each container got."""
    numa_nodes = node_numa(node, gpus)
    topology, available, _ = _replica_view(gpus)
    if not node.numa_advertised:
        topology = {d: frozenset() for d in topology}
    hints: dict[str, Hint] = {}
    allocations: dict[str, Allocation] = {}
    pod_hint: Hint | None = None
    if node.scope == "pod" and node.policy != "none":
        total = sum(n for _, n in containers)
        pod_hint, ok = merge(
            node.policy, [device_hints(topology, available, total, numa_nodes), *other_providers], numa_nodes
        )
        if not ok:
            return Admission(False, f"TopologyAffinityError: pod hint {pod_hint}", {"<pod>": pod_hint})
    for name, count in containers:
        if pod_hint is not None:
            hint = pod_hint
        else:
            hint, ok = merge(
                node.policy, [device_hints(topology, available, count, numa_nodes), *other_providers], numa_nodes
            )
            if not ok:
                hints[name] = hint
                return Admission(False, f"TopologyAffinityError: container {name} hint {hint}", hints, allocations)
        hints[name] = hint
        if len(available) < count:
            return Admission(False, f"requested number of devices unavailable for container {name}", hints, allocations)
        alloc = devices_to_allocate(topology, available, count, hint.mask, preferred(name))
        allocations[name] = alloc
        available -= set(alloc.chosen)
    return Admission(True, "", hints, allocations)


# --- the extender's hook (vgpu.fit) ------------------------------------------------------------------


class _Device(Protocol):
    @property
    def uuid(self) -> str: ...
    @property
    def numa(self) -> int | None: ...
    @property
    def split_count(self) -> int: ...
    @property
    def healthy(self) -> bool: ...


class _Usage(Protocol):
    @property
    def device(self) -> _Device: ...
    @property
    def sharers(self) -> int: ...


def replicas_of(usages: Iterable[_Usage], extra_sharers: Mapping[str, Sequence[int]]) -> list[GpuReplicas]:
    """The kubelet's view of a node's GPUs: every replica advertised, the unheld ones of healthy GPUs free.
    `extra_sharers`: slices placed by earlier containers of the pod being fitted (index 2, as vgpu.fit)."""
    out = []
    for u in usages:
        d = u.device
        held = u.sharers + (extra_sharers[d.uuid][2] if d.uuid in extra_sharers else 0)
        out.append(GpuReplicas(d.uuid, d.numa, d.split_count, max(0, d.split_count - held) if d.healthy else 0))
    return out


class _Request(Protocol):
    @property
    def count(self) -> int: ...


class _PodRequest(Protocol):
    @property
    def containers(self) -> Sequence[_Request]: ...


def fit_offer(
    node: NodePolicy,
    usages: Sequence[_Usage],
    extra_sharers: Mapping[str, Sequence[int]],
    request: _Request,
    pod: _PodRequest,
) -> Offer | None:
    """vgpu.fit's hook: the Offer for the container asking `request` (None: the kubelet offers every free
    replica). Under the pod scope the hint is the pod's, computed before any of its containers is placed."""
    if not node.narrows:
        return None
    now = replicas_of(usages, extra_sharers)
    if node.scope != "pod":
        return container_offer(node, now, request.count)
    total = sum(r.count for r in pod.containers)
    return container_offer(node, now, request.count, hint_gpus=replicas_of(usages, {}), hint_count=total)
