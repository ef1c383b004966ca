from __future__ import annotations

from typing import Any

import pytest

from tests.unit.policy_helpers import choice, cluster, node, place, pod
from vgpu import fit
from vgpu.placement import randomfit
from vgpu.placement.base import PodScored
from vgpu.replay.trace import to_pod_info


def test_choices_vary_by_pod_but_repeat_for_the_same_pod() -> None:
    planner = cluster("random", *(node(f"n{i}") for i in range(6)))
    picks = {choice(planner, pod(500))[0] for _ in range(30)}
    assert len(picks) >= 3
    row = pod(500)
    assert choice(planner, row) == choice(planner, row)


def test_epoch_never_moves_so_fits_stay_cached() -> None:
    p = randomfit.create()
    before = p.epoch
    p.observe(to_pod_info(pod(), "x"))
    assert p.epoch == before
    assert isinstance(p, PodScored)


def test_node_choice_is_roughly_uniform_over_feasible_nodes() -> None:
    planner = cluster("random", *(node(f"n{i}") for i in range(4)))
    counts: dict[str, int] = {}
    for _ in range(800):
        name = choice(planner, pod(100))[0]
        counts[name] = counts.get(name, 0) + 1
    assert set(counts) == {f"n{i}" for i in range(4)}
    assert all(150 <= c <= 250 for c in counts.values()), counts


def test_gpu_choice_is_drawn_afresh_for_every_placement_on_a_node() -> None:
    planner = cluster("random", node("n0", gpus=8))
    gpus = set()
    for _ in range(12):
        row = pod(50)
        name, idx = choice(planner, row)
        place(planner, name, row, idx[0])
        gpus.add(idx[0])
    assert len(gpus) >= 4


@pytest.mark.parametrize("pods", [5, 40])
def test_node_fits_stay_cached_across_pods_of_one_shape(pods: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = fit.fit_node

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr("vgpu.planner.fit_node", counting)
    planner = cluster("random", *(node(f"n{i}") for i in range(10)))
    for _ in range(pods):
        choice(planner, pod(500))
    assert calls == 10  # one fit per node; the per-pod scores are recomputed without re-fitting
