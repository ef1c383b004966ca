"""The rank mapping kept up to date per bind (vgpu.planner.Ranked) always equals a full re-rank (to_priorities)."""

from __future__ import annotations

import random

import pytest

from tests.conftest import make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.planner import _RANKED, MAX_PRIORITY, Planner, Ranked, to_priorities
from vgpu.state import ClusterState

SHAPES: list[dict[str, object]] = [
    {"gpumem": 8192},
    {"gpu": 2, "gpumem_percentage": 30, "gpucores": 20},
    {"role": "decode", "model": "m", "gpumem": 10000, "gpucores": 10},
    {"gpu": 1},
]


def _refreshed(scores: dict[str, float], changes: dict[str, float | None]) -> dict[str, float]:
    """What Planner._refresh does to an evaluation's scores: changed nodes leave and come back last, in name order."""
    out = {n: s for n, s in scores.items() if n not in changes}
    for name in sorted(changes):
        if (score := changes[name]) is not None:
            out[name] = score
    return out


@pytest.mark.parametrize("seed", range(20))
def test_ranked_updates_equal_a_full_rerank_with_heavy_ties(seed: int) -> None:
    rng = random.Random(seed)
    levels = rng.choice([2, 3, 5, 40])  # few levels: thousands tie at the bound, as quantized scores do
    scores = {f"node-{i:04d}": rng.randrange(levels) / 4 for i in range(rng.choice([5, 70, 400]))}
    ranked = Ranked.of(scores, _RANKED)
    for _ in range(150):
        names = list(scores)
        changes: dict[str, float | None] = {}
        for name in rng.sample(names, min(len(names), rng.randint(1, 6))):
            changes[name] = None if rng.random() < 0.15 else rng.randrange(levels) / 4
        if rng.random() < 0.2:  # a new node
            changes[f"node-x{rng.randrange(10**6)}"] = rng.randrange(levels) / 4
        scores = _refreshed(scores, changes)
        ranked.update(sorted(changes), scores)
        prios = ranked.priorities()
        if prios is None:  # too few nodes known in order: the planner ranks all of them again
            ranked = Ranked.of(scores, _RANKED)
            prios = ranked.priorities()
        assert prios == to_priorities(scores, "rank")


def test_a_node_rescored_at_the_bound_leaves_a_correct_prefix() -> None:
    scores = {f"n{i:03d}": 1.0 for i in range(100)}
    ranked = Ranked.of(scores, 12)
    assert ranked.bound is not None and len(ranked.names) == 12
    last = ranked.names[-1]
    scores = _refreshed(scores, {last: 1.0})  # the same key again, now last in the dict order
    ranked.update([last], scores)
    assert ranked.names == Ranked.of(scores, 12).names[:11]
    assert ranked.priorities() == to_priorities(scores, "rank")


@pytest.mark.parametrize("seed", range(4))
def test_planner_priorities_after_each_bind_equal_a_full_rerank(seed: int) -> None:
    rng = random.Random(seed)
    p = Planner(ClusterState(PlacementConfig(node_policy=rng.choice(["binpack", "spread", "default"]))))
    for i in range(3 * _RANKED):
        p.state.upsert_node(make_node(f"n{i:03d}", rng.randint(1, 4), split=4))
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    placed: list[str] = []
    for step in range(150):
        if rng.random() < 0.25 and placed:
            p.state.release(placed.pop(rng.randrange(len(placed))))
        else:
            pod = make_info(f"q{step}", **rng.choice(SHAPES))  # type: ignore[arg-type]
            prios = p.priorities_for(pod, list(p.state.nodes))
            if prios:
                best = max(prios, key=prios.__getitem__)
                placement = p.evaluate(pod).feasible[best].placement
                assert placement is not None
                p.state.apply(pod.key, placement.assignment(pod))
                placed.append(pod.key)
        for pod in pods:
            ev = p.evaluate(pod)
            prios = p.priorities(ev)
            assert prios == to_priorities(ev.scores, "rank")
            assert len(prios) == min(MAX_PRIORITY, len(ev.feasible))
