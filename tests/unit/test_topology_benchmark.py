"""`benchmarks/topology.py` on a small run: the cluster has the three node kinds, and the run's own measures agree
with what the placements are (topology on puts more TP pods on NVLink peers than off, on the same pods)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import vgpu.topology
from vgpu.config import PlacementConfig
from vgpu.topology import node_topology

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "topology.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("topology_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_the_cluster_has_nvswitch_bridged_and_pcie_nodes() -> None:
    nodes = _module().cluster(1)
    domains = {n.name: sorted(len(c) for c in node_topology(n.gpus).cliques) for n in nodes}
    assert domains == {"nvswitch-0": [8], "bridged-0": [2, 2, 2, 2], "pcie-0": []}
    assert {g.numa for n in nodes for g in n.gpus} == {0, 1}


def test_topology_on_puts_more_tp_pods_on_nvlink_on_the_same_pods() -> None:
    mod = _module()
    nodes = mod.cluster(2)
    pods = mod.workload(7, 300, sum(len(n.gpus) for n in nodes), 0.8)
    off = mod.run(7, PlacementConfig(topology=False), nodes, pods)
    on = mod.run(7, PlacementConfig(), nodes, pods)
    assert on.tp_placed > 20 and off.tp_placed > 20
    assert on.tp_nvlink / on.tp_placed > off.tp_nvlink / off.tp_placed


def test_the_script_prints_the_ratios_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--seeds",
            "42",
            "--pods",
            "200",
            "--nodes-per-kind",
            "2",
            "--json",
            str(out),
            *("--whole-node-cost", "0"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert "ratios on/off: tp_nvlink_share" in r.stdout
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"topology off (before)", "topology on (default)", "whole-node cost 0"}
    assert len(doc["results"]["whole-node cost 0"]["per_seed_refused"]) == 1
    assert doc["ratios"]["gpus_used"] > 0


def test_a_run_with_another_whole_node_cost_puts_the_default_back() -> None:
    mod = _module()
    nodes = mod.cluster(1)
    pods = mod.workload(3, 60, sum(len(n.gpus) for n in nodes), 0.8)
    mod.run(3, PlacementConfig(), nodes, pods, whole_node_cost=0.0)
    assert vgpu.topology.WHOLE_NODE_COST == 1.25
