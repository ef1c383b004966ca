from __future__ import annotations

import pytest

from tests.unit.policy_helpers import choice, cluster, node, place, pod
from vgpu.placement import fgd
from vgpu.planner import Planner
from vgpu.replay.trace import to_pod_info


def _fgd_knowing_600s(*gpus: int, pods: int = 50) -> tuple[Planner, fgd.Fgd]:
    """An `fgd` planner over nodes a, b, ... with these GPU counts, whose workload is `pods` 600-milli pods."""
    planner = cluster("fgd", *(node(chr(ord("a") + i), gpus=g) for i, g in enumerate(gpus)))
    pol = planner.policy("fgd")
    assert isinstance(pol, fgd.Fgd)
    for _ in range(pods):
        pol.observe(to_pod_info(pod(600), "w"))
    return planner, pol


def test_avoids_leaving_a_gap_the_workload_cannot_use() -> None:
    planner, _pol = _fgd_knowing_600s(1, 1)
    place(planner, "a", pod(300))  # a has 700 free
    # bestfit would squeeze the 200 onto a (500 left: useless to 600-milli pods); fgd keeps a usable.
    name, _ = choice(planner, pod(200))
    assert name == "b"
    contrast = cluster("bestfit", node("a", gpus=1), node("b", gpus=1))
    place(contrast, "a", pod(300))
    assert choice(contrast, pod(200))[0] == "a"


def test_gpu_choice_inside_the_node_minimises_fragmentation() -> None:
    planner, _pol = _fgd_knowing_600s(2)
    place(planner, "a", pod(300), gpu=0)
    assert choice(planner, pod(200)) == ("a", [1])  # GPU 1 keeps 800 free, GPU 0 would keep only 500


def test_quantized_score_is_the_simulators_integer_sigmoid() -> None:
    assert fgd.quantized(0) == 50
    assert fgd.quantized(-8000) == 99
    assert fgd.quantized(8000) == 0


@pytest.mark.parametrize("delta", [-3000.0, -500.0, -40.0, 0.0, 35.0, 800.0, 5000.0])
def test_scale_stretches_the_steps(delta: float) -> None:
    assert fgd.quantized(2 * delta, 2000) == fgd.quantized(delta)
    assert fgd.Fgd.scale == 1000  # the baseline keeps the paper's steps


def test_cached_free_shares_follow_every_change_of_the_node() -> None:
    from vgpu.placement.gpushare import free_milli, node_frees

    planner = cluster("fgd", node("a", gpus=2))
    state = planner.state
    a = state.nodes["a"]
    assert node_frees(a) == (1000, 1000)
    row = pod(300)
    place(planner, "a", row, gpu=1)
    assert node_frees(a) == (1000, 700)  # a cached (1000, 1000) must not survive the placement
    state.release(to_pod_info(row, row.name).key)
    assert node_frees(a) == tuple(free_milli(u) for u in a.gpus) == (1000, 1000)


def test_gpu_rank_is_the_same_for_gpus_with_the_same_free_share() -> None:
    planner, pol = _fgd_knowing_600s(4, pods=20)
    place(planner, "a", pod(300), gpu=2)
    st = planner.state.nodes["a"]
    info = to_pod_info(pod(200), "q")
    rank = pol.node_gpu_rank(st, info)
    ranks = [rank(u, 20_000, 20, info) for u in st.gpus]
    assert ranks[0] == ranks[1] == ranks[3]  # whole GPUs are interchangeable (memoised per free share)
    assert ranks[2] != ranks[0]  # the partly used GPU is not
