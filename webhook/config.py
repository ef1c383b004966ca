"""The webhook's settings (version v1): one flat, frozen model with its defaults, descriptions and validation.

Flat on purpose: every field is at once a flag (`--cert-file`), an environment variable
(`VGPU_WEBHOOK_CERT_FILE`) and a key of the YAML file (grouped into sections there, see `FILE_KEYS`).
Flags, env, file and `--help` all come from this model through `vgpu.settings.Schema` (webhook.config_load);
nothing here reads the environment.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vgpu.config import RequestDefaults, ResourceNames
from vgpu.settings import Problem, SettingsError

VERSION = "v1"
DEFAULT_SCHEDULER = "default-scheduler"

InventorySource = Literal["none", "static", "nodes"]
LogFormat = Literal["text", "json"]
ModelServerSizing = Literal["card", "slice", "off"]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

# One error type for every settings problem (the loader's, re-exported under the name the webhook used).
ConfigError = SettingsError


class WebhookConfig(BaseModel):
    """Every setting of `vgpu-webhook`, with the documented defaults (docs/webhook.md).

    Types are checked on construction; the ranges and cross-field rules are in `problems()`, which the
    loader applies, so tests may still build e.g. `port=0` (any free port) directly."""

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    # serving
    host: str = Field(default="0.0.0.0", description="listen address")
    port: int = Field(default=8443, description="HTTPS listen port, 1..65535")
    cert_file: str = Field(default="/etc/vgpu-webhook/tls/tls.crt", description="serving certificate (PEM)")
    key_file: str = Field(default="/etc/vgpu-webhook/tls/tls.key", description="private key of cert_file (PEM)")
    cert_reload_interval: float = Field(
        default=10.0, description="seconds between checks for a renewed certificate, 0.1..3600"
    )
    # routing
    scheduler_name: str = Field(default="vgpu-scheduler", description="schedulerName set on GPU pods")
    override_default_scheduler: bool = Field(
        default=True, description="also reroute GPU pods that name default-scheduler explicitly"
    )
    # mutation
    apply_default_count: bool = Field(
        default=True, description="add the default GPU count to pods that ask for GPU memory or cores only"
    )
    strip_stale_annotations: bool = Field(
        default=True, description="remove vgpu.io/ assignment annotations a new pod must not carry"
    )
    model_server_sizing: ModelServerSizing = Field(
        default="card",
        description="memory flag for vLLM / SGLang containers (docs/model-servers.md): card = a fraction of the "
        "physical card (what CUDA reports on plain and NVML-capped nodes; safe on any); slice = of the slice, only "
        "when every GPU node preloads HAMi-core; off = none",
    )
    # resource names (HAMi-compatible)
    resource_count: str = Field(default="nvidia.com/gpu", description="resource name of the GPU count")
    resource_memory: str = Field(default="nvidia.com/gpumem", description="resource name of GPU memory (MiB)")
    resource_memory_percentage: str = Field(
        default="nvidia.com/gpumem-percentage", description="resource name of GPU memory in percent"
    )
    resource_cores: str = Field(default="nvidia.com/gpucores", description="resource name of the SM share")
    resource_priority: str = Field(default="nvidia.com/priority", description="resource name of the priority")
    # request defaults (vgpu.config.RequestDefaults)
    default_count: int = Field(default=1, description="GPUs per container when only memory/cores are asked, 1..64")
    default_memory_percentage: int = Field(
        default=100, description="GPU memory in percent when a request names none, 1..100"
    )
    default_cores: str = Field(
        default="proportional", description="SM share when a request names none: proportional or 0..100"
    )
    default_priority: int = Field(default=1, description="priority when a request names none: 0 (high) or 1 (low)")
    # cluster inventory for the "larger than any GPU" checks
    inventory_source: InventorySource = Field(
        default="nodes", description="where the largest GPU comes from for capacity checks"
    )
    max_gpu_memory_mib: int = Field(default=0, description="largest GPU's memory for inventory_source static")
    max_gpus_per_node: int = Field(default=0, description="most GPUs on one node for inventory_source static")
    kubeconfig: str = Field(default="", description="kubeconfig for the nodes inventory; empty = in-cluster")
    # logging
    log_format: LogFormat = Field(default="text", description="text, or json for one object per line")
    log_level: str = Field(default="info", description="debug, info, warning or error")
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        description="largest AdmissionReview accepted, 64 KiB..256 MiB; a longer one is refused with 413 while it "
        "streams in (the apiserver sends at most two 3 MiB pods: object and oldObject)",
    )
    max_json_values: int = Field(
        default=200_000,
        description="most JSON values in one AdmissionReview (commas and brackets counted), at least 1000: bounds "
        "parse time and memory",
    )
    request_read_timeout_seconds: float = Field(
        default=10.0, description="a request must arrive whole within this long, or its connection is closed; 0.1..300"
    )
    max_connections: int = Field(default=1000, description="open connections served at once; beyond them 503")

    def resource_names(self) -> ResourceNames:
        return ResourceNames(
            count=self.resource_count,
            memory=self.resource_memory,
            memory_percentage=self.resource_memory_percentage,
            cores=self.resource_cores,
            priority=self.resource_priority,
        )

    def request_defaults(self) -> RequestDefaults:
        cores: Literal["proportional"] | int = (
            "proportional" if self.default_cores == "proportional" else int(self.default_cores)
        )
        return RequestDefaults(
            count=self.default_count,
            memory_percentage=self.default_memory_percentage,
            cores=cores,
            priority=self.default_priority,
        )


def problems(cfg: WebhookConfig) -> list[Problem]:
    """Every reason `cfg` cannot run, as (setting, human-readable line) pairs (empty = valid)."""
    out: list[Problem] = []
    if not 1 <= cfg.port <= 65535:
        out.append(("port", f"port: {cfg.port} is outside 1..65535"))
    if not cfg.cert_file or not cfg.key_file:
        out.append(("", "cert_file and key_file must both be set (the apiserver only calls webhooks over HTTPS)"))
    if not 0.1 <= cfg.cert_reload_interval <= 3600:
        out.append(
            ("cert_reload_interval", f"cert_reload_interval: {cfg.cert_reload_interval} is outside 0.1..3600 seconds")
        )
    if not _DNS_SUBDOMAIN.match(cfg.scheduler_name):
        out.append(("scheduler_name", f"scheduler_name: {cfg.scheduler_name!r} is not a DNS subdomain"))
    names = {
        "resource_count": cfg.resource_count,
        "resource_memory": cfg.resource_memory,
        "resource_memory_percentage": cfg.resource_memory_percentage,
        "resource_cores": cfg.resource_cores,
        "resource_priority": cfg.resource_priority,
    }
    for key, name in names.items():
        if not _RESOURCE_NAME.match(name):
            out.append((key, f"{key}: {name!r} is not a qualified Kubernetes resource name"))
    if len(set(names.values())) != len(names):
        out.append(("", "resource names must be distinct: " + ", ".join(f"{k}={v}" for k, v in names.items())))
    if not 1 <= cfg.default_count <= 64:
        out.append(("default_count", f"default_count: {cfg.default_count} is outside 1..64"))
    if not 1 <= cfg.default_memory_percentage <= 100:
        out.append(
            (
                "default_memory_percentage",
                f"default_memory_percentage: {cfg.default_memory_percentage} is outside 1..100",
            )
        )
    if cfg.default_cores != "proportional" and not (cfg.default_cores.isdigit() and 0 <= int(cfg.default_cores) <= 100):
        out.append(
            ("default_cores", f"default_cores: {cfg.default_cores!r} must be 'proportional' or an integer 0..100")
        )
    if cfg.default_priority not in (0, 1):
        out.append(("default_priority", f"default_priority: {cfg.default_priority} must be 0 (high) or 1 (low)"))
    if cfg.inventory_source == "static" and (cfg.max_gpu_memory_mib <= 0 or cfg.max_gpus_per_node <= 0):
        out.append(
            ("inventory_source", "inventory_source static needs max_gpu_memory_mib > 0 and max_gpus_per_node > 0")
        )
    if cfg.max_gpu_memory_mib < 0 or cfg.max_gpus_per_node < 0:
        out.append(("", "max_gpu_memory_mib and max_gpus_per_node must not be negative"))
    if not 64 * 1024 <= cfg.max_body_bytes <= 256 * 1024 * 1024:
        out.append(("max_body_bytes", f"max_body_bytes: {cfg.max_body_bytes} is outside 65536..268435456"))
    if not 0.1 <= cfg.request_read_timeout_seconds <= 300:
        out.append(
            (
                "request_read_timeout_seconds",
                f"request_read_timeout_seconds: {cfg.request_read_timeout_seconds} is outside 0.1..300",
            )
        )
    if cfg.max_json_values < 1000:
        out.append(("max_json_values", f"max_json_values: {cfg.max_json_values} must be at least 1000"))
    if cfg.max_connections < 1:
        out.append(("max_connections", f"max_connections: {cfg.max_connections} must be at least 1"))
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        out.append(("log_level", f"log_level: {cfg.log_level!r} must be debug, info, warning or error"))
    return out
