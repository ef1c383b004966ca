"""Load `WebhookConfig` from flags > environment (`VGPU_WEBHOOK_*`) > YAML file (`version: v1`) > defaults.

The flags, variables, file keys and `--help` all come from the model through `vgpu.settings.Schema`; this
module only says how the file groups the flat fields into sections and does the I/O (os.environ is handed
in by main, the file is read here). Unknown file keys and unknown `VGPU_WEBHOOK_*` variables are errors, so
a typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from vgpu.settings import Schema
from webhook.config import VERSION, WebhookConfig, problems

ENV_PREFIX = "VGPU_WEBHOOK_"

# YAML section -> {file key -> flat field}.
FILE_SECTIONS: dict[str, dict[str, str]] = {
    "listen": {"host": "host", "port": "port"},
    "limits": {
        "maxBodyBytes": "max_body_bytes",
        "maxJsonValues": "max_json_values",
        "requestReadTimeoutSeconds": "request_read_timeout_seconds",
        "maxConnections": "max_connections",
    },
    "tls": {"certFile": "cert_file", "keyFile": "key_file", "reloadIntervalSeconds": "cert_reload_interval"},
    "scheduler": {"name": "scheduler_name", "overrideDefaultScheduler": "override_default_scheduler"},
    "mutation": {
        "applyDefaultCount": "apply_default_count",
        "stripStaleAnnotations": "strip_stale_annotations",
        "modelServerSizing": "model_server_sizing",
    },
    "resources": {
        "count": "resource_count",
        "memory": "resource_memory",
        "memoryPercentage": "resource_memory_percentage",
        "cores": "resource_cores",
        "priority": "resource_priority",
    },
    "defaults": {
        "count": "default_count",
        "memoryPercentage": "default_memory_percentage",
        "cores": "default_cores",
        "priority": "default_priority",
    },
    "inventory": {
        "source": "inventory_source",
        "maxGpuMemoryMiB": "max_gpu_memory_mib",
        "maxGpusPerNode": "max_gpus_per_node",
        "kubeconfig": "kubeconfig",
    },
    "logging": {"format": "log_format", "level": "log_level"},
}

SCHEMA: Schema[WebhookConfig] = Schema(
    model=WebhookConfig,
    prog="vgpu-webhook",
    description="kube-vgpu mutating admission webhook",
    env_prefix=ENV_PREFIX,
    file_keys={field: f"{section}.{key}" for section, keys in FILE_SECTIONS.items() for key, field in keys.items()},
    version=VERSION,
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """--config and one `--field-name` flag per setting, each with its description and default."""
    SCHEMA.add_arguments(parser)


def from_document(doc: object, *, source: str = "config file") -> dict[str, object]:
    """Flat {field: raw value} of a parsed `version: v1` file (for tests and the chart's checks)."""
    return {path[0]: value for path, (value, _origin) in SCHEMA.from_document(doc, source).items()}


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def load(
    *, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None, argv: Sequence[str] = ()
) -> WebhookConfig:
    """Merge defaults < file < env < flags and validate. `argv` is parsed when `args` is not given."""
    if args is None:
        args = SCHEMA.parser().parse_args(list(argv))
    return SCHEMA.load_args(args, dict(environ or {}), _read, check=problems)
