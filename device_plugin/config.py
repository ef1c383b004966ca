"""Device plugin configuration (version v1): one pydantic model with defaults and descriptions.

Flags, `VGPU_DP_<FIELD>` variables (and NODE_NAME from the downward API), file keys and `--help` all come
from this model through `vgpu.settings.Schema`; precedence flags > env > file > defaults (see load()).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from device_plugin.envs import EnvSettings
from device_plugin.watchdog.ladder import parse_steps
from vgpu.config import ResourceNames
from vgpu.priority import DEFAULT_ONLINE_PRIORITY_MIN
from vgpu.settings import Problem, Schema

VERSION = "v1"
ENV_PREFIX = "VGPU_DP_"

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


class PluginConfig(BaseModel):
    """Every setting of `vgpu-device-plugin`. Types are checked on construction, ranges by `problems()`."""

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    node_name: str = Field(default="", description="this node's name (also NODE_NAME from the downward API)")
    resource_name: str = Field(default="nvidia.com/gpu", description="extended resource advertised to the kubelet")
    # The other request names, as the extender's `resources` settings: Allocate checks an assignment against
    # what the pod's requests resolve to (docs/device-plugin.md, "What is checked before serving").
    resource_memory: str = Field(
        default="nvidia.com/gpumem",
        description="request name for slice memory in MiB (as the extender's resources.memory)",
    )
    resource_memory_percentage: str = Field(
        default="nvidia.com/gpumem-percentage",
        description="request name for slice memory in percent (as the extender's)",
    )
    resource_cores: str = Field(
        default="nvidia.com/gpucores",
        description="request name for the SM share in percent (as the extender's resources.cores)",
    )
    resource_priority: str = Field(
        default="nvidia.com/priority",
        description="request name for the priority (as the extender's resources.priority)",
    )
    split_count: int = Field(default=10, description="slices (device replicas) advertised per GPU")
    plugin_dir: str = Field(
        default="/var/lib/kubelet/device-plugins",
        description="kubelet device-plugins folder (our socket and kubelet.sock)",
    )
    socket_name: str = Field(default="vgpu.sock", description="our socket's file name in plugin_dir")
    pod_resources_socket: str = Field(
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        description="kubelet PodResources API socket (pod identity for Allocate)",
    )
    # The node's Topology Manager (docs/device-plugin.md, "Topology Manager agreement"): stated in the node
    # inventory so that the extender assigns only GPUs the kubelet will offer.
    topology_manager_policy: Literal["", "none", "best-effort", "restricted", "single-numa-node"] = Field(
        default="", description="the kubelet's topology manager policy; empty = topologyManagerPolicy of kubelet_config"
    )
    topology_manager_scope: Literal["", "container", "pod"] = Field(
        default="", description="the kubelet's topology manager scope; empty = topologyManagerScope of kubelet_config"
    )
    kubelet_config: str = Field(
        default="/var/lib/kubelet/config.yaml",
        description="the kubelet's KubeletConfiguration file, read when the two above are empty (unreadable: NUMA not sent)",
    )
    numa_topology: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="send each replica's NUMA node to the kubelet: auto = except under best-effort (see the docs)",
    )
    mps: bool = Field(
        default=False,
        description="run the MPS control daemon on this node and hand out MPS limits (CUDA_MPS_*), pipe and /dev/shm",
    )
    # MPS (docs/enforcement.md, "MPS"): host paths, mounted at the same paths in the plugin's container.
    mps_control_binary: str = Field(
        default="nvidia-cuda-mps-control",
        description="the host driver's nvidia-cuda-mps-control (path or name on PATH)",
    )
    mps_pipe_dir: str = Field(default="/var/run/vgpu/mps/pipe", description="MPS pipe folder shared with clients")
    mps_log_dir: str = Field(default="/var/run/vgpu/mps/log", description="MPS log folder (read-only in clients)")
    mps_shm_dir: str = Field(
        default="/var/run/vgpu/mps/shm", description="host folder the daemon and its clients share as /dev/shm"
    )
    mps_probe_s: float = Field(default=5.0, description="seconds between MPS control daemon liveness probes")
    mps_backoff_max_s: float = Field(default=60.0, description="longest wait between MPS daemon restart attempts")
    mps_default_active_thread_percentage: int = Field(
        default=0, description="SM percentage for MPS clients that set none (0 = not sent to the daemon)"
    )
    mps_default_pinned_mem_limit_mib: int = Field(
        default=0, description="per-GPU memory MiB for MPS clients that set none (0 = not sent to the daemon)"
    )
    hami_core_library: str = Field(
        default="",
        description="host path of HAMi-core's libvgpu.so: mounted and preloaded in every slice (empty = off, "
        "CUDA_DEVICE_*_LIMIT env is inert)",
    )
    hami_core_dir: str = Field(
        default="/var/run/vgpu/hami-core", description="host folder for the ld.so.preload file and HAMi-core's lock"
    )
    online_priority_min: int = Field(
        default=DEFAULT_ONLINE_PRIORITY_MIN,
        description="PriorityClass value from which a pod is online: its slices get runtime priority high "
        "(CUDA_TASK_PRIORITY / CUDA_MPS_CLIENT_PRIORITY 0, else 1) unless a container sets nvidia.com/priority",
    )
    cache_dir_on_host: str = Field(
        default="/var/run/vgpu/containers", description="host folder for HAMi-core's shared memory cache per container"
    )
    inventory_refresh_s: float = Field(default=60.0, description="seconds between node inventory annotation refreshes")
    health_probe_s: float = Field(default=5.0, description="seconds between NVML health probes")
    xid_recovery_s: float = Field(
        default=60.0, description="seconds without a critical XID before a GPU is healthy again"
    )
    allocate_retry_s: float = Field(default=2.0, description="seconds Allocate waits for a pod's assignment to appear")
    reconcile_s: float = Field(default=30.0, description="seconds between bind-phase reconciliations")
    # Connection limits (docs/device-plugin.md, "Limits"): the gRPC socket and the HTTP exporters.
    grpc_workers: int = Field(default=16, description="gRPC worker threads (each RPC in flight holds one)")
    grpc_keepalive_s: float = Field(
        default=60.0, description="seconds a gRPC connection may be silent before it is pinged (closed unanswered)"
    )
    grpc_max_idle_s: float = Field(default=300.0, description="seconds a gRPC connection may carry no RPC")
    grpc_max_message_bytes: int = Field(default=1 << 20, description="largest gRPC request accepted, in bytes")
    http_timeout_s: float = Field(
        default=10.0, description="seconds an exporter connection may take to send its request and be answered"
    )
    http_max_connections: int = Field(default=64, description="exporter connections served at once per port")
    # Watchdog and telemetry (docs/enforcement.md, docs/telemetry.md).
    watchdog: bool = Field(default=True, description="run the enforcement watchdog")
    watchdog_interval_s: float = Field(default=1.0, description="seconds between watchdog cycles")
    enforcement_steps: str = Field(
        default="event,annotate", description="ordered escalation steps, a subset of event,annotate,evict"
    )
    enforcement_dry_run: bool = Field(
        default=False, description="log and count enforcement actions without taking them"
    )
    sm_window_s: float = Field(
        default=30.0, description="seconds SM use must stay over the quota to count as a violation"
    )
    sm_tolerance: float = Field(default=5.0, description="percentage points of SM over the quota that never count")
    escalate_after_s: float = Field(default=30.0, description="seconds a violation lasts before the next step")
    hard_memory_limits: bool = Field(
        default=True, description="cap container GPU memory with nvmlDeviceSetMemoryLimits_v1 where supported"
    )
    proc_root: str = Field(default="/proc", description="the host's /proc (needs hostPID)")
    cgroup_root: str = Field(default="/sys/fs/cgroup", description="the host's cgroup tree")
    pods_refresh_s: float = Field(default=10.0, description="seconds between pod list refreshes")
    metrics_port: int = Field(default=9401, description="Prometheus exporter port (0 = off)")
    epp_port: int = Field(default=9402, description="EPP feed port serving DCGM_FI_DEV_GPU_UTIL per slice (0 = off)")
    metrics_host: str = Field(default="0.0.0.0", description="address the exporters listen on")
    discovery_file: str = Field(
        default="", description="llm-d file-discovery endpoints file to keep up to date (empty = off)"
    )
    discovery_port: str = Field(default="8000", description="model-server port written into the discovery file")
    fake_nvml: str = Field(default="", description="fake-NVML scenario file instead of the real driver (tests, demos)")
    kubeconfig: str = Field(default="", description="kubeconfig path; unset = in-cluster config")
    log_level: LogLevel = Field(default="info", description="debug, info, warning or error")
    log_format: LogFormat = Field(default="text", description="text, or json for one object per line")

    def env_settings(self) -> EnvSettings:
        return EnvSettings(
            mps=self.mps,
            cache_dir_on_host=self.cache_dir_on_host,
            mps_pipe_dir=self.mps_pipe_dir,
            mps_log_dir=self.mps_log_dir,
            mps_shm_dir=self.mps_shm_dir,
            hami_core_library=self.hami_core_library,
            hami_core_preload_file=posixpath.join(self.hami_core_dir, "ld.so.preload"),
            hami_core_lock_dir=posixpath.join(self.hami_core_dir, "vgpulock"),
            online_priority_min=self.online_priority_min,
        )

    def resource_names(self) -> ResourceNames:
        return ResourceNames(
            count=self.resource_name,
            memory=self.resource_memory,
            memory_percentage=self.resource_memory_percentage,
            cores=self.resource_cores,
            priority=self.resource_priority,
        )


def problems(c: PluginConfig) -> list[Problem]:
    """Every reason `c` cannot run, as (setting, line) pairs (empty = valid)."""
    out: list[Problem] = []
    if not c.node_name:
        out.append(("", "node_name is required (flag --node-name, env VGPU_DP_NODE_NAME or NODE_NAME)"))
    names = c.resource_names().all()
    if not all(names) or len(set(names)) != len(names):
        out.append(("", f"resource names must be non-empty and distinct, got {list(names)}"))
    if not c.cache_dir_on_host.startswith("/") or ".." in c.cache_dir_on_host.split("/"):
        out.append(
            (
                "cache_dir_on_host",
                f"cache_dir_on_host must be an absolute path without '..', got {c.cache_dir_on_host!r}",
            )
        )
    for name in ("mps_pipe_dir", "mps_log_dir", "mps_shm_dir", "hami_core_dir", "hami_core_library"):
        value = getattr(c, name)
        if (value or name != "hami_core_library") and (not value.startswith("/") or ".." in value.split("/")):
            out.append((name, f"{name} must be an absolute path without '..', got {value!r}"))
    if not c.mps_control_binary.strip() or any(ch.isspace() for ch in c.mps_control_binary):
        out.append(
            (
                "mps_control_binary",
                "mps_control_binary must be a path or name of nvidia-cuda-mps-control without spaces, "
                f"got {c.mps_control_binary!r}",
            )
        )
    if not 0 <= c.mps_default_active_thread_percentage <= 100:
        out.append(
            (
                "mps_default_active_thread_percentage",
                f"mps_default_active_thread_percentage must be 0..100, got {c.mps_default_active_thread_percentage}",
            )
        )
    if c.mps_default_pinned_mem_limit_mib < 0:
        out.append(
            (
                "mps_default_pinned_mem_limit_mib",
                f"mps_default_pinned_mem_limit_mib must be >= 0, got {c.mps_default_pinned_mem_limit_mib}",
            )
        )
    if not 0.1 <= c.mps_probe_s <= 300 or not 1 <= c.mps_backoff_max_s <= 3600:
        out.append(
            (
                "mps_probe_s",
                f"mps_probe_s must be 0.1..300 and mps_backoff_max_s 1..3600, got "
                f"{c.mps_probe_s} and {c.mps_backoff_max_s}",
            )
        )
    if not 1 <= c.split_count <= 100:
        out.append(("split_count", f"split_count must be 1..100, got {c.split_count}"))
    if not 0.1 <= c.watchdog_interval_s <= 60:
        out.append(("watchdog_interval_s", f"watchdog_interval_s must be 0.1..60, got {c.watchdog_interval_s}"))
    try:
        parse_steps(c.enforcement_steps)
    except ValueError as exc:
        out.append(("enforcement_steps", f"enforcement_steps: {exc}"))
    for name, lo, hi in (
        ("grpc_workers", 2, 256),
        ("grpc_keepalive_s", 10, 3600),
        ("grpc_max_idle_s", 10, 86400),
        ("grpc_max_message_bytes", 64 << 10, 64 << 20),
        ("http_timeout_s", 0.5, 300),
        ("http_max_connections", 1, 4096),
    ):
        if not lo <= getattr(c, name) <= hi:
            out.append((name, f"{name} must be {lo}..{hi}, got {getattr(c, name)}"))
    for name in ("metrics_port", "epp_port"):
        if not 0 <= getattr(c, name) <= 65535:
            out.append((name, f"{name} must be 0..65535, got {getattr(c, name)}"))
    if c.epp_port and c.epp_port in (c.metrics_port, 9400):
        out.append(("epp_port", "epp_port must differ from metrics_port and from dcgm-exporter's 9400"))
    return out


SCHEMA: Schema[PluginConfig] = Schema(
    model=PluginConfig,
    prog="vgpu-device-plugin",
    description="Per-node kubelet device plugin: advertises shareable GPUs, hands each container its slice, "
    "watches and enforces slices through NVML, exports telemetry (docs/device-plugin.md).",
    env_prefix=ENV_PREFIX,
    env_aliases={"NODE_NAME": "node_name"},
    version=VERSION,
)


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def load(argv: Sequence[str], env: Mapping[str, str]) -> PluginConfig:
    """defaults < file (--config or VGPU_DP_CONFIG, `version: v1`) < env NODE_NAME < env VGPU_DP_<FIELD> < flags."""
    return SCHEMA.load(argv, env, _read, check=problems)
