"""benchmarks/http_serving.py at a CI size: it starts the four parser x loop servers, times every phase against each
and writes the figures it prints (the figures themselves are for docs/performance.md, not for a loaded CI box)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_benchmark_measures_every_combination(tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    args = ["--nodes", "600", "--gpus", "1", "--rounds", "2", "--healthz-block", "5", "--pairs-500-block", "1"]
    args += ["--pairs-all-block", "1", "--json", str(out)]
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "http_serving.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"h11+uvloop", "h11+asyncio", "httptools+asyncio", "httptools+uvloop"}
    for figures in results.values():
        assert set(figures) == {
            f"{phase}_{what}" for phase in ("healthz", "pair_500", "pair_all") for what in ("cpu_ms", "p50_ms")
        }
        assert all(v > 0 for k, v in figures.items() if k.endswith("p50_ms"))
        assert all(v >= 0 for k, v in figures.items() if k.endswith("cpu_ms"))
    assert "CPU vs h11+uvloop / vs h11+asyncio" in run.stdout


def test_too_few_nodes_is_an_error_naming_the_minimum() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "http_serving.py"), "--nodes", "500"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "--nodes 500: must be over 500" in run.stderr
