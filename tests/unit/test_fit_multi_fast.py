"""The multi-slice fit decides exactly what the plain per-GPU fit decided.

`fit_node` judges each distinct GPU state once per container, ranks only when enough GPUs can host a slice and ranks
a `StateRank` once per state; `_reference_fit` below is `fit_node` as it was before (every GPU judged and ranked on
its own, a failure counted after ranking). Both run on random nodes and pods: GPU states that repeat, P/D holders of
several models, best-effort slices, unhealthy and cordoned GPUs, two card sizes on a node, NVLink pairs, quads and
NVSwitch domains over one or two NUMA nodes, memory asked in MiB or percent with or without gpucores, several GPUs
and several containers, vgpu.io/require-nvlink, GPU model filters, host room, and configs with the topology, the role
order or unhealthy GPUs switched. The placement (GPU order included) or the failure (reason text, unresolvable) must
be equal, under a state-only GPU order (fgd's), a per-GPU one (binpack's) and one where every GPU ties.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from tests.conftest import make_container, make_pod
from vgpu.annotations import POD_REQUIRE_NVLINK, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig, RoleRules
from vgpu.devices import Cordon, GpuDevice, NodeInventory
from vgpu.fit import (
    _NONE,
    _REASON_TEXT,
    _STATIC,
    FitFailure,
    GpuRank,
    NodePlacement,
    ShapeMemo,
    fit_node,
    near_counterpart,
    role_rank,
)
from vgpu.kubelet_topology import fit_offer
from vgpu.placement.fgd import Fgd
from vgpu.pod import PodInfo, pod_info
from vgpu.roles import Role
from vgpu.state import ClusterState, GpuUsage, HostUse, NodeState, slice_blocker
from vgpu.topology import Link, choose


def _reference_fit(node: NodeState, pod: PodInfo, config: PlacementConfig, rank: GpuRank) -> NodePlacement | FitFailure:
    """`fit_node` before the multi-slice work: every GPU judged and ranked one by one, sorted on a key."""
    inv = node.inventory
    if inv.cpu_milli and node.cpu_used + pod.cpu_milli > inv.cpu_milli:
        return FitFailure(f"insufficient cpu ({node.cpu_used}+{pod.cpu_milli} > {inv.cpu_milli} millicores)")
    if inv.memory_mib and node.memory_used + pod.memory_mib > inv.memory_mib:
        return FitFailure(f"insufficient memory ({node.memory_used}+{pod.memory_mib} > {inv.memory_mib} MiB)")
    reqs = pod.request.containers
    if not reqs:
        return NodePlacement(node.name, ())
    if not node.gpus:
        return FitFailure("node has no GPUs", unresolvable=True)
    usable: list[GpuUsage] = []
    excluded: dict[str, int] = {}
    cordoned = inv.cordon.uuids
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
    extra: dict[str, list[int]] = {}
    out: list[ContainerAssignment] = []
    # A role-less pod has no role order; skipping the call matters on large nodes (openb: every pod).
    by_role_order = config.roles.gpu_role_order and (pod.role.does_prefill or pod.role.does_decode)
    topo = node.topology
    near = near_counterpart(node, pod) if by_role_order and config.topology else frozenset()
    for req in pod.request.containers:
        # Kubelet agreement: only GPUs whose replicas the kubelet will offer (vgpu.kubelet_topology).
        offer = None if inv.kubelet is None else fit_offer(inv.kubelet, node.gpus, extra, req, pod.request)
        if offer is not None and offer.refusal is not None:
            return FitFailure(f"container {req.container!r}: {offer.refusal}")
        candidates: list[tuple[float, float, int, GpuUsage, int, int]] = []
        blocked = dict(excluded)
        sizes: dict[tuple[int, int], tuple[int, int, bool]] = {}  # (card MiB, cores) -> slice and too-small
        for u in usable:
            dev = u.device
            size = sizes.get((dev.memory_mib, dev.cores))
            if size is None:
                mem = req.memory_on(dev.memory_mib)
                cores = req.cores_on(dev.memory_mib)
                small = mem > int(dev.memory_mib * config.memory_scaling) or cores > int(
                    dev.cores * config.core_scaling
                )
                size = sizes[(dev.memory_mib, dev.cores)] = (mem, cores, small)
            mem, cores, small = size
            if small:
                blocked["too-small"] = blocked.get("too-small", 0) + 1
                continue
            if offer is not None and not offer.allows(dev.uuid):
                blocked[offer.why] = blocked.get(offer.why, 0) + 1
                continue
            e = extra.get(dev.uuid, _NONE)
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
                blocked[why] = blocked.get(why, 0) + 1
                continue
            by_role: float = role_rank(u, pod) if by_role_order else 0
            if near and by_role == 0 and dev.uuid in near:
                by_role = -0.5
            candidates.append((by_role, rank(u, mem, cores, pod), dev.index, u, mem, cores))
        if len(candidates) < req.count:
            need = f"{req.memory_mib} MiB" if req.memory_mib is not None else f"{req.memory_percentage}% memory"
            core_txt = "proportional cores" if req.cores is None else f"{req.cores}% cores"
            detail = ", ".join(f"{_REASON_TEXT.get(k, k)} on {n}" for k, n in sorted(blocked.items()))
            static = sum(n for k, n in blocked.items() if k in _STATIC)
            return FitFailure(
                f"container {req.container!r} needs {req.count} vGPU(s) of {need}/{core_txt}; "
                f"{len(candidates)} of {len(node.gpus)} GPUs can host one" + (f" ({detail})" if detail else ""),
                unresolvable=len(node.gpus) - static < req.count,
            )
        candidates.sort(key=lambda t: (t[0], t[1], t[2]))
        chosen = candidates[: req.count]
        if req.count > 1 and (config.topology or pod.require_nvlink):
            link = Link.NONE  # a flat node has no NVLink, and every set is as good as the policy's first
            if not topo.flat:
                pos, link = choose([t[3].device.uuid for t in candidates], req.count, topo)
                chosen = [candidates[i] for i in pos]
            if pod.require_nvlink and link > Link.NVLINK_CROSS_NUMA:
                fits = [u for u in usable if not sizes[(u.device.memory_mib, u.device.cores)][2]]
                now = topo.largest_clique({t[3].device.uuid for t in candidates})
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
        if offer is not None and (why := offer.problem(t[3].device.uuid for t in chosen)) is not None:
            return FitFailure(f"container {req.container!r}: {why}")
        devices: list[DeviceSlice] = []
        for _, _, _, u, mem, cores in chosen:
            devices.append(DeviceSlice(uuid=u.device.uuid, index=u.device.index, memory_mib=mem, cores=cores))
            e = extra.setdefault(u.device.uuid, [0, 0, 0, 0])
            e[0] += mem
            e[1] += cores
            e[2] += 1
            e[3] += cores == 0
        out.append(ContainerAssignment(name=req.container, devices=tuple(devices)))
    return NodePlacement(node.name, tuple(out))


MODELS = ("default/m", "default/x", None)  # make_pod's pods are in namespace default


def _node_inventory(name: str, rng: random.Random) -> NodeInventory:
    count = rng.choice((4, 8, 8, 8, 16))
    big = rng.random() < 0.8  # else two card sizes on the node
    links = rng.choice(("none", "none", "pairs", "quads", "switch"))
    numa_split = rng.random() < 0.6
    gpus = []
    for i in range(count):
        if links == "pairs":
            peers: tuple[str, ...] = (f"{name}-g{i ^ 1}",) if i ^ 1 < count else ()
        elif links == "quads":
            peers = tuple(f"{name}-g{j}" for j in range(i - i % 4, min(count, i - i % 4 + 4)) if j != i)
        elif links == "switch":
            peers = tuple(f"{name}-g{j}" for j in range(count) if j != i)
        else:
            peers = ()
        gpus.append(
            GpuDevice(
                uuid=f"{name}-g{i}",
                index=i,
                model="H100" if big or i % 2 else "A100",
                memory_mib=81920 if big or i % 2 else 40960,
                split_count=rng.choice((4, 4, 10)),
                healthy=rng.random() > 0.05,
                nvlink_peers=peers,
                numa=(i * 2 // count) if numa_split else None,
            )
        )
    inv = NodeInventory(
        name=name,
        gpus=tuple(gpus),
        cpu_milli=rng.choice((0, 0, 16000, 32000)),
        memory_mib=rng.choice((0, 0, 131072)),
    )
    if rng.random() < 0.15:
        inv = dataclasses.replace(inv, cordon=Cordon(frozenset({f"{name}-g{rng.randrange(count)}"})))
    return inv


def _cluster(seed: int, nodes: int = 16) -> ClusterState:
    """Nodes whose GPUs take slices from a few fill levels, so states repeat on a node and across nodes."""
    rng = random.Random(seed)
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(nodes):
        name = f"n{n:02d}"
        inv = _node_inventory(name, rng)
        state.upsert_node(inv)
        for g in inv.gpus:
            for k in range(rng.choice((0, 0, 1, 1, 2, 3))):
                pct = rng.choice((10, 20, 25, 50, 100))
                cores = rng.choice((pct, pct, 0))
                devs = (DeviceSlice(uuid=g.uuid, index=g.index, memory_mib=g.memory_mib * pct // 100, cores=cores),)
                a = dataclasses.replace(_assignment(name, devs), role=rng.choice(list(Role)), model=rng.choice(MODELS))
                if state.check(a) is None:
                    state.apply(
                        f"bg/{name}-{g.index}-{k}",
                        a,
                        HostUse(cpu_milli=rng.choice((0, 1000, 2000)), memory_mib=rng.choice((0, 8192))),
                    )
    return state


def _assignment(node: str, devices: tuple[DeviceSlice, ...]) -> Any:
    from vgpu.annotations import Assignment

    return Assignment(node=node, containers=(ContainerAssignment("main", devices),))


def _pod(rng: random.Random, i: int) -> PodInfo:
    containers = []
    for c in range(rng.choice((1, 1, 1, 2, 3))):
        limits: dict[str, Any] = {"gpu": rng.choice((1, 2, 2, 3, 4, 8))}
        if rng.random() < 0.3:
            limits["gpumem"] = rng.choice((4000, 20000, 40960, 81920))
        else:
            limits["gpumem_percentage"] = rng.choice((10, 25, 30, 50, 100))
        if rng.random() < 0.6:
            limits["gpucores"] = rng.choice((0, 10, 30, 50, 100))
        containers.append(make_container(f"c{c}", **limits))
    labels: dict[str, str] = {}
    role = rng.choice((None, None, "prefill", "decode"))
    if role is not None:
        labels["llm-d.ai/role"] = role
    model = rng.choice(MODELS)
    if model is not None:
        labels["llm-d.ai/model"] = model.split("/")[1]
    annotations: dict[str, str] = {}
    if rng.random() < 0.2:
        annotations[POD_REQUIRE_NVLINK] = "true"
    if rng.random() < 0.1:
        annotations["nvidia.com/use-gputype"] = "H100"
    doc = make_pod(f"p{i}", containers, labels=labels, annotations=annotations)
    if rng.random() < 0.5:
        doc["spec"]["containers"][0]["resources"]["requests"] = rng.choice(
            ({"cpu": "4", "memory": "8Gi"}, {"cpu": "1"})
        )
    return pod_info(doc, track_host_resources=True)


def _configs() -> list[PlacementConfig]:
    base = PlacementConfig(node_policy="default")
    return [
        base,
        dataclasses.replace(base, topology=False),
        dataclasses.replace(base, allow_unhealthy=True),
        dataclasses.replace(base, roles=RoleRules(gpu_role_order=False)),
    ]


def _binpack(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return -u.used_share


def _tie(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return 0.0


def _ranks(node: NodeState, pod: PodInfo, policy: Fgd) -> list[tuple[str, Any]]:
    """(label, a factory of a fresh GPU order): each fit gets its own, so no order's caches are shared."""
    return [
        ("fgd", lambda: policy.node_gpu_rank(node, pod)),
        ("binpack", lambda: _binpack),
        ("tie", lambda: _tie),
    ]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_fit_node_decides_what_the_plain_fit_decides(seed: int) -> None:
    state = _cluster(seed)
    rng = random.Random(1000 + seed)
    pods = [_pod(rng, i) for i in range(30)]
    policy = Fgd()
    for pod in pods[:10]:
        policy.observe(pod)
    placed = failed = multi = 0
    for config in _configs():
        for pod in pods:
            for node in state.nodes.values():
                for label, make in _ranks(node, pod, policy):
                    want = _reference_fit(node, pod, config, make())
                    got = fit_node(node, pod, config, make())
                    assert got == want, (label, node.name, pod.request, config)
                    assert repr(got) == repr(want)
                    with_memo = fit_node(node, pod, config, make(), ShapeMemo())
                    assert with_memo == want, (label, node.name, pod.request, "memo")
                    placed += isinstance(want, NodePlacement)
                    failed += isinstance(want, FitFailure)
                    multi += isinstance(want, NodePlacement) and sum(len(c.devices) for c in want.containers) > 1
    # Both outcomes are exercised in earnest, multi-GPU placements among them.
    assert multi > 300 and failed > 300, (placed, multi, failed)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_the_score_of_several_slices_is_the_fragmentation_model_s(seed: int) -> None:
    """fgd and fragaware score a multi-slice placement with the node's own fragmentation the GPU order started from:
    the same float as working it out from the node (host room tracked or not, one or several containers)."""
    from vgpu.placement.fragaware import FragAware
    from vgpu.placement.gpushare import frees_after, host_after

    state = _cluster(seed)
    rng = random.Random(2000 + seed)
    pods = [_pod(rng, i) for i in range(30)]
    checked = 0
    for policy in (Fgd(), FragAware()):
        for pod in pods[:8]:
            policy.observe(pod)
        for pod in pods:
            for node in state.nodes.values():
                fit = fit_node(node, pod, state.config, policy.node_gpu_rank(node, pod))
                if not isinstance(fit, NodePlacement) or sum(len(c.devices) for c in fit.containers) < 2:
                    continue
                got = policy.score(node, fit, pod)
                model = policy.model_for(pod)
                cpu, mem = host_after(node, pod)
                want = model.frag(node, frees_after(node, fit), cpu, mem) - model.node_frag(node)
                assert policy.delta(node, fit, pod) == want
                assert got == policy.score(node, fit, pod)
                checked += 1
    assert checked > 100, checked


def test_frees_after_is_each_gpu_s_free_share_less_what_the_placement_takes() -> None:
    from vgpu.placement.gpushare import free_milli, frees_after, slice_milli

    state = _cluster(21)
    rng = random.Random(21)
    policy = Fgd()
    checked = 0
    for pod in [_pod(rng, i) for i in range(30)]:
        for node in state.nodes.values():
            fit = fit_node(node, pod, state.config, policy.node_gpu_rank(node, pod))
            if not isinstance(fit, NodePlacement):
                continue
            taken: dict[str, int] = {}
            for d in (d for c in fit.containers for d in c.devices):
                taken[d.uuid] = taken.get(d.uuid, 0) + slice_milli(d.memory_mib, d.cores, node.by_uuid[d.uuid])
            want = [max(0, free_milli(u) - taken.get(u.device.uuid, 0)) for u in node.gpus]
            assert frees_after(node, fit) == want
            checked += bool(taken)
    assert checked > 100, checked
