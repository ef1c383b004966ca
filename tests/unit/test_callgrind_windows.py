"""benchmarks.callgrind_windows counts each gated window alone, in the order they ran, even under a repeated label."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import callgrind_windows

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (callgrind)")

ENV = "TEST_CALLGRIND_WINDOWS_GATE"

CHILD = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from benchmarks.callgrind_windows import gate

def work(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

for label, n in (("small", 2_000), ("big", 200_000), ("small", 2_000)):
    gate({ENV!r}, f"start-{{label}}")
    work(n)
    gate({ENV!r}, f"stop-{{label}}")
work(2_000_000)  # not counted: outside every window
print("done")
"""


def test_each_window_is_counted_alone_in_the_order_it_ran(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    lines: list[str] = []
    windows, rc = callgrind_windows.run_windows(str(script), [], ENV, lines.append)
    assert rc == 0 and lines[-1].strip() == "done"
    assert [label for label, _ in windows] == ["small", "big", "small"]
    small, big, again = (total for _, total in windows)
    # zeroed at each start (the big one not carried over); the uncounted tail (10x the big loop) is in no window
    assert 0 < small < big / 20 and 0 < again < big / 20


def test_gate_announces_the_window_and_waits_for_the_parents_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    callgrind_windows.gate(ENV, "start-x")  # not counted: says nothing, waits for nothing
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(ENV, str(tmp_path))
    (tmp_path / "go-start-x").touch()  # the parent switched counting on already
    callgrind_windows.gate(ENV, "start-x")
    assert capsys.readouterr().out == "GATE start-x\n"
