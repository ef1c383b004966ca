"""`vgpu pd-bench` and the bench runner: configurations, role rules off, the targets docs/pd-packing.md reports against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgpu.config import RoleRules
from vgpu.perf import bench
from vgpu.perf.params import PerfParams
from vgpu.perf.workload import generate
from vgpu_cli.main import main


def test_configs_cover_the_issue_and_baselines_have_no_role_rules() -> None:
    cfgs = {c.name: c for c in bench.configs()}
    assert {"hami", "binpack", "spread", "fragaware-noroles", "default"} <= set(cfgs)
    for name in ("hami", "binpack", "spread", "fragaware-noroles"):
        assert cfgs[name].placement.roles == RoleRules.off()
    assert cfgs["hami"].placement.gpu_policy == "spread" and cfgs["hami"].defaults.cores == 0
    assert cfgs["default"].placement.roles == RoleRules()


@pytest.fixture(scope="module")
def runs() -> dict[str, bench.RunResult]:
    work = generate(42, nodes=4, deployments=5)
    return {c.name: bench.run(work, c, 42, (0.35,), PerfParams()) for c in bench.configs()}


def test_default_never_oversubscribes_prefill_sms_and_pairs_more_than_without_roles(
    runs: dict[str, bench.RunResult],
) -> None:
    ours, plain = runs["default"].metrics[0.35], runs["fragaware-noroles"].metrics[0.35]
    assert ours["prefill_sm_oversubscribed"] == 0
    assert ours["bw_overcommitted"] == 0
    assert ours["pair_node"] > plain["pair_node"]


def test_capacity_aware_pairing_is_measured_for_every_configuration(runs: dict[str, bench.RunResult]) -> None:
    for r in runs.values():
        m = r.metrics[0.35]
        assert 0.0 <= m["pairable"] <= 1.0
        assert m["pair_node"] <= m["pair_node_capacity"] <= 1.0
        # paired prefills are always pairable: raw = capacity-aware x pairable share
        assert m["pair_node"] == pytest.approx(m["pair_node_capacity"] * m["pairable"], abs=0.05)


def test_hami_best_effort_decodes_oversubscribe_prefill_sms(runs: dict[str, bench.RunResult]) -> None:
    assert runs["hami"].metrics[0.35]["prefill_sm_oversubscribed"] > 0
    assert runs["hami"].metrics[0.35]["goodput_rps"] < runs["default"].metrics[0.35]["goodput_rps"]


def test_cli_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pd.json"
    code = main(
        ["pd-bench", "--seeds", "1", "--s-sat", "0.35", "--nodes", "2", "--deployments", "3", "--out", str(out)]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "fragaware-noroles" in table and "x hami" in table and "P/D cap" in table
    data = json.loads(out.read_text())
    assert {r["config"] for r in data["results"]} >= {"hami", "default"}
    assert all(r["s_sat"] == 0.35 for r in data["results"])


def test_cli_rejects_a_bad_s_sat(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pd-bench", "--s-sat", "x"]) == 2
    assert "--s-sat" in capsys.readouterr().err
