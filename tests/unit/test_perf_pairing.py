"""P/D pairing where capacity allows it (vgpu.perf.pairing): which unpaired prefills count against a policy.

Placements are forced onto chosen GPUs (as any policy might choose them); the chances are recorded with the
planner's filter exactly as `vgpu.perf.bench.run` records them.
"""

from __future__ import annotations

import pytest

from tests.conftest import GPU_MEM, make_assignment, make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.perf import cluster
from vgpu.perf.pairing import PairingChances, feasible_nodes
from vgpu.perf.params import H200, PerfParams
from vgpu.perf.workload import TEMPLATES, Deployment
from vgpu.roles import Role
from vgpu.state import ClusterState

DEP = Deployment("m", "default", TEMPLATES["llama-8b"], decode=1, prefill=1)


def _cluster(*gpus: int) -> tuple[ClusterState, PairingChances]:
    state = ClusterState(PlacementConfig())
    for i, n in enumerate(gpus):
        state.upsert_node(make_node("abcd"[i], n))
    return state, PairingChances()


def _put(state: ClusterState, chances: PairingChances, name: str, role: str, node: str, gpu: int, mem: int) -> None:
    """Place a pod of model default/m on `node`/`gpu` (mem MiB, 40 % SMs), recording its chances first."""
    pod = make_info(name, role=role, model="m", gpumem=mem, gpucores=40)
    feasible = chances.before_place(state, pod)
    state.apply(pod.key, make_assignment(node, [(gpu, mem, 40)], role=Role(role), model="default/m"))
    chances.placed(state, pod, feasible)


def _metrics(state: ClusterState, chances: PairingChances) -> cluster.Metrics:
    return cluster.evaluate(state, [DEP], H200, PerfParams(), chances)[0]


def test_a_paired_prefill_counts_and_one_with_no_room_next_to_any_decode_is_excluded() -> None:
    state, chances = _cluster(2, 1)
    _put(state, chances, "d", "decode", "a", 0, 40000)
    _put(state, chances, "p1", "prefill", "a", 1, GPU_MEM)  # paired
    # a's GPU 0 has 41,920 MiB left and GPU 1 none: no node holding the decode admits a 50,000 MiB prefill.
    p2 = make_info("p2", role="prefill", model="m", gpumem=50000, gpucores=40)
    assert feasible_nodes(state, p2, state.config) == {"b"}
    _put(state, chances, "p2", "prefill", "b", 0, 50000)
    m = _metrics(state, chances)
    assert m.pair_node == pytest.approx(0.5)
    assert m.pairable == pytest.approx(0.5)
    assert m.pair_node_capacity == pytest.approx(1.0)


def test_an_avoidable_unpaired_prefill_counts_against() -> None:
    state, chances = _cluster(2, 1)
    _put(state, chances, "d", "decode", "a", 0, 40000)
    _put(state, chances, "p", "prefill", "b", 0, 20000)  # node a had room for it
    assert chances.had_chance("default/p")
    m = _metrics(state, chances)
    assert (m.pair_node, m.pairable, m.pair_node_capacity) == (0.0, 1.0, 0.0)


@pytest.mark.parametrize(("a_full", "counts"), [(False, True), (True, False)])
def test_a_decode_placed_after_its_prefill_gives_it_a_chance_only_if_its_node_had_room(
    a_full: bool, counts: bool
) -> None:
    state, chances = _cluster(1, 1)
    _put(state, chances, "p", "prefill", "a", 0, GPU_MEM if a_full else 20000)
    assert not chances.had_chance("default/p")  # no decode of the pool anywhere yet
    _put(state, chances, "d", "decode", "b", 0, 40000)
    m = _metrics(state, chances)
    assert m.pair_node == 0.0
    assert m.pairable == (1.0 if counts else 0.0)
    assert m.pair_node_capacity == (0.0 if counts else 1.0)


def test_a_decode_scaled_away_takes_its_chance_with_it() -> None:
    state, chances = _cluster(2, 1)
    _put(state, chances, "d", "decode", "a", 0, 40000)
    _put(state, chances, "p", "prefill", "a", 1, 20000)
    assert _metrics(state, chances).pair_node_capacity == 1.0
    state.release("default/d")
    chances.released("default/d")
    m = _metrics(state, chances)
    assert (m.pair_node, m.pairable) == (0.0, 0.0)
    # A new decode reusing the name is a new decision: it went to b while a had room, a missed chance.
    _put(state, chances, "d", "decode", "b", 0, 40000)
    assert _metrics(state, chances).pair_node_capacity == 0.0


def test_without_recorded_chances_every_prefill_counts() -> None:
    state, chances = _cluster(1, 1)
    _put(state, chances, "d", "decode", "a", 0, 40000)
    _put(state, chances, "p", "prefill", "b", 0, 20000)
    m = cluster.evaluate(state, [DEP], H200, PerfParams())[0]
    assert (m.pairable, m.pair_node_capacity) == (1.0, m.pair_node)
