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
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_active = 0  # lists in progress
_resume = True  # whether the collector was on when the first of them began
_freeze = False  # freeze what the lists built once the last of them is done (the extender's process only)


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
