"""`benchmarks/openb_runs.py compare`: paired differences of two policies on the seeds both have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.openb_runs import scaled, trace_label
from vgpu.replay.trace import NodeRow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "openb_runs.py"


def _run(d: Path, trace: str, policy: str, seed: int, u100: float, mode: str = "best") -> None:
    doc = {"trace": trace, "policy": policy, "mode": mode, "seed": seed, "pods": 10, "failed": 1, "seconds": 1.0,
           "unallocated_pct": {"95": u100 + 0.5, "100": u100}}  # fmt: skip
    (d / f"{trace}__{policy}__{mode}__{seed}.json").write_text(json.dumps(doc))


def _compare(d: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "compare", "--dir", str(d), "--policy", "new", "--base", "old", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_pairs_by_seed_and_reports_mean_se_and_signs(tmp_path: Path) -> None:
    for seed, old, new in ((42, 5.0, 4.8), (43, 5.0, 5.1), (44, 5.0, 4.7), (45, 5.0, 5.0)):
        _run(tmp_path, "gpushare40", "old", seed, old)
        _run(tmp_path, "gpushare40", "new", seed, new)
    _run(tmp_path, "gpushare40", "new", 46, 1.0)  # no partner: must not count
    _run(tmp_path, "default", "old", 42, 4.0)  # a trace with one side only is left out
    out = _compare(tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| gpushare40")]
    assert len(rows) == 1 and "default" not in out.stdout.split("|---")[-1]
    # diffs -0.2 +0.1 -0.3 0.0: mean -0.1, sd 0.1826, se 0.0913
    assert "| 4 (42-45) | -0.100 ± 0.091 | 2 / 1 / 1 | -0.20 +0.10 -0.30 +0.00 |" in rows[0]


def test_seeds_and_x_select_what_is_compared(tmp_path: Path) -> None:
    for seed, old, new in ((42, 5.0, 4.0), (43, 5.0, 6.0)):
        _run(tmp_path, "gpushare60", "old", seed, old)
        _run(tmp_path, "gpushare60", "new", seed, new)
    out = _compare(tmp_path, "--seeds", "43", "--x", "95")
    assert out.returncode == 0, out.stderr
    assert "| gpushare60 | 1 (43-43) | +1.000 ± nan | 0 / 0 / 1 | +1.00 |" in out.stdout


def test_no_common_seed_names_what_exists(tmp_path: Path) -> None:
    _run(tmp_path, "default", "old", 42, 4.0)
    _run(tmp_path, "default", "fgd", 42, 4.8)
    out = _compare(tmp_path)
    assert out.returncode != 0
    assert "no seed has runs of both 'new' and 'old'" in out.stderr and "fgd, old" in out.stderr


def test_compare_takes_a_window_label_as_its_mode(tmp_path: Path) -> None:
    """Runs made with --percentage are named `best@p0`; compare pairs them by that label."""
    for seed, old, new in ((42, 5.0, 4.5), (43, 5.0, 4.7)):
        _run(tmp_path, "default", "old", seed, old, mode="best@p0")
        _run(tmp_path, "default", "new", seed, new, mode="best@p0")
        _run(tmp_path, "default", "new", seed, 9.0)  # another mode: not paired
    r = _compare(tmp_path, "--mode", "best@p0", "--seeds", "42-43")
    assert r.returncode == 0, r.stderr
    assert "-0.4" in r.stdout and "9.0" not in r.stdout, r.stdout


def test_scaled_copies_the_cluster_with_names_apart() -> None:
    nodes = [NodeRow("a", 1000, 1024, 8, "G2"), NodeRow("b", 1000, 1024, 2, "T4")]
    four = scaled(nodes, 4)
    assert len(four) == 8 and len({n.name for n in four}) == 8
    assert sorted((n.gpus, n.model) for n in four) == sorted([(8, "G2"), (2, "T4")] * 4)
    assert scaled(nodes, 1) is nodes
    assert trace_label("default", 1) == "default" and trace_label("default", 4) == "default-x4"
