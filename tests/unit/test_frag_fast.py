"""The first evaluation of a node class's cheaper arithmetic gives the plain computation's floats, bit for bit.

`FragModel.frag_sorted` tests a task by a plan made per (GPU model, card size, host room) instead of every condition
each time, `FragModel.growths` keeps a node signature's growths in one table with its own fragmentation worked out
once, fgd's GPU order reads that table, `role_parts` counts with plain loops and `free_after` answers a repeated ask
from its last answer. Each is checked here against the plain computation written out as it was (`_plain_frag`,
`_plain_role_parts`, `_plain_free`) on random workloads, GPU frees, host rooms, nodes and placements, several seeds;
equal means equal floats (`==` and the same repr, so a last-bit difference fails).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from tests.unit.test_fit_multi_fast import _cluster, _pod
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import RoleRules
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import NodePlacement, ShapeMemo, counterpart, fit_node
from vgpu.placement import role_score
from vgpu.placement.fgd import Fgd, _FragRank, quantized
from vgpu.placement.frag import FragModel, TaskShape
from vgpu.placement.fragaware import FragAware
from vgpu.placement.gpushare import MILLI, free_milli, host_after, host_free, node_frees, slice_milli
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, Holder, HostUse, NodeState


def _same(a: float, b: float) -> bool:
    return a == b and repr(a) == repr(b)


def _plain_frag(model: FragModel, node: NodeState, frees: Sequence[int], cpu_free: int, mem_free: int) -> float:
    """`FragModel.frag` as the FGD paper states it: per task, every condition tested and the frees summed one by one."""
    if not node.gpus:
        return 0.0
    g0 = node.gpus[0]
    gpu_model = g0.device.model
    idle = sum(frees)
    out = 0.0
    if not idle:
        return out
    full = sum(1 for f in frees if f >= MILLI)
    for shape, p in model.workload:
        milli = shape.milli_on(g0) if shape.count else 0
        if (
            shape.count == 0
            or shape.cpu_milli > cpu_free
            or shape.memory_mib > mem_free
            or (shape.models is not None and gpu_model not in shape.models)
            or (milli >= MILLI and full < shape.count)
            or max(frees) < milli
        ):
            out += p * idle
        elif milli >= MILLI:
            out += p * (idle - full * MILLI)
        else:
            out += p * sum(f for f in sorted(frees) if f < milli)
    return out


def _workload(rng: random.Random) -> list[tuple[TaskShape, float]]:
    shapes = []
    for _ in range(rng.randint(1, 14)):
        count = rng.choice((0, 1, 1, 1, 2, 4, 8))
        pct = rng.choice((None, 10, 20, 25, 50, 100))
        mib = None if pct is not None else rng.choice((4000, 20000, 81920))
        cores = rng.choice((None, None, 0, 30, 100))
        models = rng.choice((None, None, frozenset({"H100"}), frozenset({"A100"})))
        shape = TaskShape(
            rng.choice((0, 0, 4000, 64000)), rng.choice((0, 0, 8192, 200000)), count, (mib, pct, cores), models
        )
        shapes.append(shape)
    weights = [rng.random() for _ in shapes]
    total = sum(weights)
    return [(s, w / total) for s, w in zip(shapes, weights, strict=True)]


def _bare_node(rng: random.Random, name: str) -> NodeState:
    model = rng.choice(("H100", "A100"))
    size = 81920 if model == "H100" else 40960
    gpus = tuple(
        GpuDevice(uuid=f"{name}-g{i}", index=i, model=model, memory_mib=size, split_count=4)
        for i in range(rng.choice((1, 2, 4, 8, 8, 16)))
    )
    return NodeState.of(NodeInventory(name=name, gpus=gpus))


def _frees(rng: random.Random, n: int) -> list[int]:
    levels = (0, 0, 100, 250, 500, 750, 800, 1000, 1000, 1000, rng.randrange(1001))
    return [rng.choice(levels) for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_frag_sorted_is_the_plain_sum(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        model = FragModel(_workload(rng))
        for k in range(30):
            node = _bare_node(rng, f"n{k}")
            frees = _frees(rng, len(node.gpus))
            cpu, mem = rng.choice(((1 << 40, 1 << 40), (2000, 8192), (64000, 1 << 40), (0, 0), (4000, 200000)))
            got = model.frag(node, frees, cpu, mem)
            assert _same(got, _plain_frag(model, node, frees, cpu, mem)), (frees, cpu, mem)
            assert _same(model.frag(node, frees, cpu, mem), got)  # from the memo


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_growth_is_the_plain_fragmentation_after_less_before(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(30):
        model = FragModel(_workload(rng))
        nodes = [_bare_node(rng, f"n{k}") for k in range(8)]
        for _ in range(60):
            node = rng.choice(nodes)
            frees = _frees(rng, len(node.gpus))
            sig = tuple(sorted(frees))
            free = rng.choice(frees)
            take = rng.choice((100, 200, 250, 300, 500, 1000, rng.randint(1, 1000)))
            cpu, mem = rng.choice(((1 << 40, 1 << 40), (4000, 8192), (64000, 200000)))
            host = (cpu, mem, cpu - rng.choice((0, 1000)), mem - rng.choice((0, 4096)))
            after = list(frees)
            after[frees.index(free)] = max(0, free - take)
            want = _plain_frag(model, node, after, host[2], host[3]) - _plain_frag(model, node, frees, host[0], host[1])
            assert _same(model.growth(node, sig, free, take, host), want), (sig, free, take, host)
            assert _same(model.growths(node, sig, host).of(node, free, take), want)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_fragmentation_after_several_gpus_give_is_the_plain_sum(seed: int) -> None:
    """`Growths.frag_after` (fgd's score of a placement of several slices) swaps the changed GPUs' terms in the
    table's integers: the plain fragmentation of the frees after, bit for bit; None only where the changed GPUs held
    every largest free."""
    rng = random.Random(seed)
    answered = declined = 0
    for _ in range(30):
        model = FragModel(_workload(rng))
        nodes = [_bare_node(rng, f"n{k}") for k in range(8)]
        for _ in range(60):
            node = rng.choice(nodes)
            frees = _frees(rng, len(node.gpus))
            sig = tuple(sorted(frees))
            cpu, mem = rng.choice(((1 << 40, 1 << 40), (4000, 8192), (64000, 200000)))
            host = (cpu, mem, cpu - rng.choice((0, 1000)), mem - rng.choice((0, 4096)))
            table = model.growths(node, sig, host)
            if rng.random() < 0.5:  # a table that grew first, or one asked this first
                table.of(node, frees[0], 100)
            at = rng.sample(range(len(frees)), rng.randint(1, len(frees)))
            takes = [rng.choice((100, 250, 300, 500, 1000, rng.randint(1, 1000))) for _ in at]
            after = list(frees)
            for i, t in zip(at, takes, strict=True):
                after[i] = max(0, frees[i] - t)
            got = table.frag_after(node, [(frees[i], t) for i, t in zip(at, takes, strict=True)])
            if got is None:
                assert sum(frees[i] == max(frees) for i in at) == frees.count(max(frees))
                declined += 1
                continue
            assert _same(got, _plain_frag(model, node, after, host[2], host[3])), (frees, at, takes, host)
            answered += 1
    assert answered > 500 and declined > 50, (answered, declined)


def _one_slice_pods(rng: random.Random, n: int) -> list[PodInfo]:
    pods = []
    while len(pods) < n:
        pod = _pod(rng, len(pods))
        reqs = pod.request.containers
        if len(reqs) == 1 and reqs[0].count == 1:
            pods.append(pod)
    return pods


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("policy_type", [Fgd, FragAware])
def test_the_gpu_order_and_score_are_the_plain_growth(seed: int, policy_type: type[Fgd]) -> None:
    """fgd's order on a node (its table of growths shared with other nodes of the signature) and the score that reuses
    it are the plain fragmentation's: every GPU's rank, then the chosen GPU's score."""
    state = _cluster(seed, nodes=24)
    rng = random.Random(seed)
    policy = policy_type()
    for pod in _one_slice_pods(rng, 12):
        policy.observe(pod)
    for pod in _one_slice_pods(rng, 10):
        model = policy.model_for(pod)
        req = pod.request.containers[0]
        for node in state.nodes.values():
            rank = policy.node_gpu_rank(node, pod)
            cpu, mem = host_free(node)
            frees = list(node_frees(node))
            for u in node.gpus:
                mem_mib, cores = req.memory_on(u.device.memory_mib), req.cores_on(u.device.memory_mib)
                take = slice_milli(mem_mib, cores, u)
                after = list(frees)
                i = node.positions[u.device.uuid]
                after[i] = max(0, after[i] - take)
                grown = _plain_frag(model, node, after, cpu - pod.cpu_milli, mem - pod.memory_mib) - _plain_frag(
                    model, node, frees, cpu, mem
                )
                want = -quantized(grown) if policy.gpu_steps else grown
                assert _same(rank(u, mem_mib, cores, pod), want)
            fit = fit_node(node, pod, state.config, rank, ShapeMemo())
            if not isinstance(fit, NodePlacement):
                continue
            after = list(frees)
            d = fit.containers[0].devices[0]
            i = node.positions[d.uuid]
            after[i] = max(0, after[i] - slice_milli(d.memory_mib, d.cores, node.by_uuid[d.uuid]))
            cpu_after, mem_after = host_after(node, pod)
            delta = _plain_frag(model, node, after, cpu_after, mem_after) - _plain_frag(model, node, frees, cpu, mem)
            assert _same(policy.score(node, fit, pod), quantized(delta, policy.scale) / 100)


def _plain_free(node: NodeState, placement: NodePlacement) -> float:
    added: dict[str, tuple[int, int]] = {}
    for c in placement.containers:
        for d in c.devices:
            m, k = added.get(d.uuid, (0, 0))
            added[d.uuid] = (m + d.memory_mib, k + d.cores)
    out = []
    for u in node.gpus:
        m, k = added.get(u.device.uuid, (0, 0))
        dev = u.device
        out.append(max(0.0, 1.0 - max((u.memory_used + m) / dev.memory_mib, (u.cores_used + k) / dev.cores)))
    return sum(out)


def _is(role: Role, kind: Role) -> bool:
    return role.does_prefill if kind.does_prefill else role.does_decode


def _plain_role_parts(
    node: NodeState, placement: NodePlacement, pod: PodInfo, rules: RoleRules
) -> tuple[float, float | None]:
    """`role_parts` as it was written before: a list of the slices, `any` over holders and the node's pairs."""
    other = counterpart(pod.role)
    if other is None:
        return 0.0, None
    slices = [d for c in placement.containers for d in c.devices]
    score = 0.0
    if slices:
        complement = pair = 0
        prefill = pod.role.does_prefill
        for d in slices:
            u = node.by_uuid[d.uuid]
            if prefill and u.prefill > 0:
                pair += 1
            if u.holders and any(_is(h.role, other) and h.model == pod.model for h in u.holders):
                complement += 1
        score += rules.complementarity_weight * complement / len(slices)
        score -= rules.complementarity_weight * rules.prefill_pair_penalty * pair / len(slices)
    if pod.model is not None:
        here = [role for (role, model), n in node.role_models.items() if model == pod.model and n > 0]
        has_other = any(_is(role, other) for role in here)
        if has_other and not (pod.role.does_decode and any(role.does_decode for role in here)):
            score += rules.locality_weight
        elif here and not has_other:
            score += rules.pool_weight
    if rules.headroom_weight and rules.pair_headroom_gpus > 0:
        return score, rules.headroom_weight * min(1.0, _plain_free(node, placement) / rules.pair_headroom_gpus)
    return score, None


def _placement(rng: random.Random, node: NodeState) -> NodePlacement:
    containers = []
    for c in range(rng.choice((0, 1, 1, 1, 2))):
        gpus = rng.sample(node.gpus, rng.randint(0, min(3, len(node.gpus))))
        devs = tuple(
            DeviceSlice(
                uuid=u.device.uuid,
                index=u.device.index,
                memory_mib=u.device.memory_mib * rng.choice((10, 25, 50)) // 100,
                cores=rng.choice((0, 10, 30)),
            )
            for u in gpus
        )
        containers.append(ContainerAssignment(f"c{c}", devs))
    return NodePlacement(node.name, tuple(containers))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_role_parts_are_the_plain_role_score(seed: int) -> None:
    state = _cluster(seed, nodes=24)
    rng = random.Random(seed)
    rules_all = [RoleRules(), RoleRules(headroom_weight=0.0), RoleRules(pair_headroom_gpus=40.0, pool_weight=0.1)]
    pods = [_pod(rng, i) for i in range(30)]
    for pod in pods:
        for node in state.nodes.values():
            for _ in range(3):
                placement = _placement(rng, node)
                rules = rng.choice(rules_all)
                got = role_score.role_parts(node, placement, pod, rules)
                want = _plain_role_parts(node, placement, pod, rules)
                assert _same(got[0], want[0]), (pod.role, pod.model, placement)
                assert (got[1] is None) == (want[1] is None)
                if got[1] is not None and want[1] is not None:
                    assert _same(got[1], want[1])


def test_free_after_answers_again_only_for_the_same_placement_node_and_version() -> None:
    """The repeated ask is answered from the last one; another placement, another node object (a stand-in's copy) or
    a new version of the node is worked out afresh."""
    rng = random.Random(7)
    state = _cluster(3, nodes=8)
    for name, node in state.nodes.items():
        first = _placement(rng, node)
        assert _same(role_score.free_after(node, first), _plain_free(node, first))
        assert _same(role_score.free_after(node, first), _plain_free(node, first))
        other = _placement(rng, node)
        assert _same(role_score.free_after(node, other), _plain_free(node, other))
        copy = node.copy()
        dev = node.gpus[0].device
        taken = (DeviceSlice(uuid=dev.uuid, index=dev.index, memory_mib=dev.memory_mib // 10, cores=10),)
        copy.take("bg/extra", Assignment(node=name, containers=(ContainerAssignment("c", taken),)))
        assert _same(role_score.free_after(copy, other), _plain_free(copy, other))
        assert _same(role_score.free_after(node, other), _plain_free(node, other))
        # The node itself moves on: same object, same placement, a new version.
        before = role_score.free_after(node, other)
        a = Assignment(node=name, containers=(ContainerAssignment("c", taken),), role=Role.DECODE)
        if state.check(a) is None:
            state.apply(f"bg/more-{name}", a, HostUse())
            now = role_score.free_after(node, other)
            assert _same(now, _plain_free(node, other))
            assert now != before or _plain_free(node, other) == before


def test_plans_fold_in_only_what_the_host_and_model_decide() -> None:
    """A task that can never run on the node (host room, model) counts all idle GPU whatever the frees; a whole-card
    task needs `count` free cards; a shared task only its slice: one plan per host room serves every signature."""
    shapes = [
        (TaskShape(0, 0, 1, (None, 25, None), None), 0.25),
        (TaskShape(8000, 0, 1, (None, 50, None), None), 0.25),
        (TaskShape(0, 0, 2, (None, 100, None), None), 0.25),
        (TaskShape(0, 0, 1, (None, 10, None), frozenset({"A100"})), 0.25),
    ]
    model = FragModel(shapes)
    node = NodeState.of(
        NodeInventory(
            name="n",
            gpus=tuple(GpuDevice(uuid=f"g{i}", index=i, model="H100", memory_mib=81920) for i in range(4)),
        )
    )
    for frees in ([1000, 1000, 0, 0], [1000, 300, 300, 0], [200, 200, 200, 200], [0, 0, 0, 0], [1000] * 4):
        for cpu in (4000, 16000):
            assert _same(model.frag(node, frees, cpu, 1 << 40), _plain_frag(model, node, frees, cpu, 1 << 40))


def test_the_random_clusters_hold_what_the_fast_paths_meet() -> None:
    """The differential clusters above hold what the fast paths must meet: repeated states, P/D holders of several
    models, host room tracked on some nodes, two card sizes."""
    state: ClusterState = _cluster(1, nodes=24)
    nodes = list(state.nodes.values())
    assert any(n.inventory.cpu_milli for n in nodes) and any(not n.inventory.cpu_milli for n in nodes)
    assert any(len({u.device.memory_mib for u in n.gpus}) > 1 for n in nodes)
    assert any(u.holders and u.holders[0].model is not None for n in nodes for u in n.gpus)
    assert len({u.state_id for n in nodes for u in n.gpus}) < sum(len(n.gpus) for n in nodes)


def _odd_node(rng: random.Random, name: str) -> NodeState:
    """A node whose GPUs are filled by memory or by SMs, some past their capacity (an over-committing config, or
    the slices of a restart's replay), with other SM capacities than 100."""
    model = rng.choice(("H100", "A100"))
    size = 81920 if model == "H100" else 40960
    cores = rng.choice((100, 50, 30))
    gpus = tuple(
        GpuDevice(uuid=f"{name}-g{i}", index=i, model=model, memory_mib=size, cores=cores, split_count=8)
        for i in range(rng.choice((1, 2, 4, 8)))
    )
    node = NodeState.of(NodeInventory(name=name, gpus=gpus))
    for u in node.gpus:
        for k in range(rng.choice((0, 1, 2, 3))):
            mem = rng.choice((0, 1000, size // 4, size // 2, size))
            held = rng.choice((0, 10, cores // 3, cores, cores * 2))
            u.add(Holder(f"p{k}", rng.choice(list(Role)), None, mem, held))
    return node


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_frees_terms_and_the_gpu_order_s_take_are_the_plain_formulas(seed: int) -> None:
    """`node_frees`, the headroom's per-GPU terms and fgd's GPU order work out `free_milli`, `GpuUsage.used_share` and
    `slice_milli` inline: the same numbers on GPUs filled by memory or by SMs, past capacity, and for slices larger
    than the card (a config that scales memory or SMs up)."""
    rng = random.Random(seed)
    model = FragModel(_workload(rng))
    for k in range(200):
        node = _odd_node(rng, f"n{k}")
        assert node_frees(node) == tuple(free_milli(u) for u in node.gpus)
        terms = role_score.free_terms(node)
        plain = tuple(max(0.0, 1.0 - u.used_share) for u in node.gpus)
        assert all(_same(a, b) for a, b in zip(terms, plain, strict=True)), (terms, plain)
        policy = Fgd()
        policy._model = model
        pod = _one_slice_pods(rng, 1)[0]
        rank = policy.node_gpu_rank(node, pod)
        assert isinstance(rank, _FragRank)
        for u in node.gpus:
            mem = rng.choice((0, 1000, u.device.memory_mib // 3, u.device.memory_mib, 2 * u.device.memory_mib))
            cores = rng.choice((0, 1, u.device.cores // 2, u.device.cores, 3 * u.device.cores))
            take = slice_milli(mem, cores, u)
            want = model.growth(node, rank.sig, rank.frees[node.positions[u.device.uuid]], take, rank.host)
            assert _same(rank(u, mem, cores, pod), -quantized(want)), (mem, cores, take)
