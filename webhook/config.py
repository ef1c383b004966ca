"""The webhook's settings (version v1): one flat, frozen record with its defaults and its validation.

Flat on purpose: every field is at once a flag (`--cert-file`), an environment variable
(`VGPU_WEBHOOK_CERT_FILE`) and a key of the YAML file (grouped into sections there, see
`webhook.config_load.FILE_SECTIONS`), so the precedence flags > env > file is a merge of three dicts.
Loading lives in `webhook.config_load`; nothing here reads the environment.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

from vgpu.config import RequestDefaults, ResourceNames

VERSION = "v1"
DEFAULT_SCHEDULER = "default-scheduler"

InventorySource = Literal["none", "static", "nodes"]
LogFormat = Literal["text", "json"]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class ConfigError(ValueError):
    """One or more settings are invalid; the message lists every problem."""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Every setting of `vgpu-webhook`, with the documented defaults (docs/webhook.md)."""

    # serving
    host: str = "0.0.0.0"
    port: int = 8443
    cert_file: str = "/etc/vgpu-webhook/tls/tls.crt"
    key_file: str = "/etc/vgpu-webhook/tls/tls.key"
    cert_reload_interval: float = 10.0
    # routing
    scheduler_name: str = "vgpu-scheduler"
    override_default_scheduler: bool = True
    # mutation
    apply_default_count: bool = True
    strip_stale_annotations: bool = True
    # resource names (HAMi-compatible)
    resource_count: str = "nvidia.com/gpu"
    resource_memory: str = "nvidia.com/gpumem"
    resource_memory_percentage: str = "nvidia.com/gpumem-percentage"
    resource_cores: str = "nvidia.com/gpucores"
    resource_priority: str = "nvidia.com/priority"
    # request defaults (vgpu.config.RequestDefaults)
    default_count: int = 1
    default_memory_percentage: int = 100
    default_cores: str = "proportional"
    default_priority: int = 1
    # cluster inventory for the "larger than any GPU" checks
    inventory_source: InventorySource = "nodes"
    max_gpu_memory_mib: int = 0
    max_gpus_per_node: int = 0
    kubeconfig: str = ""
    # logging
    log_format: LogFormat = "text"
    log_level: str = "info"

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


# `from __future__ import annotations` makes f.type a string; resolve the few kinds we use.
FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "float": float, "bool": bool}.get(str(f.type), str) for f in dataclasses.fields(WebhookConfig)
}


def problems(cfg: WebhookConfig) -> list[str]:
    """Every reason `cfg` cannot run, as human-readable lines (empty = valid)."""
    out: list[str] = []
    if not 1 <= cfg.port <= 65535:
        out.append(f"port: {cfg.port} is outside 1..65535")
    if not cfg.cert_file or not cfg.key_file:
        out.append("cert_file and key_file must both be set (the apiserver only calls webhooks over HTTPS)")
    if not 0.1 <= cfg.cert_reload_interval <= 3600:
        out.append(f"cert_reload_interval: {cfg.cert_reload_interval} is outside 0.1..3600 seconds")
    if not _DNS_SUBDOMAIN.match(cfg.scheduler_name):
        out.append(f"scheduler_name: {cfg.scheduler_name!r} is not a DNS subdomain")
    names = [cfg.resource_count, cfg.resource_memory, cfg.resource_memory_percentage]
    names += [cfg.resource_cores, cfg.resource_priority]
    for name in names:
        if not _RESOURCE_NAME.match(name):
            out.append(f"resource name {name!r} is not a qualified Kubernetes resource name")
    if len(set(names)) != len(names):
        out.append("resource names must be distinct")
    if not 1 <= cfg.default_count <= 64:
        out.append(f"default_count: {cfg.default_count} is outside 1..64")
    if not 1 <= cfg.default_memory_percentage <= 100:
        out.append(f"default_memory_percentage: {cfg.default_memory_percentage} is outside 1..100")
    if cfg.default_cores != "proportional" and not (cfg.default_cores.isdigit() and 0 <= int(cfg.default_cores) <= 100):
        out.append(f"default_cores: {cfg.default_cores!r} must be 'proportional' or an integer 0..100")
    if cfg.default_priority not in (0, 1):
        out.append(f"default_priority: {cfg.default_priority} must be 0 (high) or 1 (low)")
    if cfg.inventory_source not in ("none", "static", "nodes"):
        out.append(f"inventory_source: {cfg.inventory_source!r} must be none, static or nodes")
    if cfg.inventory_source == "static" and (cfg.max_gpu_memory_mib <= 0 or cfg.max_gpus_per_node <= 0):
        out.append("inventory_source static needs max_gpu_memory_mib > 0 and max_gpus_per_node > 0")
    if cfg.max_gpu_memory_mib < 0 or cfg.max_gpus_per_node < 0:
        out.append("max_gpu_memory_mib and max_gpus_per_node must not be negative")
    if cfg.log_format not in ("text", "json"):
        out.append(f"log_format: {cfg.log_format!r} must be text or json")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        out.append(f"log_level: {cfg.log_level!r} must be debug, info, warning or error")
    return out


def validate(cfg: WebhookConfig) -> WebhookConfig:
    """Return `cfg` unchanged, or raise ConfigError listing every problem."""
    found = problems(cfg)
    if found:
        raise ConfigError("invalid webhook configuration:\n  " + "\n  ".join(found))
    return cfg
