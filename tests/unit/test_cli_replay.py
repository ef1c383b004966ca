"""`vgpu replay`: the summary of a tiny openb trace, with and without kube-scheduler's node window, and the refusal
of a percentage kube-scheduler would not take."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from vgpu_cli.main import main


def _trace(tmp_path: Path) -> tuple[Path, Path]:
    rng = random.Random(7)
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i:03d},64000,262144,{rng.choice([2, 4, 8])},G2\n" for i in range(150))
    )
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i:04d},2000,4096,{rng.choice(['1,1000', '1,250', '1,500', '2,1000'])}\n" for i in range(300))
    )
    return nodes, pods


def _replay(tmp_path: Path, *extra: str) -> dict[str, object]:
    nodes, pods = _trace(tmp_path)
    out = tmp_path / "out.json"
    args = ["replay", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "42", "--workers", "1"]
    assert main([*args, "--out", str(out), *extra]) == 0
    doc: dict[str, object] = json.loads(out.read_text())
    return doc


def test_every_node_by_default_and_kube_schedulers_window_when_asked(tmp_path: Path) -> None:
    whole = _replay(tmp_path)
    assert whole["percentage_of_nodes_to_score"] is None and whole["names_per_pod"] == 150
    window = _replay(tmp_path, "--percentage-of-nodes-to-score", "5")  # 150 nodes: the 100-node floor
    assert window["percentage_of_nodes_to_score"] == 5
    assert isinstance(window["names_per_pod"], float) and window["names_per_pod"] <= 100
    assert window["pods"] == whole["pods"]  # the same arrivals; only the nodes asked differ


@pytest.mark.parametrize("bad", ["-1", "101"])
def test_a_percentage_kube_scheduler_would_not_take_is_refused(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = _trace(tmp_path)
    rc = main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--percentage-of-nodes-to-score", bad])
    assert rc == 2
    assert f"--percentage-of-nodes-to-score {bad}: allowed 0" in capsys.readouterr().err
