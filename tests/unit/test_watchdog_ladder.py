"""The pure enforcement state machine: observations in, actions out, no clock or apiserver."""

from __future__ import annotations

import pytest

from device_plugin.watchdog.ladder import Kind, LadderConfig, Observation, SliceGuard, Step, parse_steps

GIB = 1024**3
ALL = (Step.EVENT, Step.ANNOTATE, Step.EVICT)


def run(
    guard: SliceGuard, points: list[tuple[float, int, float]], *, limit: int = 10 * GIB, cores: int = 30
) -> list[tuple[float, Step, tuple[Kind, ...]]]:
    """[(t, memory, sm)] -> [(t, step, kinds)] of every action emitted."""
    out: list[tuple[float, Step, tuple[Kind, ...]]] = []
    for t, mem, sm in points:
        for a in guard.observe(Observation(t, mem, limit, sm, cores)):
            out.append((t, a.step, a.kinds))
    return out


def test_memory_over_limit_escalates_in_order_then_repeats_the_last_step() -> None:
    g = SliceGuard(LadderConfig(steps=ALL, escalate_after_s=10))
    acts = run(g, [(t, 11 * GIB, 0) for t in range(0, 41)])
    assert [(t, s) for t, s, _ in acts] == [
        (0, Step.EVENT),
        (10, Step.ANNOTATE),
        (20, Step.EVICT),
        (30, Step.EVICT),
        (40, Step.EVICT),
    ]
    assert all(k == (Kind.MEMORY,) for _, _, k in acts)


def test_memory_at_the_limit_is_fine() -> None:
    assert run(SliceGuard(LadderConfig()), [(0, 10 * GIB, 0), (1, 10 * GIB, 0)]) == []


@pytest.mark.parametrize(
    ("window", "over_for", "expect_action_at"),
    [
        (5.0, 10, 5),  # sustained past the window: violation when the window is full
        (5.0, 4, None),  # a burst shorter than the window: nothing
        (0.0, 1, 0),  # no window: immediate
    ],
)
def test_sm_window(window: float, over_for: int, expect_action_at: float | None) -> None:
    g = SliceGuard(LadderConfig(sm_window_s=window, sm_tolerance=0))
    points = [(float(t), 0, 80.0) for t in range(over_for)] + [(float(over_for), 0, 10.0)]
    acts = run(g, points)
    if expect_action_at is None:
        assert acts == []
    else:
        assert acts[0][0] == expect_action_at and acts[0][2] == (Kind.SM,)


def test_a_dip_restarts_the_sm_window() -> None:
    g = SliceGuard(LadderConfig(sm_window_s=3, sm_tolerance=0))
    sms = [80, 80, 80, 10, 80, 80, 80, 80]
    acts = run(g, [(float(t), 0, float(s)) for t, s in enumerate(sms)])
    assert [t for t, _, _ in acts] == [7.0]


def test_sm_tolerance_and_best_effort() -> None:
    g = SliceGuard(LadderConfig(sm_window_s=0, sm_tolerance=5))
    assert run(g, [(0, 0, 34.0)]) == []  # 30 % quota + 5 points tolerance
    assert run(g, [(1, 0, 36.0)])[0][1] == Step.EVENT
    best_effort = SliceGuard(LadderConfig(sm_window_s=0))
    assert run(best_effort, [(0, 0, 100.0)], cores=0) == []


def test_clearing_resets_the_ladder() -> None:
    g = SliceGuard(LadderConfig(steps=ALL, escalate_after_s=1))
    first = run(g, [(0, 11 * GIB, 0), (1, 11 * GIB, 0), (2, 1 * GIB, 0), (3, 11 * GIB, 0)])
    assert [(t, s) for t, s, _ in first] == [(0, Step.EVENT), (1, Step.ANNOTATE), (3, Step.EVENT)]
    assert g.level == 1


@pytest.mark.parametrize(
    ("text", "steps"),
    [("event", (Step.EVENT,)), ("event, annotate ,evict", ALL), ("annotate,evict", (Step.ANNOTATE, Step.EVICT))],
)
def test_parse_steps(text: str, steps: tuple[Step, ...]) -> None:
    assert parse_steps(text) == steps


@pytest.mark.parametrize("text", ["", "evict,event", "event,event", "kill"])
def test_parse_steps_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_steps(text)
