"""The cyclic garbage collector paused while a list is parsed and applied.

Parsing 40k pods allocates millions of objects, each allocation burst triggers collections, and every full
collection walks the whole heap again: at 40k pods that doubled the list and its apply (benchmarks/restart.py:
parse 7.1 -> 2.6 s, apply 5.2 -> 2.8 s CPU). Nothing a list builds is cyclic (JSON objects and frozen dataclasses,
freed by reference counting), so nothing waits on the collector meanwhile. Reflectors may list at the same time:
the collector runs again once the last of them is done.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_active = 0  # lists in progress
_resume = True  # whether the collector was on when the first of them began


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
            if _active == 0 and _resume:
                gc.enable()
