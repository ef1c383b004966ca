from __future__ import annotations

from tests.unit.policy_helpers import choice, cluster, node, pod
from vgpu.placement import randomfit
from vgpu.replay.trace import to_pod_info


def test_choices_vary_by_pod_but_repeat_for_the_same_pod() -> None:
    planner = cluster("random", *(node(f"n{i}") for i in range(6)))
    picks = {choice(planner, pod(500))[0] for _ in range(30)}
    assert len(picks) >= 3
    row = pod(500)
    assert choice(planner, row) == choice(planner, row)


def test_epoch_moves_with_every_observed_pod() -> None:
    p = randomfit.create()
    before = p.epoch
    p.observe(to_pod_info(pod(), "x"))
    assert p.epoch == before + 1
