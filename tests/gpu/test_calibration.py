"""The calibration script runs briefly on a real GPU and yields numbers the model can use."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate_gpu.py"


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None or shutil.which("nvidia-smi") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _has_cuda(), reason="needs torch with a CUDA GPU")
def test_quick_calibration(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--layers", "2", "--out", str(out)], check=True, timeout=600
    )
    data = json.loads(out.read_text())
    assert set(data["decode"]["16"]) == {"35", "100"}
    assert all(t > 0 for t in data["prefill"].values())
    assert 0 < data["beta"]["16"]["35"] <= 1.2
    assert data["contention"]["slowdown"] >= 0.9
