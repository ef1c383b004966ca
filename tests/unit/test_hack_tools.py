"""The hack/ tool builds, as a newcomer meets them: the progress a long first build shows, the cached fast
path (no Go needed), and that `.ci/run` runs the README's commands with no separate pre-build."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ, **env}, cwd=REPO
    )


PRELUDE = 'set -euo pipefail; log() { echo "[t] $*" >&2; }; source hack/lib/progress.sh; '


def test_progress_run_reports_downloads_and_packages_while_a_build_runs(tmp_path: Path) -> None:
    fake_go = (
        'for i in 1 2 3 4 5 6; do echo "go: downloading example.com/m$i v1.0.0" >&2; '
        'echo "example.com/m$i/pkg" >&2; sleep 0.7; done'
    )
    proc = bash(
        PRELUDE + f'build_banner "thing v1" "a few minutes" "{tmp_path}"; '
        f"progress_run thing {tmp_path}/build.log bash -c '{fake_go}'; echo done",
        KUBE_VGPU_PROGRESS_SECONDS="1",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    lines = proc.stderr.splitlines()
    assert lines[0] == (
        f"[t] building thing v1: done once, cached in {tmp_path} (set KUBE_VGPU_CACHE to move it); "
        "a first build takes a few minutes on 2 cores"
    )
    ticks = [line for line in lines[1:] if "s so far;" in line]
    assert len(ticks) >= 2, proc.stderr
    assert "modules downloaded" in ticks[-1] and "packages compiled (now: example.com/m" in ticks[-1]
    assert "go: downloading" in (tmp_path / "build.log").read_text()  # the full output is kept, not shown


def test_progress_run_fails_with_the_end_of_the_log(tmp_path: Path) -> None:
    proc = bash(
        PRELUDE + f"progress_run thing {tmp_path}/b.log bash -c 'echo \"x.go:3:1: undefined: y\" >&2; exit 3' "
        "|| echo rc=$?"
    )
    assert proc.stdout.strip() == "rc=3"
    assert "[t] thing failed (exit 3)" in proc.stderr and "x.go:3:1: undefined: y" in proc.stderr


def test_a_cached_tool_is_printed_without_go(tmp_path: Path) -> None:
    binary = tmp_path / "prometheus-v0.316.0" / "bin" / "prometheus"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    proc = bash("hack/build-prometheus.sh", KUBE_VGPU_CACHE=str(tmp_path), PATH="/usr/bin:/bin")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(binary)
    assert "cached" in proc.stderr


def test_ci_runs_the_readme_commands_and_no_separate_prebuild() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line.split()[3:] for line in ci.splitlines() if line.startswith("step ")]
    assert commands == [["make", "demo"], ["make", "lint"], ["make", "test"]]
    assert "hack/build-" not in ci.replace("# ", "") and "install-etcd" not in ci
    readme = (REPO / "README.md").read_text()
    assert "make demo\nmake test\n" in readme
