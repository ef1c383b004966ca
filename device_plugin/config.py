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
from vgpu.config import ResourceNames

VERSION = "v1"
ENV_PREFIX = "VGPU_DP_"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node_name: str = ""
    resource_name: str = "nvidia.com/gpu"
    # The other request names, as the extender's `resources` settings: Allocate checks an assignment against
    # what the pod's requests resolve to (docs/device-plugin.md, "What is checked before serving").
    resource_memory: str = "nvidia.com/gpumem"
    resource_memory_percentage: str = "nvidia.com/gpumem-percentage"
    resource_cores: str = "nvidia.com/gpucores"
    resource_priority: str = "nvidia.com/priority"
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
    log_level: str = "info"
    log_format: str = "text"  # text | json (one object per line)

    def validate(self) -> PluginConfig:
        if not self.node_name:
            raise ValueError("node_name is required (flag --node-name, env VGPU_DP_NODE_NAME or NODE_NAME)")
        names = self.resource_names().all()
        if not all(names) or len(set(names)) != len(names):
            raise ValueError(f"resource names must be non-empty and distinct, got {list(names)}")
        if not self.cache_dir_on_host.startswith("/") or ".." in self.cache_dir_on_host.split("/"):
            raise ValueError(f"cache_dir_on_host must be an absolute path without '..', got {self.cache_dir_on_host!r}")
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
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"log_level must be one of debug, info, warning, error, got {self.log_level!r}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, got {self.log_format!r}")
        return self

    def resource_names(self) -> ResourceNames:
        return ResourceNames(
            count=self.resource_name,
            memory=self.resource_memory,
            memory_percentage=self.resource_memory_percentage,
            cores=self.resource_cores,
            priority=self.resource_priority,
        )


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in dataclasses.fields(PluginConfig)}[name]
    if kind == "bool":
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected {'an integer' if kind == 'int' else 'a number'}, got {raw!r}") from None
    return str(raw)


_HELP = {
    "node_name": "this node's name (also NODE_NAME from the downward API)",
    "resource_name": "extended resource advertised to the kubelet",
    "resource_memory": "request name for slice memory in MiB (as the extender's resources.memory)",
    "resource_memory_percentage": "request name for slice memory in percent (as the extender's)",
    "resource_cores": "request name for the SM share in percent (as the extender's resources.cores)",
    "resource_priority": "request name for the priority (as the extender's resources.priority)",
    "split_count": "slices (device replicas) advertised per GPU",
    "plugin_dir": "kubelet device-plugins folder (our socket and kubelet.sock)",
    "socket_name": "our socket's file name in plugin_dir",
    "pod_resources_socket": "kubelet PodResources API socket (pod identity for Allocate)",
    "mps": "hand out MPS limits (CUDA_MPS_*) and mount the MPS pipe",
    "cache_dir_on_host": "host folder for HAMi-core's shared memory cache per container",
    "inventory_refresh_s": "seconds between node inventory annotation refreshes",
    "health_probe_s": "seconds between NVML health probes",
    "xid_recovery_s": "seconds without a critical XID before a GPU is healthy again",
    "allocate_retry_s": "seconds Allocate waits for a pod's assignment to appear",
    "reconcile_s": "seconds between bind-phase reconciliations",
    "watchdog": "run the enforcement watchdog",
    "watchdog_interval_s": "seconds between watchdog cycles",
    "enforcement_steps": "ordered escalation steps, a subset of event,annotate,evict",
    "enforcement_dry_run": "log and count enforcement actions without taking them",
    "sm_window_s": "seconds SM use must stay over the quota to count as a violation",
    "sm_tolerance": "percentage points of SM over the quota that never count",
    "escalate_after_s": "seconds a violation lasts before the next step",
    "hard_memory_limits": "cap container GPU memory with nvmlDeviceSetMemoryLimits_v1 where supported",
    "proc_root": "the host's /proc (needs hostPID)",
    "cgroup_root": "the host's cgroup tree",
    "pods_refresh_s": "seconds between pod list refreshes",
    "metrics_port": "Prometheus exporter port (0 = off)",
    "epp_port": "EPP feed port serving DCGM_FI_DEV_GPU_UTIL per slice (0 = off)",
    "metrics_host": "address the exporters listen on",
    "discovery_file": "llm-d file-discovery endpoints file to keep up to date (empty = off)",
    "discovery_port": "model-server port written into the discovery file",
    "fake_nvml": "fake-NVML scenario file instead of the real driver (tests, demos)",
    "kubeconfig": "kubeconfig path (default: in-cluster config)",
    "log_level": "debug, info, warning or error",
    "log_format": "text, or json for one object per line",
}


def load(argv: Sequence[str], env: Mapping[str, str]) -> PluginConfig:
    """Build the config: file (--config, `version: v1`) < env VGPU_DP_<FIELD> (and NODE_NAME) < flags."""
    fields = [f.name for f in dataclasses.fields(PluginConfig)]
    parser = argparse.ArgumentParser(
        prog="vgpu-device-plugin",
        description="Per-node kubelet device plugin: advertises shareable GPUs, hands each container its slice, "
        "watches and enforces slices through NVML, exports telemetry (docs/device-plugin.md).",
        epilog=f"Every option is also an env variable {ENV_PREFIX}<OPTION> (upper case, underscores) and a key of "
        "the --config file (YAML, version: v1). Precedence: flags > env > file > defaults.",
    )
    parser.add_argument("--config", default=env.get(ENV_PREFIX + "CONFIG", ""), help="YAML config file (version: v1)")
    defaults = PluginConfig()
    for name in fields:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            metavar=name.upper(),
            help=f"{_HELP.get(name, name.replace('_', ' '))} (default: {getattr(defaults, name)!r})",
        )
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
