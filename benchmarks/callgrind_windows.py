"""Instructions of chosen windows of a benchmark, counted by valgrind's callgrind: load-proof figures on a shared box.

The benchmark re-runs itself under valgrind with counting off; around each window it prints ``GATE start-<label>`` /
``GATE stop-<label>`` and waits (`gate`) while the parent (`run_windows`) zeroes, switches and dumps the counters with
``callgrind_control``; each dump's total is the window's count. The setup (cluster build, learning) is not counted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def gate(env: str, tag: str) -> None:
    """Under `run_windows` (its folder in `env`): say where the run is and wait for the parent to switch counting."""
    folder = os.environ.get(env)
    if not folder:
        return
    print(f"GATE {tag}", flush=True)
    go = Path(folder) / f"go-{tag}"
    while not go.exists():
        time.sleep(0.05)


def run_windows(
    script: str, args: list[str], env: str, on_line: Callable[[str], None], *, keep: bool = False
) -> tuple[list[tuple[str, int]], int]:
    """Run `script` with `args` under callgrind, feeding every other line of its output to `on_line`; each window's
    label and instructions in the order they ran (a label may come again), and the child's exit status. `keep`: leave
    the dumps in their temporary folder (printed) to read with callgrind_annotate."""
    folder = Path(tempfile.mkdtemp(prefix="callgrind-windows-"))
    out = folder / "cg.out"
    child = [sys.executable, str(Path(script).resolve()), *args]
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *child],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, env: str(folder)},
    )
    assert proc.stdout is not None
    pid = str(proc.pid)
    for line in proc.stdout:
        if not line.startswith("GATE "):
            on_line(line)
            continue
        tag = line.split()[1]
        what, label = tag.split("-", 1)
        if what == "start":
            subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        else:
            subprocess.run(["callgrind_control", f"--dump={label}", pid], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        (folder / f"go-{tag}").touch()
    proc.wait()
    windows: list[tuple[str, int]] = []
    dumps = [d for d in folder.glob("cg.out.*") if d.suffix[1:].isdigit()]
    for dump in sorted(dumps, key=lambda d: int(d.suffix[1:])):  # cg.out.1, .2, ...: the order of the dumps
        lines = dump.read_text(errors="replace").splitlines()
        label = next((ln.rsplit(" ", 1)[-1].strip() for ln in lines if ln.startswith("desc: Trigger")), "")
        windows.append((label, next((int(ln.split()[1]) for ln in lines if ln.startswith(("summary:", "totals:"))), 0)))
    if keep:
        print(f"callgrind dumps kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return windows, proc.returncode
