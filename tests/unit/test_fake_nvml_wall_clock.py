"""`vgpu-device-plugin --fake-nvml` plays a scenario's timeline on wall time: XIDs fall due, injected errors
start and end and process timelines move without advance(); tests keep the manual clock (the default)."""

from __future__ import annotations

import time
from pathlib import Path

import pynvml
import pytest

from device_plugin import main as dp_main
from device_plugin.health import HealthBoard, HealthMonitor
from device_plugin.nvml.discovery import discover
from device_plugin.testing.fake_nvml import FakeNvml

DATA = Path(__file__).parent.parent / "data" / "nvml"


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def monitor(f: FakeNvml, clock: Clock | None = None) -> tuple[HealthMonitor, HealthBoard, list[str]]:
    gpus, handles = discover(f, split_count=10, is_nvml_error=lambda e: isinstance(e, pynvml.NVMLError))
    board = HealthBoard(handles)
    m = HealthMonitor(f, board, handles, probe_interval_s=0, recovery_s=30, clock=clock or time.monotonic)
    m.register()
    return m, board, [g.uuid for g in gpus]


def test_the_manual_clock_stays_the_default() -> None:
    f = FakeNvml.from_file(DATA / "xid.yaml")
    assert f.now == 0.0
    f.advance(2.5)
    assert f.now == 2.5


def test_with_a_clock_the_timeline_follows_it_from_construction() -> None:
    clock = Clock()
    f = FakeNvml.from_file(DATA / "xid.yaml", clock=clock)
    m, board, uuids = monitor(f, clock)
    assert f.now == 0.0
    clock.t += 1.5  # the application XID 13 (t=1) is due, the critical 79 (t=2) not yet
    m.step(timeout_ms=1)
    m.step(timeout_ms=1)
    assert all(board.get(u).healthy for u in uuids)
    clock.t += 1.0
    m.step(timeout_ms=1)
    assert not board.get(uuids[3]).healthy and "79" in board.get(uuids[3]).reason
    f.advance(10)  # advance() still skips ahead, on top of the clock
    assert f.now == pytest.approx(12.5)


def test_injected_errors_start_and_end_on_the_clock() -> None:
    clock = Clock()
    f = FakeNvml.from_file(DATA / "gpu_lost.yaml", clock=clock)
    m, board, uuids = monitor(f, clock)
    m.step(timeout_ms=1)
    assert board.get(uuids[1]).healthy
    clock.t += 5
    m.step(timeout_ms=1)
    assert not board.get(uuids[1]).healthy and "lost" in board.get(uuids[1]).reason.lower()
    clock.t += 15
    m.step(timeout_ms=1)
    assert board.get(uuids[1]).healthy


def test_event_wait_wakes_when_the_next_xid_falls_due_on_wall_time() -> None:
    """The way the command line runs it: the GPU falls off the bus about 2 s after start, without any call
    to advance(), and the wait returns then (not at the end of its 30 s timeout)."""
    start = time.monotonic()  # before the fake's clock starts: the XID cannot fall due sooner than 2 s after this
    f = dp_main._nvml(str(DATA / "xid.yaml"))
    assert isinstance(f, FakeNvml)
    m, board, uuids = monitor(f)
    while board.get(uuids[3]).healthy and time.monotonic() - start < 60:
        m.step(timeout_ms=30_000)
    took = time.monotonic() - start
    assert not board.get(uuids[3]).healthy
    assert 2.0 <= took < 15.0, took  # woken by the XID, not by the 30 s timeout (loose for a loaded machine)
    assert all(board.get(u).healthy for u in uuids[:3])
