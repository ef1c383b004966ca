"""Settings of `vgpu-standalone-node` (version v1): flags, `VGPU_NODE_<FIELD>` variables and a file, through
vgpu.settings.Schema like the other services (docs/configuration.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vgpu.settings import Problem, Schema

VERSION = "v1"


class StandaloneConfig(BaseModel):
    """Every setting of `vgpu-standalone-node`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoints: str = Field(default="", description="this host's endpoints file (docs/standalone.md)")
    node_name: str = Field(default="", description="this host's name in the node exporter (default: the hostname)")
    host: str = Field(
        default="0.0.0.0", description="address the feed and exporter listen on (the endpoints' address, or all)"
    )
    epp_port: int = Field(default=9402, description="router feed port, DCGM_FI_DEV_GPU_UTIL per endpoint (0 = off)")
    metrics_port: int = Field(default=9401, description="node exporter port (0 = off)")
    discovery_file: str = Field(
        default="", description="this host's llm-d file-discovery file to keep up to date (empty = off)"
    )
    proc_root: str = Field(default="/proc", description="the host's /proc (cgroup attribution)")
    interval_s: float = Field(default=1.0, description="seconds between watchdog cycles")
    refresh_s: float = Field(default=5.0, description="seconds between checks of the endpoints file for changes")
    http_timeout_s: float = Field(default=10.0, description="seconds a connection may take to be answered")
    http_max_connections: int = Field(default=64, description="connections served at once per port")
    fake_nvml: str = Field(default="", description="fake-NVML scenario file instead of the real driver (tests, demos)")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log verbosity")
    log_format: Literal["text", "json"] = Field(default="text", description="text, or json for one object per line")


def problems(c: StandaloneConfig) -> list[Problem]:
    out: list[Problem] = []
    if not c.endpoints:
        out.append(("endpoints", "endpoints is required: the file listing this host's model servers (--endpoints)"))
    for name in ("epp_port", "metrics_port"):
        if not 0 <= getattr(c, name) <= 65535:
            out.append((name, f"{name} must be 0..65535, got {getattr(c, name)}"))
    if c.epp_port and c.epp_port in (c.metrics_port, 9400):
        out.append(("epp_port", "epp_port must differ from metrics_port and from dcgm-exporter's 9400"))
    for name, lo, hi in (("interval_s", 0.1, 60), ("refresh_s", 0.1, 3600), ("http_timeout_s", 0.5, 300)):
        if not lo <= getattr(c, name) <= hi:
            out.append((name, f"{name} must be {lo}..{hi}, got {getattr(c, name)}"))
    if not 1 <= c.http_max_connections <= 4096:
        out.append(("http_max_connections", f"http_max_connections must be 1..4096, got {c.http_max_connections}"))
    return out


SCHEMA: Schema[StandaloneConfig] = Schema(
    model=StandaloneConfig,
    prog="vgpu-standalone-node",
    description="The node daemon on a host outside Kubernetes: GPU use per endpoint of a local endpoints file, "
    "served as the llm-d router's DCGM feed on the host address, plus this host's file-discovery file.",
    env_prefix="VGPU_NODE_",
    version=VERSION,
    require_version=False,
)


def load(argv: Sequence[str], env: Mapping[str, str]) -> StandaloneConfig:
    return SCHEMA.load(argv, env, lambda p: Path(p).read_text(encoding="utf-8"), check=problems)
