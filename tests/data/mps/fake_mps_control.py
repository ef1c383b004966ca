"""A stand-in for `nvidia-cuda-mps-control` in tests: the same command line and exit statuses, state in files.

    fake_mps_control.py -d     start the "daemon" (a sleeping background process); exit 1 if one runs already,
                               or with the text of $CUDA_MPS_PIPE_DIRECTORY/fail-start if that file exists
    fake_mps_control.py        read commands from stdin; exit 1 if no daemon runs; `quit` stops it

Everything lands under $CUDA_MPS_PIPE_DIRECTORY (which must be set, as for the real one): daemon.pid, and
commands.log with one line per command and per `-d` (`-d pipe=<dir> log=<dir>`). A test crashes the daemon by
killing the pid in daemon.pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _daemon(pipe: Path) -> int | None:
    try:
        pid = int((pipe / "daemon.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _record(pipe: Path, line: str) -> None:
    with open(pipe / "commands.log", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        while True:
            time.sleep(3600)
    raw = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not raw:
        print("CUDA_MPS_PIPE_DIRECTORY is not set (the fake needs it)")
        return 1
    pipe = Path(raw)
    if argv == ["-d"]:
        if _daemon(pipe) is not None:
            print("An instance of this daemon is already running")
            return 1
        fail = pipe / "fail-start"
        if fail.exists():
            print(fail.read_text().strip())
            return 1
        _record(pipe, f"-d pipe={raw} log={os.environ.get('CUDA_MPS_LOG_DIRECTORY', '')}")
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        (pipe / "daemon.pid").write_text(str(proc.pid))
        return 0
    if argv:
        print(f"unknown arguments {argv}")
        return 1
    pid = _daemon(pipe)
    if pid is None:
        print("Cannot find MPS control daemon process")
        return 1
    for line in sys.stdin.read().splitlines():
        cmd = line.strip()
        if not cmd:
            continue
        _record(pipe, cmd)
        if cmd == "get_default_active_thread_percentage":
            print("100.0")
        elif cmd == "quit":
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            (pipe / "daemon.pid").unlink(missing_ok=True)
        elif not cmd.startswith(("set_default_active_thread_percentage ", "set_default_device_pinned_mem_limit ")):
            print(f"Invalid command {cmd}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
