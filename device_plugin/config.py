"""Device plugin configuration (version v1): defaults here, precedence flags > env > file (see load())."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from device_plugin.watchdog.ladder import parse_steps

VERSION = "v1"
ENV_PREFIX = "VGPU_DP_"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node_name: str = ""
    resource_name: str = "nvidia.com/gpu"
    split_count: int = 10
    plugin_dir: str = "/var/lib/kubelet/device-plugins"
    socket_name: str = "vgpu.sock"
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    mps: bool = False
    cache_dir_on_host: str = "/var/run/vgpu/containers"
    inventory_refresh_s: float = 60.0
    health_probe_s: float = 5.0
    xid_recovery_s: float = 60.0
    allocate_retry_s: float = 2.0
    reconcile_s: float = 30.0
    # Watchdog and telemetry (docs/enforcement.md, docs/telemetry.md).
    watchdog: bool = True
    watchdog_interval_s: float = 1.0
    enforcement_steps: str = "event,annotate"  # ordered subset of event,annotate,evict
    enforcement_dry_run: bool = False
    sm_window_s: float = 30.0
    sm_tolerance: float = 5.0  # percentage points of SM above the quota that never count
    escalate_after_s: float = 30.0
    hard_memory_limits: bool = True  # nvmlDeviceSetMemoryLimits_v1 where supported (r615+, cgroup v2, root)
    proc_root: str = "/proc"  # the host's /proc (hostPID)
    cgroup_root: str = "/sys/fs/cgroup"
    pods_refresh_s: float = 10.0
    metrics_port: int = 9401  # node exporter (vgpu_node_*, vgpu_slice_*); 0 = off
    epp_port: int = 9402  # EPP feed (DCGM_FI_DEV_GPU_UTIL per slice), never dcgm-exporter's 9400; 0 = off
    metrics_host: str = "0.0.0.0"
    discovery_file: str = ""  # llm-d file-discovery endpoints file; empty = off
    discovery_port: str = "8000"  # the model server port written into that file
    fake_nvml: str = ""  # path of a fake-NVML scenario (tests and demos); empty = real pynvml
    kubeconfig: str = ""

    def validate(self) -> PluginConfig:
        if not self.node_name:
            raise ValueError("node_name is required (flag --node-name, env VGPU_DP_NODE_NAME or NODE_NAME)")
        if not 1 <= self.split_count <= 100:
            raise ValueError(f"split_count must be 1..100, got {self.split_count}")
        if not 0.1 <= self.watchdog_interval_s <= 60:
            raise ValueError(f"watchdog_interval_s must be 0.1..60, got {self.watchdog_interval_s}")
        parse_steps(self.enforcement_steps)
        for name in ("metrics_port", "epp_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be 0..65535")
        if self.epp_port and self.epp_port in (self.metrics_port, 9400):
            raise ValueError("epp_port must differ from metrics_port and from dcgm-exporter's 9400")
        return self


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in dataclasses.fields(PluginConfig)}[name]
    if kind == "bool":
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return str(raw)


def load(argv: Sequence[str], env: Mapping[str, str]) -> PluginConfig:
    """Build the config: file (--config, `version: v1`) < env VGPU_DP_<FIELD> (and NODE_NAME) < flags."""
    fields = [f.name for f in dataclasses.fields(PluginConfig)]
    parser = argparse.ArgumentParser(prog="vgpu-device-plugin")
    parser.add_argument("--config", default=env.get(ENV_PREFIX + "CONFIG", ""))
    for name in fields:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None)
    args = parser.parse_args(list(argv))
    values: dict[str, Any] = {}
    if args.config:
        doc = yaml.safe_load(Path(args.config).read_text()) or {}
        if doc.get("version") != VERSION:
            raise ValueError(f"{args.config}: version must be {VERSION!r}")
        unknown = set(doc) - set(fields) - {"version"}
        if unknown:
            raise ValueError(f"{args.config}: unknown keys {sorted(unknown)}")
        values.update({k: v for k, v in doc.items() if k != "version"})
    if "NODE_NAME" in env:
        values["node_name"] = env["NODE_NAME"]
    for name in fields:
        if ENV_PREFIX + name.upper() in env:
            values[name] = env[ENV_PREFIX + name.upper()]
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return PluginConfig(**{k: _coerce(k, v) for k, v in values.items()}).validate()
