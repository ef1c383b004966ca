"""Whether and how a pod fits on one node: the concrete GPUs for each container's slices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu.annotations import POD_REQUIRE_NVLINK, Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.kubelet_topology import Offer, fit_offer
from vgpu.pod import PodInfo
from vgpu.requests import ContainerRequest
from vgpu.roles import Role
from vgpu.state import GpuUsage, NodeState, slice_blocker
from vgpu.topology import Link, choose

# Lower ranks first. Arguments: the GPU, the slice's memory and cores, the pod.
GpuRank = Callable[[GpuUsage, int, int, PodInfo], float]


class StateRank:
    """A GPU order bound to one node whose value depends only on the GPU's `GpuUsage.state_key` and the slice (not
    on its UUID or index): GPUs in equal states rank alike, so a one-slice fit asks once per distinct state and
    takes its lowest-index GPU, which is the one the full order picks among them."""

    def __call__(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        raise NotImplementedError


class ByState(StateRank):
    """A plain GPU order that reads only what `GpuUsage.state_key` holds (the reserved share, the free milli) and the
    slice, declared a `StateRank` so a fit asks it once per state and the planner's node classes may answer for the
    policy (binpack, spread, the paper's baselines)."""

    __slots__ = ("order",)

    def __init__(self, order: GpuRank) -> None:
        self.order = order

    def __call__(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return self.order(u, memory_mib, cores, pod)


_REASON_TEXT = {
    "unhealthy": "unhealthy",
    "model": "GPU model not allowed",
    "uuid": "GPU UUID not allowed",
    "cordoned": "GPU cordoned",
    "too-small": "card too small",
    "memory": "GPU memory full",
    "cores": "SM quota full",
    "split": "sharer limit reached",
    "prefill-sm": "would oversubscribe SMs of a prefill GPU",
    "decode-bandwidth": "decode bandwidth budget reached",
    "same-container": "already holds this container's other vGPU",
}


# Reasons that freeing slices (preemption) cannot change.
_STATIC = frozenset({"too-small", "model", "uuid", "cordoned"})

_NONE = [0, 0, 0, 0]


@dataclass(frozen=True, slots=True)
class FitFailure:
    """Why a pod does not fit; `unresolvable` when freeing slices (preemption) could not help."""

    reason: str
    unresolvable: bool = False


@dataclass(frozen=True, slots=True)
class NodePlacement:
    node: str
    containers: tuple[ContainerAssignment, ...]

    def assignment(self, pod: PodInfo) -> Assignment:
        return Assignment(node=self.node, containers=self.containers, role=pod.role, model=pod.model)


def counterpart(role: Role) -> Role | None:
    if role.does_prefill:
        return Role.DECODE
    if role.does_decode:
        return Role.PREFILL
    return None


def role_rank(u: GpuUsage, pod: PodInfo) -> int:
    """-1 on a GPU whose holders complement this pod (P/D of the same model), +1 next to another
    prefill, 0 otherwise; used before the GPU policy's own order."""
    if pod.role.does_prefill:
        if u.prefill:
            return 1
        return -1 if any(h.role.does_decode and h.model == pod.model for h in u.holders) else 0
    if pod.role.does_decode:
        return -1 if any(h.role.does_prefill and h.model == pod.model for h in u.holders) else 0
    return 0


def near_counterpart(node: NodeState, pod: PodInfo) -> frozenset[str]:
    """GPUs that are NVLink peers of a GPU holding this pod's counterpart role of the same model: a P/D pair on
    them moves its KV cache over NVLink instead of PCIe. Ranked right after the counterpart's own GPUs."""
    if pod.model is None or not node.topology.cliques:
        return frozenset()
    peers = node.topology.peers
    near: set[str] = set()
    for u in node.gpus:
        if role_rank(u, pod) < 0:
            near |= peers.get(u.device.uuid, frozenset())
    return frozenset(near)


_SLOTS_LIMIT = 1 << 16


@dataclass(slots=True)
class ShapeMemo:
    """What one pod shape's evaluation learns about GPUs and reuses on every node: for each distinct GPU state
    (`GpuUsage.state_key`), the pod's slice there (memory, cores) and its role order, or `_BLOCKED` where the slice
    cannot go (card too small, or `slice_blocker`). Valid for one (pod shape, placement config) only: the planner
    keeps one per shape cache. In a 5,000-node cluster a few hundred GPU states stand for 40,000 GPUs."""

    slots: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # by `GpuUsage.state_id`
    # Set by each `fit_node` call: whether its answer depends only on the node's `NodeState.class_key` (given a
    # `StateRank`), up to which GPU of the chosen state it names: a one-slice fit over the distinct GPU states with a
    # best state (or states that rank equal, `tied`), or a failure counted over GPUs nothing excluded. vgpu.planner then reuses it for the class.
    shared: bool = False
    # With `shared`, after a fit: the first GPU of each state that ranked equal to the chosen one (the chosen first),
    # empty when no other did. On another node of the class the lowest-index one of these states is chosen.
    tied: tuple[GpuUsage, ...] = ()


def fit_node(
    node: NodeState, pod: PodInfo, config: PlacementConfig, rank: GpuRank, memo: ShapeMemo | None = None
) -> NodePlacement | FitFailure:
    """Place every GPU-asking container of the pod on this node, or say why not.

    `memo` (optional, one per pod shape and config) lets a one-slice pod skip the per-GPU checks on GPU states it
    has met before; the placement is the same with or without it."""
    inv = node.inventory
    if memo is not None:
        memo.shared = False
    if inv.cpu_milli and node.cpu_used + pod.cpu_milli > inv.cpu_milli:
        return FitFailure(f"insufficient cpu ({node.cpu_used}+{pod.cpu_milli} > {inv.cpu_milli} millicores)")
    if inv.memory_mib and node.memory_used + pod.memory_mib > inv.memory_mib:
        return FitFailure(f"insufficient memory ({node.memory_used}+{pod.memory_mib} > {inv.memory_mib} MiB)")
    reqs = pod.request.containers
    if not reqs:
        return NodePlacement(node.name, ())
    if not node.gpus:
        return FitFailure("node has no GPUs", unresolvable=True)
    if memo is not None and len(reqs) == 1 and reqs[0].count == 1 and inv.kubelet is None:
        one = _fit_one(node, pod, config, rank, memo)
        if one is not None:
            return one  # else nothing fits: the full pass below says why, counting every reason
    cordoned = inv.cordon.uuids
    usable: list[GpuUsage] | tuple[GpuUsage, ...]
    excluded: dict[str, int] = {}
    if (
        cordoned
        or not (config.allow_unhealthy or node.all_healthy)
        or pod.gpu_models is not None
        or pod.gpu_filter is not None
    ):
        usable = []
        for u in node.gpus:
            why: str | None = None
            if not u.device.healthy and not config.allow_unhealthy:
                why = "unhealthy"
            elif cordoned and u.device.uuid in cordoned:
                why = "cordoned"  # no new slice; the slices already on it stay
            elif pod.gpu_models is not None and u.device.model not in pod.gpu_models:
                why = "model"
            elif pod.gpu_filter is not None:
                why = pod.gpu_filter.blocker(u.device)  # HAMi's use/nouse-gputype and -gpuuuid
            if why is None:
                usable.append(u)
            else:
                excluded[why] = excluded.get(why, 0) + 1
    else:  # nothing excludes a GPU (most nodes): every GPU is usable
        usable = node.gpus
    extra: dict[str, list[int]] = {}
    out: list[ContainerAssignment] = []
    # A role-less pod has no role order; skipping the call matters on large nodes (openb: every pod).
    by_role_order = config.roles.gpu_role_order and (pod.role.does_prefill or pod.role.does_decode)
    topo = node.topology
    near = near_counterpart(node, pod) if by_role_order and config.topology else frozenset()
    # A `StateRank` ranks GPUs in equal states alike: asked once per state.
    state_rank = isinstance(rank, StateRank)
    for req in reqs:
        # Kubelet agreement: only GPUs whose replicas the kubelet will offer (vgpu.kubelet_topology).
        offer = None if inv.kubelet is None else fit_offer(inv.kubelet, node.gpus, extra, req, pod.request)
        if offer is not None and offer.refusal is not None:
            return FitFailure(f"container {req.container!r}: {offer.refusal}")
        # (verdict, position, GPU, state id) of each GPU that can host a slice: see `_judge`.
        hosts: list[tuple[_Verdict, int, GpuUsage, int]] = []
        blocked = dict(excluded)
        # What a GPU's state alone decides (no offer, no slice of this pod on it yet): slice, blocker, role order.
        judged = _judged(req, pod, config, by_role_order)
        if offer is None and not extra:  # every GPU as its state decides (most fits)
            for pos, u in enumerate(usable):
                key = u.id_memo or u.state_id
                verdict = judged.get(key)
                if verdict is None:
                    verdict = judged[key] = _judge(u, req, pod, config, by_role_order)
                why = verdict[2]
                if why is None:
                    hosts.append((verdict, pos, u, key))
                else:
                    blocked[why] = blocked.get(why, 0) + 1
        else:
            for pos, u in enumerate(usable):
                dev = u.device
                key = u.id_memo or u.state_id
                if offer is None and dev.uuid not in extra:
                    verdict = judged.get(key)
                    if verdict is None:
                        verdict = judged[key] = _judge(u, req, pod, config, by_role_order)
                else:
                    verdict = judge_with(u, req, pod, config, by_role_order, offer, extra.get(dev.uuid, _NONE))
                why = verdict[2]
                if why is None:
                    hosts.append((verdict, pos, u, key))
                else:
                    blocked[why] = blocked.get(why, 0) + 1
        if len(hosts) < req.count:  # the GPU order is not needed to say why not
            need = f"{req.memory_mib} MiB" if req.memory_mib is not None else f"{req.memory_percentage}% memory"
            core_txt = "proportional cores" if req.cores is None else f"{req.cores}% cores"
            detail = ", ".join(f"{_REASON_TEXT.get(k, k)} on {n}" for k, n in sorted(blocked.items()))
            static = sum(n for k, n in blocked.items() if k in _STATIC)
            return FitFailure(
                f"container {req.container!r} needs {req.count} vGPU(s) of {need}/{core_txt}; "
                f"{len(hosts)} of {len(node.gpus)} GPUs can host one" + (f" ({detail})" if detail else ""),
                unresolvable=len(node.gpus) - static < req.count,
            )
        # (role order, rank, index, position, GPU, slice memory, slice cores), sorted on the first three as before; the
        # position only repeats the stable order of equal keys (indices are unique on a node), so no GpuUsage is ever
        # compared. A `StateRank` is asked once per state (the slice is the state's too).
        candidates: list[tuple[float, float, int, int, GpuUsage, int, int]] = []
        if state_rank and not near:  # (most fits) the role order is the state's; the rank asked once per state
            ranks: dict[int, float] = {}
            for (mem, cores, _, base), pos, u, key in hosts:
                r = ranks.get(key)
                if r is None:
                    r = ranks[key] = rank(u, mem, cores, pod)
                candidates.append((base, r, u.device.index, pos, u, mem, cores))
        else:
            ranks = {}
            for (mem, cores, _, base), pos, u, key in hosts:
                dev = u.device
                by_role: float = -0.5 if near and base == 0 and dev.uuid in near else base
                if state_rank:
                    r = ranks.get(key)
                    if r is None:
                        r = ranks[key] = rank(u, mem, cores, pod)
                else:
                    r = rank(u, mem, cores, pod)
                candidates.append((by_role, r, dev.index, pos, u, mem, cores))
        if req.count == 1:  # the least candidate (keys never equal: the position differs), without sorting them all
            chosen = [min(candidates)]
        else:
            candidates.sort()
            chosen = candidates[: req.count]
        if req.count > 1 and (config.topology or pod.require_nvlink):
            link = Link.NONE  # a flat node has no NVLink, and every set is as good as the policy's first
            if not topo.flat:
                pos_chosen, link = choose([t[4].device.uuid for t in candidates], req.count, topo)
                chosen = [candidates[i] for i in pos_chosen]
            if pod.require_nvlink and link > Link.NVLINK_CROSS_NUMA:
                fits = [
                    u
                    for u in usable
                    if not _too_small(
                        u.device.memory_mib,
                        u.device.cores,
                        req.memory_on(u.device.memory_mib),
                        req.cores_on(u.device.memory_mib),
                        config,
                    )
                ]
                now = topo.largest_clique({t[4].device.uuid for t in candidates})
                ever = topo.largest_clique({u.device.uuid for u in fits})
                return FitFailure(
                    f"container {req.container!r} needs {req.count} GPUs that are all NVLink peers ({POD_REQUIRE_NVLINK}); "
                    + (
                        f"of the {len(candidates)} GPUs that can host its slice now, at most {now} are"
                        if ever >= req.count
                        else f"at most {ever} of this node's GPUs that could ever host it are"
                    )
                    + " NVLink peers of each other"
                    + ("" if topo.cliques else " (no NVLink between its GPUs)"),
                    unresolvable=ever < req.count,
                )
        if offer is not None and (why := offer.problem(t[4].device.uuid for t in chosen)) is not None:
            return FitFailure(f"container {req.container!r}: {why}")
        devices: list[DeviceSlice] = []
        later = len(out) + 1 < len(reqs)  # only a later container reads what this one holds
        for _, _, _, _, u, mem, cores in chosen:
            devices.append(DeviceSlice(uuid=u.device.uuid, index=u.device.index, memory_mib=mem, cores=cores))
            if later:
                e = extra.setdefault(u.device.uuid, [0, 0, 0, 0])
                e[0] += mem
                e[1] += cores
                e[2] += 1
                e[3] += cores == 0
        out.append(ContainerAssignment(name=req.container, devices=tuple(devices)))
    return NodePlacement(node.name, tuple(out))


_Verdict = tuple[int, int, str | None, int]
# `_judge`'s answers by GPU state (`GpuUsage.state_id`), per slice ask, pod role and model (where the role order reads
# it) and config (held, so its id stays its own): the first nodes of a pass meet most states a cluster has, the
# others look them up. A process-wide memo like `vgpu.state.intern`. Bounded in all: at most `_JUDGED_LIMIT` tables of
# `_JUDGED_SLOTS` states (and one node's GPUs more each), ~40 MiB at most (tests/unit/test_review_s7.py). A table
# keeps the states churn has left behind until it is full, while a cluster's live states are few (cold_shape's
# 5,000-node clusters: 5 usual, 116 packed); 512 tables of 65,536 states could have reached ~5 GiB.
_JUDGED: dict[tuple[object, ...], tuple[PlacementConfig, dict[int, _Verdict]]] = {}
_JUDGED_LIMIT = 256
_JUDGED_SLOTS = 1 << 10


def _judged(req: ContainerRequest, pod: PodInfo, config: PlacementConfig, by_role_order: bool) -> dict[int, _Verdict]:
    key = (id(config), req.memory_mib, req.memory_percentage, req.cores, pod.role, pod.model if by_role_order else None)
    hit = _JUDGED.get(key)
    if hit is not None and hit[0] is config:
        if len(hit[1]) >= _JUDGED_SLOTS:
            hit[1].clear()
        return hit[1]
    if len(_JUDGED) >= _JUDGED_LIMIT:
        _JUDGED.clear()
    table: dict[int, _Verdict] = {}
    _JUDGED[key] = (config, table)
    return table


def judge_with(
    u: GpuUsage,
    req: ContainerRequest,
    pod: PodInfo,
    config: PlacementConfig,
    by_role_order: bool,
    offer: Offer | None,
    e: list[int],
) -> _Verdict:
    """`_judge` on a GPU the kubelet's offer may leave out, or that holds slices of this pod's earlier containers
    (`e`: their memory, cores, count and best-effort count); the planner's picks (`Planner._picks`) ask it too."""
    dev = u.device
    mem = req.memory_on(dev.memory_mib)
    cores = req.cores_on(dev.memory_mib)
    if _too_small(dev.memory_mib, dev.cores, mem, cores, config):
        return mem, cores, "too-small", 0
    if offer is not None and not offer.allows(dev.uuid):
        return mem, cores, offer.why, 0
    why = slice_blocker(
        u,
        mem,
        cores,
        pod.role,
        config,
        extra_memory=e[0],
        extra_cores=e[1],
        extra_sharers=e[2],
        extra_best_effort=e[3],
    )
    if why is not None:
        return mem, cores, why, 0
    return mem, cores, None, role_rank(u, pod) if by_role_order else 0


def _too_small(card_mib: int, card_cores: int, mem: int, cores: int, config: PlacementConfig) -> bool:
    return mem > int(card_mib * config.memory_scaling) or cores > int(card_cores * config.core_scaling)


def _judge(u: GpuUsage, req: ContainerRequest, pod: PodInfo, config: PlacementConfig, by_role_order: bool) -> _Verdict:
    """What `fit_node` decides of one slice of `req` on GPU `u` holding no slice of this pod yet, from the GPU's
    state alone: (memory, cores, why not or None, role order). Equal `GpuUsage.state_key`s judge alike."""
    dev = u.device
    mem = req.memory_on(dev.memory_mib)
    cores = req.cores_on(dev.memory_mib)
    if _too_small(dev.memory_mib, dev.cores, mem, cores, config):
        return mem, cores, "too-small", 0
    why = slice_blocker(u, mem, cores, pod.role, config)
    if why is not None:
        return mem, cores, why, 0
    return mem, cores, None, role_rank(u, pod) if by_role_order else 0


def _slot(u: GpuUsage, pod: PodInfo, config: PlacementConfig, by_role_order: bool) -> tuple[int, int, int] | None:
    """One slice of the pod's only container on GPU `u`, as `fit_node` checks it: (memory, cores, role order), or
    None when the card is too small or `slice_blocker` names a reason."""
    req = pod.request.containers[0]
    dev = u.device
    mem = req.memory_on(dev.memory_mib)
    cores = req.cores_on(dev.memory_mib)
    if mem > int(dev.memory_mib * config.memory_scaling) or cores > int(dev.cores * config.core_scaling):
        return None
    if slice_blocker(u, mem, cores, pod.role, config) is not None:
        return None
    return mem, cores, role_rank(u, pod) if by_role_order else 0


def _fit_one(
    node: NodeState, pod: PodInfo, config: PlacementConfig, rank: GpuRank, memo: ShapeMemo
) -> NodePlacement | None:
    """`fit_node` for a pod with one container asking one vGPU on a node without a kubelet offer: the same GPU
    (least (role order, rank, index) among the GPUs that can host the slice), None when none can."""
    req = pod.request.containers[0]
    by_role_order = config.roles.gpu_role_order and (pod.role.does_prefill or pod.role.does_decode)
    near_possible = by_role_order and config.topology and pod.model is not None
    near = near_counterpart(node, pod) if near_possible else _EMPTY
    cordoned = node.inventory.cordon.uuids
    unhealthy_ok = config.allow_unhealthy or node.all_healthy
    models = pod.gpu_models
    gpu_filter = pod.gpu_filter
    check = bool(cordoned) or not unhealthy_ok or models is not None or gpu_filter is not None
    slots = memo.slots
    best: tuple[float, float, int] | None = None
    chosen: tuple[GpuUsage, int, int] | None = None
    # Equal states are equal candidates when nothing else tells GPUs apart: the first of each state stands for all.
    grouped = not check and not near and isinstance(rank, StateRank)
    gpus = node.state_groups if grouped else node.gpus
    # Other states' GPUs that rank equal to the best: the lowest index decides, so the answer depends on GPU order.
    tied: list[GpuUsage] = []
    for u in gpus:
        dev = u.device
        if check and (
            (not dev.healthy and not unhealthy_ok)
            or (cordoned and dev.uuid in cordoned)
            or (models is not None and dev.model not in models)
            or (gpu_filter is not None and gpu_filter.blocker(dev) is not None)
        ):
            continue
        key = u.id_memo or u.state_id
        slot = slots.get(key)
        if slot is None:
            if len(slots) >= _SLOTS_LIMIT:
                slots.clear()
            slot = slots[key] = _slot(u, pod, config, by_role_order) or _BLOCKED
        if slot[0] < 0:  # `_BLOCKED`, by value: compiled (mypyc) code does not keep a tuple's identity
            continue
        mem, cores, by_role = slot
        # One expression: compiled (mypyc), an int assigned to a float variable is refused.
        order: float = -0.5 if near and by_role == 0 and dev.uuid in near else by_role
        cand = (order, rank(u, mem, cores, pod), dev.index)
        if best is None or cand < best:
            if best is not None and cand[0] == best[0] and cand[1] == best[1]:
                tied.insert(0, u)  # not reached in index order, kept for completeness
            else:
                tied = [u]
            best, chosen = cand, (u, mem, cores)
        elif cand[0] == best[0] and cand[1] == best[1]:
            tied.append(u)
    # `near` can only be non-empty on a node with NVLink (in the class key) for a pod with a model and a role order.
    memo.shared = grouped and (not node.topology.cliques or not near_possible)
    memo.tied = tuple(tied) if len(tied) > 1 else ()
    if chosen is None:
        return None
    u, mem, cores = chosen
    dev = u.device
    slc = DeviceSlice(uuid=dev.uuid, index=dev.index, memory_mib=mem, cores=cores)
    return NodePlacement(node.name, (ContainerAssignment(name=req.container, devices=(slc,)),))


_BLOCKED = (-1, -1, 0)  # ShapeMemo.slots' entry for a GPU state the slice cannot go on
_EMPTY: frozenset[str] = frozenset()
