"""Load `WebhookConfig` from flags > environment (`VGPU_WEBHOOK_*`) > YAML file (`version: v1`) > defaults.

Each source becomes a flat `{field: value}` dict; the merge is a dict update in precedence order, then
`webhook.config.validate`. Unknown file keys and unknown `VGPU_WEBHOOK_*` variables are errors, so a
typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from webhook.config import FIELD_TYPES, VERSION, ConfigError, WebhookConfig, validate

ENV_PREFIX = "VGPU_WEBHOOK_"

# YAML section -> {file key -> flat field}.
FILE_SECTIONS: dict[str, dict[str, str]] = {
    "listen": {"host": "host", "port": "port"},
    "tls": {"certFile": "cert_file", "keyFile": "key_file", "reloadIntervalSeconds": "cert_reload_interval"},
    "scheduler": {"name": "scheduler_name", "overrideDefaultScheduler": "override_default_scheduler"},
    "mutation": {"applyDefaultCount": "apply_default_count", "stripStaleAnnotations": "strip_stale_annotations"},
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

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def coerce(field: str, value: object, source: str) -> object:
    """Convert a raw value (YAML scalar or string) to the field's type, naming the source on error."""
    kind = FIELD_TYPES[field]
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError("expected true or false")
        if kind is int:
            if isinstance(value, (bool, float)):
                raise ValueError("expected an integer")
            return int(str(value).strip())
        if kind is float:
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(str(value).strip())
        if value is None or isinstance(value, (dict, list)):
            raise ValueError("expected a string")
        return str(value)
    except ValueError as exc:
        raise ConfigError(f"{source}: {field}={value!r}: {exc}") from None


def from_file(path: str | Path) -> dict[str, object]:
    """Flat values from a `version: v1` YAML file."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    return from_document(doc or {}, source=str(path))


def from_document(doc: object, *, source: str = "config file") -> dict[str, object]:
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if doc.get("version") != VERSION:
        raise ConfigError(f"{source}: 'version' must be {VERSION!r}, got {doc.get('version')!r}")
    out: dict[str, object] = {}
    errors: list[str] = []
    for section, body in doc.items():
        if section == "version":
            continue
        keys = FILE_SECTIONS.get(str(section))
        if keys is None:
            errors.append(f"unknown section {section!r} (known: {', '.join(FILE_SECTIONS)})")
            continue
        if not isinstance(body, Mapping):
            errors.append(f"section {section!r} must be a mapping")
            continue
        for key, value in body.items():
            field = keys.get(str(key))
            if field is None:
                errors.append(f"unknown key {section}.{key} (known: {', '.join(keys)})")
                continue
            try:
                out[field] = coerce(field, value, f"{source} {section}.{key}")
            except ConfigError as exc:
                errors.append(str(exc))
    if errors:
        raise ConfigError(f"{source}:\n  " + "\n  ".join(errors))
    return out


def from_env(environ: Mapping[str, str]) -> dict[str, object]:
    """Flat values from `VGPU_WEBHOOK_<FIELD>` variables (CONFIG, the file path, is not a field)."""
    out: dict[str, object] = {}
    unknown: list[str] = []
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        field = name[len(ENV_PREFIX) :].lower()
        if field not in FIELD_TYPES:
            unknown.append(name)
            continue
        out[field] = coerce(field, raw, f"environment {name}")
    if unknown:
        raise ConfigError(f"unknown environment variables: {', '.join(sorted(unknown))}")
    return out


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One `--field-name` flag per setting; None (absent) never overrides env or file."""
    parser.add_argument("--config", default=None, help="YAML config file (version: v1); env VGPU_WEBHOOK_CONFIG")
    for field in FIELD_TYPES:
        default = getattr(WebhookConfig(), field)
        parser.add_argument(
            "--" + field.replace("_", "-"), dest=field, default=None, metavar="VALUE", help=f"(default: {default})"
        )


def from_flags(args: argparse.Namespace) -> dict[str, object]:
    return {
        field: coerce(field, getattr(args, field), f"flag --{field.replace('_', '-')}")
        for field in FIELD_TYPES
        if getattr(args, field, None) is not None
    }


def load(
    *, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None, argv: Sequence[str] = ()
) -> WebhookConfig:
    """Merge defaults < file < env < flags and validate. `argv` is parsed when `args` is not given."""
    if args is None:
        parser = argparse.ArgumentParser()
        add_flags(parser)
        args = parser.parse_args(list(argv))
    env = dict(environ or {})
    merged: dict[str, Any] = {}
    path = args.config or env.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(from_file(path))
    merged.update(from_env(env))
    merged.update(from_flags(args))
    return validate(dataclasses.replace(WebhookConfig(), **merged))
