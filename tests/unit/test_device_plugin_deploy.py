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


def test_rbac_allows_events_and_no_evictions_with_the_shipped_ladder() -> None:
    """The manifest's ladder stops at annotate, so the plugin gets no pods/eviction (its evict step needs the rule
    and the webhook's eviction guard: docs/security.md, "Evictions")."""
    rules = _kind("ClusterRole")["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert {("events", "create"), ("pods", "patch"), ("nodes", "patch")} <= granted
    assert not any(r == "pods/eviction" for r, _ in granted)
    assert (
        "evict" not in _kind("ConfigMap")["data"]["device-plugin.yaml"].split("enforcement_steps:")[1].splitlines()[0]
    )


def test_mps_needs_only_the_config_flag(tmp_path: Path) -> None:
    """The daemon's folders are under the vgpu-run mount, its /dev/shm is the host's mps_shm_dir, and the toolkit
    brings nvidia-cuda-mps-control with the compute capability: `mps: true` is the whole switch."""
    spec = _kind("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: volumes.get(m["name"]) for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    cfg_file = tmp_path / "device-plugin.yaml"
    cfg_file.write_text(_kind("ConfigMap")["data"]["device-plugin.yaml"].replace("mps: false", "mps: true"))
    cfg = load(["--config", str(cfg_file), "--node-name", "gpu-1"], {})
    assert cfg.mps and not cfg.hami_core_library
    assert mounts["/dev/shm"] == cfg.mps_shm_dir
    for d in (cfg.mps_pipe_dir, cfg.mps_log_dir, cfg.env_settings().hami_core_preload_file):
        assert d.startswith("/var/run/vgpu/") and mounts["/var/run/vgpu"] == "/var/run/vgpu"
