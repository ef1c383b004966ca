"""Review of the planner's node classes for pods of several slices (`vgpu.planner._share_multi`, `_multi_ties`,
`_split_key`): cases the class-key differential test (tests/unit/test_planner_multi_classes.py) does not draw.

Nodes whose GPUs differ in memory size (an 80 GiB and a 40 GiB card in one node, at shuffled indices), pods of
several containers each asking several GPUs, absolute gpumem beside percentages, a GPU model filter, host room
tracked, GPUs on two NUMA nodes. Every node's answer (GPU UUIDs in order, score to the bit, failure reason) must be
what the uncached `Planner.evaluate_node` gives. Also: a shape's classes stay bounded through churn.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import vgpu.planner as planner_mod
from tests.conftest import make_assignment, make_container, make_info, make_node
from tests.unit.test_fit_fast import _fresh, _same
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, HostUse

BIG, SMALL = 81920, 40960


def _pods() -> list[PodInfo]:
    c = make_container
    return [
        make_info("a", containers=[c("x", gpu=2, gpumem_percentage=30, gpucores=30), c("y", gpu=2, gpumem=20000)]),
        make_info("b", containers=[c("x", gpu=3, gpumem=30000, gpucores=20), c("y", gpu=2, gpumem_percentage=40)]),
        make_info("c", gpu=3, gpumem=35000, gpucores=25),
        make_info("d", gpu=2, gpumem_percentage=50, gpucores=50),
        make_info("e", gpu=4, gpumem_percentage=100, gpucores=100),
        make_info(
            "f",
            role="decode",
            model="m",
            containers=[c("x", gpu=2, gpumem_percentage=20, gpucores=20), c("y", gpu=2, gpumem=10000, gpucores=10)],
        ),
        make_info("g", role="prefill", model="m", gpu=3, gpumem=16000, gpucores=15),
        make_info("h", gpu=2, gpumem=20000, gpucores=20, annotations={"vgpu.io/use-gpu-models": "H100"}),
        make_info("i", containers=[c("x", gpu=1, gpumem=50000), c("y", gpu=1, gpumem=50000)]),
    ]


def _cluster(seed: int, policy: str, nodes: int = 40) -> ClusterState:
    rng = random.Random(seed)
    fills = []
    for _ in range(4):
        fills.append(
            [
                [(rng.choice((10, 20, 25, 50)), rng.choice(list(Role)), rng.choice(("default/m", None)))]
                if rng.random() < 0.5
                else []
                for _ in range(8)
            ]
        )
    sizes = [BIG] * 4 + [SMALL] * 4
    state = ClusterState(PlacementConfig(node_policy=policy))
    for n in range(nodes):
        name = f"n{n:02d}"
        variant = rng.randrange(5)
        host = variant == 1
        inv = make_node(name, 8, split=4, cpu_milli=12000 if host else 0, host_memory_mib=65536 if host else 0)
        mem = list(sizes)
        rng.shuffle(mem)
        gpus: list[GpuDevice] = []
        for g in inv.gpus:
            gpus.append(
                dataclasses.replace(
                    g,
                    memory_mib=mem[g.index],
                    model="H100" if mem[g.index] == BIG else "A100",
                    numa=g.index // 4 if variant == 2 else None,
                )
            )
        state.upsert_node(dataclasses.replace(inv, gpus=tuple(gpus)))
        fill = fills[rng.randrange(len(fills))]
        for g, slices in enumerate(fill):
            for k, (pct, role, model) in enumerate(slices):
                a = make_assignment(name, [(g, mem[g] * pct // 100, pct)], role=role, model=model)
                if state.check(a) is None:
                    state.apply(f"bg/{name}-{g}-{k}", a, HostUse(cpu_milli=500 if host else 0))
    return state


def _exact(ev: Evaluation, fresh: Evaluation) -> None:
    _same(ev, fresh)
    assert {n: repr(r.score) for n, r in ev.feasible.items()} == {n: repr(r.score) for n, r in fresh.feasible.items()}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["default", "fgd", "fragaware-gpusteps"])
def test_mixed_card_sizes_and_several_multi_gpu_containers_decide_as_each_node(seed: int, policy: str) -> None:
    state = _cluster(seed, policy)
    p = Planner(state)
    rng = random.Random(seed)
    pods = _pods()
    placed: list[str] = []
    for step in range(5):
        for pod in pods:
            p.observe(pod)
            ev = p.evaluate(pod)
            _exact(ev, _fresh(p, pod, list(state.nodes)))
        for b in range(3):
            pod = dataclasses.replace(pods[rng.randrange(len(pods))], name=f"b{step}-{b}", uid=f"uid-b{step}-{b}")
            best = p.evaluate(pod).best()
            if best is not None and best[1].placement is not None:
                state.apply(pod.key, best[1].placement.assignment(pod))
                placed.append(pod.key)
        if step % 2 and placed:
            state.release(placed.pop(0))


@pytest.mark.parametrize("gpus", [1, 2])  # one slice; several (`_share_multi`)
def test_a_shapes_node_classes_stay_bounded_through_churn(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    """Every node state a shape meets makes a class keyed by `NodeState.class_key`; churn moves nodes on and their old
    keys never come back, so at a steady epoch the classes grew by one per changed node evaluated (28,000 for 20
    nodes after 20,000 binds and releases). They stay within the bound, and the answers stay each node's own."""
    monkeypatch.setattr(planner_mod, "_CLASSES_MIN", 64)
    state = ClusterState(PlacementConfig(node_policy="default"))
    for n in range(20):
        state.upsert_node(make_node(f"n{n:02d}", 8, split=4, cpu_milli=64000, host_memory_mib=1 << 20))
    p = Planner(state)
    pod = make_info("s", gpu=gpus, gpumem_percentage=20, gpucores=20)
    rng = random.Random(gpus)
    live: list[str] = []
    most = 0
    for i in range(1500):
        name = f"n{rng.randrange(20):02d}"
        a = make_assignment(name, [(rng.randrange(8), 4096, 5)])
        if state.check(a) is None:
            state.apply(f"bg/{i}", a, HostUse(cpu_milli=rng.randrange(1, 2000), memory_mib=rng.randrange(1, 4000)))
            live.append(f"bg/{i}")
        if len(live) > 60:
            state.release(live.pop(rng.randrange(len(live))))
        if i % 3 == 0:
            ev = p.evaluate(pod)
            most = max(most, max((len(c) for c in p._classes.values()), default=0))
        if i % 150 == 0:
            _exact(ev, _fresh(p, pod, list(state.nodes)))
    assert most <= 64 + 20  # the bound, plus one pass's nodes before the next call clears
