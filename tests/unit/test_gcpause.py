"""scheduler_extender.gcpause.settle: what a planner's passes keep is frozen after a collection of the young
generations, and every RESET_SETTLES-th settle collects the whole heap (a cycle frozen along cannot pile up)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from scheduler_extender import gcpause


class _Obj:
    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def freezing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(gcpause, "_freeze", True)
    monkeypatch.setattr(gcpause, "_made", 0)
    monkeypatch.setattr(gcpause, "_settles", 0)
    try:
        yield
    finally:
        gc.unfreeze()  # the test runner's heap is not ours to keep frozen


def _cycle() -> weakref.ref[_Obj]:
    a, b = _Obj(), _Obj()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_settle_is_off_unless_the_process_freezes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcpause, "_freeze", False)  # the default: a test runner's heap is not ours
    monkeypatch.setattr(gcpause, "_made", 0)
    kept = _Obj()
    # Asked of gc itself, not read off gc.get_freeze_count(): another thread of the session freeing a frozen object
    # lowers that count meanwhile.
    frozen: list[int] = []
    monkeypatch.setattr(gcpause.gc, "freeze", lambda: frozen.append(1))
    gcpause.settle(10 * gcpause.SETTLE_NAMES)
    assert not frozen
    assert gc.is_tracked(kept)


@pytest.mark.usefixtures("freezing")
def test_settle_freezes_what_a_pass_keeps_once_enough_nodes_were_evaluated() -> None:
    kept = [_Obj() for _ in range(100)]
    before = gc.get_freeze_count()
    gcpause.settle(gcpause.SETTLE_NAMES - 1)
    assert gc.get_freeze_count() == before  # not yet a pass's worth
    garbage = _cycle()
    gcpause.settle(1)
    assert garbage() is None  # collected first, not frozen along
    assert gc.get_freeze_count() >= before + len(kept)
    assert gcpause._made == 0


@pytest.mark.usefixtures("freezing")
def test_every_reset_settles_th_settle_collects_a_cycle_frozen_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcpause, "RESET_SETTLES", 2)
    a, b = _Obj(), _Obj()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    gcpause.settle(gcpause.SETTLE_NAMES)  # the cycle is alive: frozen
    del a, b
    gc.collect()
    assert ref() is not None  # a frozen cycle waits
    gcpause.settle(gcpause.SETTLE_NAMES)  # the second settle: unfreeze, collect everything, freeze again
    assert ref() is None


@pytest.mark.usefixtures("freezing")
def test_a_settle_collects_only_the_young_generations_and_a_reset_the_whole_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full collection in each settle walked the pass's results again (3.6-6.5 ms of a cold call at 5,000 nodes)
    and found nothing; the whole heap is collected at the reset only."""
    monkeypatch.setattr(gcpause, "RESET_SETTLES", 2)
    first: list[int] = []
    second: list[int] = []
    asked: list[list[int] | None] = [None]  # only collections inside settle: the test's own allocations may collect

    def seen(phase: str, info: dict[str, int]) -> None:
        into = asked[0]
        if phase == "start" and into is not None:
            into.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        asked[0] = first
        gcpause.settle(gcpause.SETTLE_NAMES)
        asked[0] = second
        gcpause.settle(gcpause.SETTLE_NAMES)  # the second: the reset
        asked[0] = None
    finally:
        gc.callbacks.remove(seen)
    assert 1 in first and 2 not in first  # young generations only
    assert 2 in second
