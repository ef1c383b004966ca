"""The fake `nvidia-cuda-mps-control` (tests/data/mps/fake_mps_control.py) as an executable, for the MPS tests."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from device_plugin.mps.control import MpsPaths

FAKE = Path(__file__).parent / "data" / "mps" / "fake_mps_control.py"


def fake_paths(root: Path) -> MpsPaths:
    """A launcher for the fake under `root` (this interpreter, whatever PATH says) and MPS folders beside it."""
    launcher = root / "nvidia-cuda-mps-control"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    launcher.chmod(0o755)
    return MpsPaths(
        binary=str(launcher), pipe_dir=str(root / "pipe"), log_dir=str(root / "log"), shm_dir=str(root / "shm")
    )


def daemon_pid(paths: MpsPaths) -> int | None:
    try:
        return int((Path(paths.pipe_dir) / "daemon.pid").read_text())
    except (OSError, ValueError):
        return None


def commands(paths: MpsPaths) -> list[str]:
    try:
        return (Path(paths.pipe_dir) / "commands.log").read_text().splitlines()
    except OSError:
        return []


def crash(paths: MpsPaths) -> int:
    """SIGKILL the fake daemon (the pid it recorded); returns that pid."""
    pid = daemon_pid(paths)
    assert pid is not None, "no fake MPS daemon to crash"
    os.kill(pid, signal.SIGKILL)
    return pid


def cleanup(paths: MpsPaths) -> None:
    """Kill the fake daemon this test started, if it still runs."""
    pid = daemon_pid(paths)
    if pid is None:
        return
    try:  # only our fake: a pid recorded long ago may belong to someone else by now
        if b"fake_mps_control" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
