"""The shipped DaemonSet gives the node daemon what its watchdog and EPP feed need, and its config loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from device_plugin.config import load

ROOT = Path(__file__).resolve().parents[2]
DOCS: list[dict[str, Any]] = [
    d for d in yaml.safe_load_all((ROOT / "deploy/device-plugin/daemonset.yaml").read_text()) if d
]


def _kind(kind: str) -> dict[str, Any]:
    return next(d for d in DOCS if d["kind"] == kind)


def test_configmap_loads_through_the_plugin_loader(tmp_path: Path) -> None:
    cfg_file = tmp_path / "device-plugin.yaml"
    cfg_file.write_text(_kind("ConfigMap")["data"]["device-plugin.yaml"])
    cfg = load(["--config", str(cfg_file), "--node-name", "gpu-1"], {})
    assert cfg.watchdog and cfg.epp_port == 9402 and cfg.metrics_port == 9401
    assert cfg.cgroup_root == "/host/sys/fs/cgroup"


def test_daemonset_has_host_pids_ports_and_cgroup_mount() -> None:
    spec = _kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True  # /proc/<pid>/cgroup of GPU processes in other pods
    container = spec["containers"][0]
    ports = {p["name"]: p for p in container["ports"]}
    assert ports["epp"]["containerPort"] == ports["epp"]["hostPort"] == 9402  # EPP scrapes the node address
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/host/sys/fs/cgroup" in mounts


def test_rbac_allows_events_and_evictions() -> None:
    rules = _kind("ClusterRole")["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert {("events", "create"), ("pods/eviction", "create"), ("pods", "patch"), ("nodes", "patch")} <= granted
