"""In-memory cluster state: GPU usage per node, built from inventories and applied assignments.

`ClusterState.apply` checks every slice of an assignment against the hard limits before changing
anything, so a failed apply leaves the state exactly as it was and no GPU ever goes over its memory,
SM quota or split count.
"""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from vgpu.annotations import Assignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.errors import CapacityError
from vgpu.roles import Role
from vgpu.topology import NodeTopology, node_topology


@dataclass(slots=True)
class Holder:
    pod_key: str
    role: Role
    model: str | None
    memory_mib: int
    cores: int


_INTERNED: dict[tuple[object, ...], int] = {}
_NUMBERS = itertools.count(1)
_INTERN_LIMIT = 1 << 18


def intern(key: tuple[object, ...]) -> int:
    """A number for a hashable key, the same for equal keys until the table is full and starts over; numbers are
    never handed out twice, so equal numbers always mean equal keys (a restart only costs sharing, never a wrong
    match). A process-wide memo like `functools.lru_cache`."""
    n = _INTERNED.get(key)
    if n is None:
        if len(_INTERNED) >= _INTERN_LIMIT:
            _INTERNED.clear()
        n = _INTERNED[key] = next(_NUMBERS)
    return n


@dataclass(slots=True)
class GpuUsage:
    device: GpuDevice
    memory_used: int = 0
    cores_used: int = 0
    holders: list[Holder] = field(default_factory=list)
    prefill: int = 0
    decode: int = 0
    best_effort: int = 0
    # Cache of `state_key` and `state_id` (reset by `add` and `remove`, the only ways the usage changes).
    key_memo: tuple[object, ...] | None = field(default=None, repr=False, compare=False)
    id_memo: int | None = field(default=None, repr=False, compare=False)

    @property
    def state_key(self) -> tuple[object, ...]:
        """Everything about this GPU that whether (and how well, by role) one more slice fits on it depends on:
        GPUs with equal keys answer `slice_blocker` and `vgpu.fit.role_rank` alike, so a pod shape's evaluation
        asks once per distinct key instead of once per GPU (vgpu.fit). Holders in order: the decode demand is a
        float sum in that order."""
        key = self.key_memo
        if key is None:
            d = self.device
            holders = tuple((h.role.value, h.model, h.cores) for h in self.holders)
            key = self.key_memo = (d.memory_mib, d.cores, d.split_count, self.memory_used, self.cores_used, holders)
        return key

    @property
    def state_id(self) -> int:
        """A number for `state_key`: equal keys get equal numbers while the key is known, a number never stands for
        another key (`intern`), so the per-shape memos compare one int, not nested tuples."""
        i = self.id_memo
        if i is None:
            i = self.id_memo = intern(self.state_key)
        return i

    @property
    def sharers(self) -> int:
        return len(self.holders)

    @property
    def memory_free(self) -> int:
        return self.device.memory_mib - self.memory_used

    @property
    def used_share(self) -> float:
        """Fraction of the GPU reserved, the larger of memory and SMs."""
        d = self.device
        return max(self.memory_used / d.memory_mib, self.cores_used / d.cores)

    def add(self, h: Holder) -> None:
        self.key_memo = self.id_memo = None
        self.holders.append(h)
        self.memory_used += h.memory_mib
        self.cores_used += h.cores
        self.prefill += h.role.does_prefill
        self.decode += h.role.does_decode
        self.best_effort += h.cores == 0

    def remove(self, pod_key: str) -> None:
        self.key_memo = self.id_memo = None
        keep: list[Holder] = []
        for h in self.holders:
            if h.pod_key != pod_key:
                keep.append(h)
                continue
            self.memory_used -= h.memory_mib
            self.cores_used -= h.cores
            self.prefill -= h.role.does_prefill
            self.decode -= h.role.does_decode
            self.best_effort -= h.cores == 0
        self.holders = keep


def slice_blocker(
    u: GpuUsage,
    memory_mib: int,
    cores: int,
    role: Role,
    config: PlacementConfig,
    *,
    extra_memory: int = 0,
    extra_cores: int = 0,
    extra_sharers: int = 0,
    extra_best_effort: int = 0,
) -> str | None:
    """Why one more slice cannot go on this GPU (None = it can). `extra_*` count slices of the
    same pod already tentatively placed on it (they share the pod's role)."""
    d = u.device
    rules = config.roles
    if u.sharers + extra_sharers + 1 > d.split_count:
        return "split"
    if u.memory_used + extra_memory + memory_mib > int(d.memory_mib * config.memory_scaling):
        return "memory"
    cap = int(d.cores * config.core_scaling)
    prefill_here = role.does_prefill or u.prefill > 0
    if rules.protect_prefill_sms and prefill_here:
        cap = min(cap, d.cores)
        if (u.sharers + extra_sharers) > 0 and (cores == 0 or u.best_effort + extra_best_effort > 0):
            return "prefill-sm"
    want = u.cores_used + extra_cores + cores
    if want > cap:
        return "prefill-sm" if prefill_here and want <= int(d.cores * config.core_scaling) else "cores"
    if role.does_decode:
        limit = rules.max_decode_per_gpu
        if limit is not None and u.decode + extra_sharers + 1 > limit:
            return "decode-bandwidth"
        budget = rules.decode_bandwidth_budget
        if budget is not None:
            demand = sum(rules.decode_demand(h.cores) for h in u.holders if h.role.does_decode)
            demand += (extra_sharers + 1) * rules.decode_demand(cores)
            if demand > budget + 1e-9:
                return "decode-bandwidth"
    return None


def _blocker(node: NodeState, assignment: Assignment, config: PlacementConfig) -> str | None:
    """Why this assignment cannot go on `node` now (None = it can): `ClusterState.check` on a given node."""
    extra: dict[str, list[int]] = {}
    for c in assignment.containers:
        for s in c.devices:
            u = node.by_uuid.get(s.uuid)
            if u is None:
                return f"GPU {s.uuid} is not on node {assignment.node}"
            e = extra.setdefault(s.uuid, [0, 0, 0, 0])
            reason = slice_blocker(
                u,
                s.memory_mib,
                s.cores,
                assignment.role,
                config,
                extra_memory=e[0],
                extra_cores=e[1],
                extra_sharers=e[2],
                extra_best_effort=e[3],
            )
            if reason is not None:
                return (
                    f"GPU {u.device.index} ({s.uuid}) on {assignment.node}: {reason} "
                    f"(memory {u.memory_used + e[0]}+{s.memory_mib}/{u.device.memory_mib} MiB, "
                    f"cores {u.cores_used + e[1]}+{s.cores}/{u.device.cores}, "
                    f"sharers {u.sharers + e[2]}/{u.device.split_count})"
                )
            e[0] += s.memory_mib
            e[1] += s.cores
            e[2] += 1
            e[3] += s.cores == 0
    return None


@dataclass(slots=True)
class NodeState:
    inventory: NodeInventory
    gpus: list[GpuUsage]
    by_uuid: dict[str, GpuUsage]
    cpu_used: int = 0
    memory_used: int = 0
    pods: dict[str, Assignment] = field(default_factory=dict)
    role_models: Counter[tuple[Role, str | None]] = field(default_factory=Counter)
    version: int = 0
    # Cache of `vgpu.placement.gpushare.node_frees` for `version` (placement scores read it per node
    # evaluation, the state only changes at a new version).
    frees_memo: tuple[int, tuple[int, ...]] | None = field(default=None, repr=False, compare=False)
    topology_memo: NodeTopology | None = field(default=None, repr=False, compare=False)
    # Each GPU's position in `gpus`, by UUID (fixed for a NodeState, like its inventory).
    positions_memo: dict[str, int] | None = field(default=None, repr=False, compare=False)
    healthy_memo: bool | None = field(default=None, repr=False, compare=False)
    groups_memo: tuple[int, tuple[GpuUsage, ...]] | None = field(default=None, repr=False, compare=False)
    # Cache of `vgpu.placement.role_score.free_after`'s per-GPU terms for `version`.
    free_terms_memo: tuple[int, tuple[float, ...]] | None = field(default=None, repr=False, compare=False)
    # Cache of `class_key` for `version`, with the first GPU (in `gpus` order) of each distinct GPU state.
    class_memo: tuple[int, int, dict[int, GpuUsage]] | None = field(default=None, repr=False, compare=False)
    static_memo: tuple[object, ...] | None = field(default=None, repr=False, compare=False)
    models_memo: tuple[int, frozenset[str | None]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, inventory: NodeInventory) -> NodeState:
        gpus = [GpuUsage(g) for g in sorted(inventory.gpus, key=lambda g: g.index)]
        return cls(inventory=inventory, gpus=gpus, by_uuid={g.device.uuid: g for g in gpus})

    @property
    def name(self) -> str:
        return self.inventory.name

    @property
    def topology(self) -> NodeTopology:
        """NVLink cliques and NUMA nodes of the GPUs (vgpu.topology): once per inventory, which never changes
        for a NodeState (a new inventory makes a new one)."""
        topo = self.topology_memo
        if topo is None:
            topo = self.topology_memo = node_topology(self.inventory.gpus)
        return topo

    @property
    def state_groups(self) -> tuple[GpuUsage, ...]:
        """The first GPU (in `gpus` order) of each distinct `GpuUsage.state_key`, for the current version."""
        memo = self.groups_memo
        if memo is None or memo[0] != self.version:
            self._classify()
            memo = self.groups_memo
            assert memo is not None
        return memo[1]

    @property
    def class_key(self) -> int:
        """A number (`intern`) for what a fit and the fgd-family score read of this node, without GPU indices or UUIDs:
        nodes with equal keys decide alike up to which GPUs of the chosen states are named (vgpu.planner's node classes).

        The multiset of GPU states (`GpuUsage.state_id` and how many GPUs are in each), the host's capacity and use,
        the first GPU's model and size (the fragmentation model reads them), whether a kubelet offer, a cordon, an
        unhealthy GPU, NVLink or GPUs on several NUMA nodes are there (each turns the shared path off or changes it:
        `vgpu.topology.choose` picks a multi-GPU set by NUMA node), and the (role, model) pairs
        of the pods held (the role score's locality)."""
        memo = self.class_memo
        if memo is None or memo[0] != self.version:
            memo = self._classify()
        return memo[1]

    @property
    def first_of_state(self) -> dict[int, GpuUsage]:
        """The first GPU (in `gpus` order) of each distinct `GpuUsage.state_id`, by id, for the current version."""
        memo = self.class_memo
        if memo is None or memo[0] != self.version:
            memo = self._classify()
        return memo[2]

    def classified(self) -> tuple[int, int, dict[int, GpuUsage]]:
        """(version, `class_key`, `first_of_state`) at once, for the current version."""
        memo = self.class_memo
        if memo is None or memo[0] != self.version:
            memo = self._classify()
        return memo

    @property
    def models(self) -> frozenset[str | None]:
        """Every model the node's pods run, on a GPU or not (`role_models`, each GPU holder's): what a pod's evaluation
        compares its own model with (vgpu.planner shares one evaluation between pods of models not among them)."""
        memo = self.models_memo
        if memo is None or memo[0] != self.version:
            held = {m for _, m in self.role_models}
            for u in self.gpus:
                for h in u.holders:
                    held.add(h.model)
            memo = self.models_memo = (self.version, frozenset(held))
        return memo[1]

    def _classify(self) -> tuple[int, int, dict[int, GpuUsage]]:
        first: dict[int, GpuUsage] = {}
        counts: dict[int, int] = {}
        for u in self.gpus:
            k = u.state_id
            n = counts.get(k)
            if n is None:
                first[k] = u
                counts[k] = 1
            else:
                counts[k] = n + 1
        static = self.static_memo
        if static is None:
            inv = self.inventory
            g0 = self.gpus[0].device if self.gpus else None
            static = self.static_memo = (
                len(self.gpus),
                None if g0 is None else (g0.model, g0.memory_mib, g0.cores),
                inv.cpu_milli,
                inv.memory_mib,
                inv.kubelet is not None,
                bool(inv.cordon.uuids),
                self.all_healthy,
                bool(self.topology.cliques),
                self.topology.flat,  # False with GPUs on several NUMA nodes: a multi-GPU fit then chooses by NUMA node
            )
        roles = frozenset(k for k, n in self.role_models.items() if n > 0)
        key = intern((static, frozenset(counts.items()), self.cpu_used, self.memory_used, roles))
        self.groups_memo = (self.version, tuple(first.values()))
        memo = self.class_memo = (self.version, key, first)
        return memo

    def take(self, pod_key: str, a: Assignment, cpu_milli: int = 0, memory_mib: int = 0) -> None:
        """Hold the pod's slices and host use (checked by the caller: `ClusterState.apply`) at a new version."""
        for s in a.slices():
            self.by_uuid[s.uuid].add(Holder(pod_key, a.role, a.model, s.memory_mib, s.cores))
        self.pods[pod_key] = a
        self.cpu_used += cpu_milli
        self.memory_used += memory_mib
        self.role_models[(a.role, a.model)] += 1
        self.version += 1

    def copy(self) -> NodeState:
        """The same node and usage in new objects (`take` on it leaves this one as it is), at the same version; what
        the inventory fixes is shared, what depends on the usage starts empty."""
        gpus = [
            GpuUsage(
                u.device,
                u.memory_used,
                u.cores_used,
                list(u.holders),
                u.prefill,
                u.decode,
                u.best_effort,
                u.key_memo,
                u.id_memo,
            )
            for u in self.gpus
        ]
        out = NodeState(
            self.inventory,
            gpus,
            {u.device.uuid: u for u in gpus},
            self.cpu_used,
            self.memory_used,
            dict(self.pods),
            Counter(self.role_models),
            self.version,
        )
        out.topology_memo = self.topology_memo
        out.positions_memo = self.positions_memo
        out.healthy_memo = self.healthy_memo
        out.static_memo = self.static_memo
        return out

    @property
    def all_healthy(self) -> bool:
        """No GPU of the inventory is marked unhealthy (fixed for a NodeState, like its inventory)."""
        healthy = self.healthy_memo
        if healthy is None:
            healthy = self.healthy_memo = all(u.device.healthy for u in self.gpus)
        return healthy

    @property
    def positions(self) -> dict[str, int]:
        """Each GPU's position in `gpus`, by UUID."""
        pos = self.positions_memo
        if pos is None:
            pos = self.positions_memo = {u.device.uuid: i for i, u in enumerate(self.gpus)}
        return pos

    def used_share(self) -> float:
        if not self.gpus:
            return 0.0
        return sum(g.used_share for g in self.gpus) / len(self.gpus)


@dataclass(frozen=True, slots=True)
class HostUse:
    cpu_milli: int = 0
    memory_mib: int = 0


class ClusterState:
    """Nodes, their GPUs and every pod's assignment; the single mutable object of the core."""

    def __init__(self, config: PlacementConfig | None = None) -> None:
        self.config = config or PlacementConfig()
        self.nodes: dict[str, NodeState] = {}
        self.assignments: dict[str, Assignment] = {}
        self._host: dict[str, HostUse] = {}
        # Assignments whose node or GPUs are not (yet) in any inventory, e.g. pods seen before nodes.
        self.orphans: dict[str, Assignment] = {}
        # Assignments that the apiserver holds but that violate the limits (reported, never applied).
        self.conflicts: dict[str, str] = {}
        self.version = 0
        # (state version after the change, node name): lets callers refresh only what changed.
        self._changes: list[tuple[int, str]] = []
        # Moves only when a node name joins or leaves `nodes`: callers may keep which names are known until then.
        self.names_version = 0

    _CHANGE_LOG = 4096

    def _changed(self, node: str) -> None:
        self.version += 1
        self._changes.append((self.version, node))
        if len(self._changes) > 2 * self._CHANGE_LOG:
            del self._changes[: self._CHANGE_LOG]

    def classify(self) -> None:
        """Work out every node's `NodeState.class_key` (and its topology) now, as a pass over the nodes would: called
        right after the lists, so the first pod's pass does not (~60 us a node) and what they make is frozen with the
        state in the extender's process (scheduler_extender.gcpause)."""
        for node in self.nodes.values():
            node.classified()

    def changed_since(self, version: int) -> set[str] | None:
        """Nodes changed after `version`; None when the log no longer reaches back that far."""
        if version == self.version:
            return set()
        changes = self._changes
        if not changes or changes[0][0] > version + 1:
            return None
        # Versions in the log rise by one a change: the changes after `version` start at a known offset, and the
        # set is made in C (a planner refreshes each shape's memo by this; a shape asked every ~100 binds walked 100).
        start = max(0, version + 1 - changes[0][0])
        return set(map(operator.itemgetter(1), changes[start:]))

    # -- nodes --------------------------------------------------------------------------------

    def upsert_node(self, inventory: NodeInventory) -> None:
        old = self.nodes.get(inventory.name)
        if old is not None and old.inventory == inventory and old.inventory.labels == inventory.labels:
            return
        node = NodeState.of(inventory)
        # The cluster version it is about to get: a node that is removed and comes back never
        # repeats a version a cache may still hold (node versions never exceed the cluster's).
        node.version = self.version + 1
        self.names_version += old is None
        self.nodes[inventory.name] = node
        self._changed(inventory.name)
        pending = dict(old.pods) if old else {}
        pending.update({k: a for k, a in self.orphans.items() if a.node == inventory.name})
        for key, a in pending.items():
            self.orphans.pop(key, None)
            self.assignments.pop(key, None)
            self._place(key, a, self._host.get(key, HostUse()))

    def remove_node(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is None:
            return
        self.names_version += 1
        self._changed(name)
        for key, a in node.pods.items():
            self.assignments.pop(key, None)
            self.orphans[key] = a

    # -- allocations --------------------------------------------------------------------------

    def check(self, assignment: Assignment) -> str | None:
        """Why this assignment cannot be applied now (None = it can)."""
        node = self.nodes.get(assignment.node)
        if node is None:
            return f"node {assignment.node} has no GPU inventory"
        return _blocker(node, assignment, self.config)

    def with_stand_ins(self, name: str, stand_ins: Iterable[tuple[str, Assignment]]) -> NodeState | None:
        """Node `name` as `apply` of each of `stand_ins` (state key, assignment) in turn would leave it, as a copy:
        one that does not fit beside those before it, names another node or a key already held is left out, as
        `apply` refuses it. The state does not change and no version moves, so weighing a pod beside soft holds
        (scheduler_extender.holds) leaves every memoised evaluation of the node valid. The node itself when no
        stand-in is held; None when there is no such node.

        The copy's version is the node's plus the stand-ins it holds, the one `apply` would have given the node, so a
        policy that draws per version (randomfit) draws as it did when stand-ins were applied to the state. No cache
        keyed by (name, version) sees a copy: it is never in `nodes` (callers evaluate it uncached), and its own
        memos start empty."""
        node = self.nodes.get(name)
        if node is None:
            return None
        view: NodeState | None = None
        for key, a in stand_ins:
            if (
                a.node != name
                or key in self.assignments
                or key in self.orphans
                or (view is not None and key in view.pods)
            ):
                continue
            if _blocker(node if view is None else view, a, self.config) is not None:
                continue
            if view is None:
                view = node.copy()
            view.take(key, a)
        return node if view is None else view

    def apply(self, pod_key: str, assignment: Assignment, host: HostUse = HostUse()) -> None:
        """Record a pod's assignment; raises CapacityError and changes nothing if it does not fit."""
        if pod_key in self.assignments or pod_key in self.orphans:
            if self.assignments.get(pod_key, self.orphans.get(pod_key)) == assignment:
                return
            raise CapacityError(f"pod {pod_key} already holds an assignment; release it first")
        if assignment.node not in self.nodes:
            self.orphans[pod_key] = assignment
            self._host[pod_key] = host
            return
        reason = self.check(assignment)
        if reason is not None:
            raise CapacityError(f"pod {pod_key}: {reason}")
        self._place(pod_key, assignment, host)

    def _place(self, pod_key: str, a: Assignment, host: HostUse) -> None:
        node = self.nodes[a.node]
        reason = self.check(a)
        if reason is not None:
            # Only reachable when re-applying known assignments to a changed inventory: keep the
            # pod accounted for (releasable) and report it, never over-commit a GPU for it.
            self.orphans[pod_key] = a
            self.conflicts[pod_key] = reason
            self._host[pod_key] = host
            return
        node.take(pod_key, a, host.cpu_milli, host.memory_mib)
        self.conflicts.pop(pod_key, None)
        self.assignments[pod_key] = a
        self._host[pod_key] = host
        self._changed(a.node)

    def release(self, pod_key: str) -> Assignment | None:
        """Free a pod's slices; idempotent (None when the pod held nothing)."""
        host = self._host.pop(pod_key, HostUse())
        self.conflicts.pop(pod_key, None)
        if pod_key in self.orphans:
            return self.orphans.pop(pod_key)
        a = self.assignments.pop(pod_key, None)
        if a is None:
            return None
        node = self.nodes[a.node]
        for uuid in {s.uuid for s in a.slices()}:
            node.by_uuid[uuid].remove(pod_key)
        del node.pods[pod_key]
        node.cpu_used -= host.cpu_milli
        node.memory_used -= host.memory_mib
        node.role_models[(a.role, a.model)] -= 1
        if node.role_models[(a.role, a.model)] <= 0:
            del node.role_models[(a.role, a.model)]
        node.version += 1
        self._changed(a.node)
        return a

    # -- views --------------------------------------------------------------------------------

    def slice_of(self, pod_key: str) -> list[DeviceSlice]:
        a = self.assignments.get(pod_key)
        return a.slices() if a else []

    def totals(self) -> dict[str, int]:
        gpus = [g for n in self.nodes.values() for g in n.gpus]
        return {
            "nodes": len(self.nodes),
            "gpus": len(gpus),
            "memory_mib": sum(g.device.memory_mib for g in gpus),
            "memory_used_mib": sum(g.memory_used for g in gpus),
            "cores": sum(g.device.cores for g in gpus),
            "cores_used": sum(g.cores_used for g in gpus),
            "slices": sum(g.sharers for g in gpus),
            "pods": len(self.assignments),
        }
