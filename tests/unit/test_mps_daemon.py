"""The MPS control daemon's lifecycle against a fake nvidia-cuda-mps-control (tests/data/mps): start, the
commands sent, a crash noticed and restarted, backoff while it cannot start, refusal while down, quit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_plugin.health import HealthBoard
from device_plugin.mps.control import MpsControl, MpsPaths
from device_plugin.mps.daemon import MpsDaemon, MpsDaemonSettings
from device_plugin.nvml import real
from device_plugin.nvml.discovery import discover
from device_plugin.testing.fake_nvml import FakeNvml
from tests.mps_fake import cleanup, commands, crash, daemon_pid, fake_paths

SCENARIO = {"driver": "550.54.15", "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": 2}]}


class Rig:
    def __init__(self, root: Path, scenario: dict[str, object] = SCENARIO, **settings: float) -> None:
        self.paths = fake_paths(root)
        self.nvml = FakeNvml(scenario)
        self.gpus, self.handles = discover(
            self.nvml, split_count=4, is_nvml_error=lambda e: isinstance(e, real.NVMLError)
        )
        self.board = HealthBoard(g.uuid for g in self.gpus)
        self.daemon = MpsDaemon(
            MpsControl(self.paths, timeout_s=10),
            self.nvml,
            self.handles,
            self.board,
            MpsDaemonSettings(default_active_thread_percentage=25, default_pinned_mem_limit_mib=20000, **settings),
        )

    def healthy(self) -> list[bool]:
        return [h.healthy for h in self.board.snapshot()[1].values()]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.daemon._stop.set()
    cleanup(r.paths)


def test_start_sets_exclusive_process_starts_the_daemon_and_sends_the_defaults(rig: Rig) -> None:
    assert rig.healthy() == [False, False]  # refused until the daemon is up
    assert "not started yet" in rig.board.get(rig.gpus[0].uuid).reason
    assert rig.daemon.step() == 5.0
    assert rig.daemon.status().up and rig.healthy() == [True, True]
    assert rig.nvml.compute_modes == {0: 3, 1: 3}
    assert daemon_pid(rig.paths) is not None
    sent = commands(rig.paths)
    assert sent[0] == f"-d pipe={rig.paths.pipe_dir} log={rig.paths.log_dir}"
    # the probe before -d found no daemon, so the fake recorded nothing for it
    assert sent[1:] == [
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 20000M",
        "set_default_device_pinned_mem_limit 1 20000M",
        "get_default_active_thread_percentage",
    ]
    assert all(Path(d).is_dir() for d in (rig.paths.pipe_dir, rig.paths.log_dir, rig.paths.shm_dir))


def test_a_crash_is_noticed_refused_while_down_and_restarted(rig: Rig) -> None:
    rig.daemon.step()
    first = crash(rig.paths)
    assert rig.daemon.step() == 0.0  # the probe fails: down, restart at once
    status = rig.daemon.status()
    assert not status.up and status.failures == 1 and "stopped answering" in status.reason
    reason = rig.board.get(rig.gpus[1].uuid).reason
    assert rig.healthy() == [False, False]
    assert reason.startswith("MPS control daemon down (stopped answering: ") and "refused" in reason
    assert "Cannot find MPS control daemon process" in reason
    rig.daemon.step()
    status = rig.daemon.status()
    assert status.up and status.starts == 2 and status.restarts == 1
    assert daemon_pid(rig.paths) not in (None, first)
    assert rig.healthy() == [True, True]
    assert commands(rig.paths).count(f"-d pipe={rig.paths.pipe_dir} log={rig.paths.log_dir}") == 2


def test_a_daemon_that_cannot_start_is_retried_with_doubling_backoff(tmp_path: Path) -> None:
    r = Rig(tmp_path, backoff_initial_s=1.0, backoff_max_s=4.0)
    Path(r.paths.pipe_dir).mkdir()
    (Path(r.paths.pipe_dir) / "fail-start").write_text("MPS is not supported on this GPU")
    try:
        assert [r.daemon.step() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
        status = r.daemon.status()
        assert not status.up and status.failures == 4 and status.starts == 0
        assert "-d exited with 1: MPS is not supported on this GPU" in r.board.get(r.gpus[0].uuid).reason
        (Path(r.paths.pipe_dir) / "fail-start").unlink()
        assert r.daemon.step() == 5.0 and r.daemon.status().up
        Path(r.paths.pipe_dir, "fail-start").write_text("again")
        crash(r.paths)
        assert [r.daemon.step() for _ in range(2)] == [0.0, 1.0]  # backoff starts over after a good start
    finally:
        cleanup(r.paths)


def test_stop_quits_the_daemon_and_restores_compute_modes(rig: Rig) -> None:
    rig.nvml.compute_modes[1] = 2  # PROHIBITED before we came
    rig.daemon.step()
    pid = daemon_pid(rig.paths)
    rig.daemon.stop()
    assert commands(rig.paths)[-1] == "quit"
    assert daemon_pid(rig.paths) is None and pid is not None
    assert rig.nvml.compute_modes == {0: 0, 1: 2}
    assert not rig.daemon.status().up and rig.healthy() == [False, False]


def test_an_already_running_daemon_is_adopted_not_started_twice(rig: Rig) -> None:
    rig.daemon.step()
    other = MpsDaemon(MpsControl(rig.paths), rig.nvml, rig.handles, HealthBoard(g.uuid for g in rig.gpus))
    other.step()
    assert other.status().up
    assert commands(rig.paths).count(f"-d pipe={rig.paths.pipe_dir} log={rig.paths.log_dir}") == 1


def test_a_missing_binary_names_the_setting(tmp_path: Path) -> None:
    nvml = FakeNvml(SCENARIO)
    _, handles = discover(nvml, split_count=4, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
    board = HealthBoard(handles)
    paths = MpsPaths(binary=str(tmp_path / "nope"), pipe_dir=str(tmp_path / "p"), log_dir=str(tmp_path / "l"))
    d = MpsDaemon(MpsControl(paths), nvml, handles, board, MpsDaemonSettings(backoff_initial_s=3))
    assert d.step() == 3
    assert "not found: set mps_control_binary" in board.get(next(iter(handles))).reason


def test_compute_mode_denied_is_the_reason(tmp_path: Path) -> None:
    r = Rig(tmp_path, {**SCENARIO, "computeModes": "denied"})
    r.daemon.step()
    reason = r.board.get(r.gpus[0].uuid).reason
    assert "cannot set GPU" in reason and "EXCLUSIVE_PROCESS" in reason and daemon_pid(r.paths) is None


def test_the_watch_thread_restarts_a_crashed_daemon(tmp_path: Path) -> None:
    r = Rig(tmp_path, probe_interval_s=0.1, backoff_initial_s=0.1)
    r.daemon.start()
    try:
        deadline = time.monotonic() + 60  # each step runs the fake control binary: a Python start, slow when loaded
        while not r.daemon.status().up and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.daemon.status().up
        crash(r.paths)
        while r.daemon.status().starts < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        status = r.daemon.status()
        assert status.up and status.restarts == 1 and status.failures == 1
    finally:
        r.daemon.stop()
        cleanup(r.paths)
