"""The garbage collector's time per generation on the extender's /metrics (scheduler_extender.gcpause.time_collections):
a collection runs on whichever thread allocated past a threshold, so benchmarks/scale.py reads it apart."""

from __future__ import annotations

import gc
import itertools
import re
import threading
from collections.abc import Iterator

import pytest

from scheduler_extender import gcpause
from scheduler_extender.metrics import ExtenderMetrics
from vgpu.state import ClusterState


def _exposed(text: str) -> dict[str, float]:
    return {
        g: float(v) for g, v in re.findall(r'^vgpu_extender_gc_seconds_total\{generation="(\d)"\} (\S+)$', text, re.M)
    }


@pytest.fixture
def timed() -> Iterator[None]:
    """The timer for this test only: the session's other tests run without a callback of ours."""
    installed = gcpause._timer in gc.callbacks
    yield
    if not installed:
        while gcpause._timer in gc.callbacks:
            gc.callbacks.remove(gcpause._timer)


@pytest.mark.usefixtures("timed")
def test_collections_are_timed_by_generation_and_exposed() -> None:
    gcpause.time_collections()
    gcpause.time_collections()  # once per process: a second call adds no second timer
    assert gc.callbacks.count(gcpause._timer) == 1
    before = gcpause.collection_seconds()
    garbage = [[] for _ in range(20_000)]
    for a, b in itertools.pairwise(garbage):  # cycles only a collection frees
        a.append(b)
        b.append(a)
    del garbage, a, b
    gc.collect()
    after = gcpause.collection_seconds()
    assert after[2] > before[2] and after[0] >= before[0] and after[1] >= before[1]
    metrics = ExtenderMetrics(ClusterState())
    exposed = _exposed(metrics.exposition(threading.RLock()).decode())
    assert set(exposed) == {"0", "1", "2"} and exposed["2"] >= after[2]
