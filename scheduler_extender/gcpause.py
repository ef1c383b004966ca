"""The cyclic garbage collector paused while a list is parsed and applied.

Parsing 40k pods allocates millions of objects, each allocation burst triggers collections, and every full
collection walks the whole heap again: at 40k pods that doubled the list and its apply (benchmarks/restart.py:
parse 7.1 -> 2.6 s, apply 5.2 -> 2.8 s CPU). Nothing a list builds is cyclic (JSON objects and frozen dataclasses,
freed by reference counting), so nothing waits on the collector meanwhile. Reflectors may list at the same time:
the collector runs again once the last of them is done.

In the extender's own process (`freeze_after_lists`, set by main) what the lists built is then frozen (`gc.freeze`):
the cluster state lives as long as the process, and every later full collection walked all of it again — 0.2-0.7 s
each at 5,000 nodes x 8 GPUs, landing inside a new pod shape's cold evaluation (benchmarks/cold_shape.py). Frozen
objects are still freed by reference counting when a relist replaces them; only a cycle among them would wait for
`gc.unfreeze`, and the state holds none. Off by default: a library user's or a test runner's heap is not ours.

The planner's caches live long too: each pass over every node for a pod shape (a new shape, each relearn) keeps a
result per node, ~10,000 objects at 5,000 nodes, and the full collections that walked 12 shapes' worth took 75-240 ms
each, inside a re-scoring that costs ~60 ms itself (benchmarks/cold_shape.py --rescorings). `settle`, called after such
passes, collects the two young generations (what was made since the last automatic collections: 0.3-2.4 ms) and then
freezes what is left. A full collection there (what is not frozen: mostly what the pass made) took 3.6-6.5 ms, the
largest part of a cold call outside the pass itself, and found nothing in any of 25 settles of
`cold_shape.py --rescorings` at 5,000 nodes: the pass's results are not cyclic. What a freeze can take along is
cyclic garbage already promoted to the oldest generation, or a cycle that becomes garbage later, such as a request's
objects alive during the pass; so that such cycles cannot pile up, every `RESET_SETTLES`-th settle unfreezes, collects
the whole heap (one pause of a full collection, ~0.6 s at 5,000 nodes) and freezes again.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_active = 0  # lists in progress
_resume = True  # whether the collector was on when the first of them began
_freeze = False  # freeze what the lists built once the last of them is done (the extender's process only)
SETTLE_NAMES = 4096  # node evaluations a planner makes before `settle` freezes them: about one pass at 5,000 nodes
RESET_SETTLES = 1024  # settles between two collections of the whole heap (see the module docstring)
_made = 0  # node evaluations since the last settle
_settles = 0


def freeze_after_lists(on: bool = True) -> None:
    global _freeze
    _freeze = on


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    global _active, _resume
    with _lock:
        if _active == 0:
            _resume = gc.isenabled()
            gc.disable()
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                if _freeze:  # no collection first: it would walk the whole new state once more before ready
                    gc.freeze()
                if _resume:
                    gc.enable()


def settle(names: int) -> None:
    """A planner evaluated `names` nodes in one pass (`vgpu.planner.Planner.after_pass`): once `SETTLE_NAMES` have
    added up, collect the young generations and freeze what survives (the results the planner keeps), so that later full
    collections do not walk them. Only where `freeze_after_lists` is on; callers hold the state lock."""
    global _made, _settles
    if not _freeze:
        return
    _made += names
    if _made < SETTLE_NAMES:
        return
    _made = 0
    _settles += 1
    if _settles % RESET_SETTLES == 0:
        gc.unfreeze()
        gc.collect()
    else:
        gc.collect(1)  # the young generations only: a full one walked the pass's results again and found nothing
    gc.freeze()


# Seconds the collector ran, per generation, since `time_collections` (the extender's /metrics: a collection runs on
# whichever thread allocated past a threshold, so its time hides inside that thread's CPU; benchmarks/scale.py).
_collection_s = [0.0, 0.0, 0.0]
_collection_started = 0.0


def _timer(phase: str, info: dict[str, Any]) -> None:
    """gc.callbacks: collections hold the GIL from start to stop, so one start time serves every thread."""
    global _collection_started
    if phase == "start":
        _collection_started = time.perf_counter()
    elif 0 <= (gen := int(info.get("generation", 0))) < len(_collection_s):
        _collection_s[gen] += time.perf_counter() - _collection_started


def time_collections() -> None:
    """Count the collector's time per generation from now on (once per process; a second call changes nothing)."""
    if _timer not in gc.callbacks:
        gc.callbacks.append(_timer)


def collection_seconds() -> tuple[float, float, float]:
    """Seconds spent in collections of generation 0, 1 and 2 since `time_collections`."""
    return (_collection_s[0], _collection_s[1], _collection_s[2])
