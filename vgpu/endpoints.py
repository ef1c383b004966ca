"""llm-d `file-discovery` endpoint files: validate one, merge several (one per host) into the file the router reads.

The router reads ONE file (pkg/epp/framework/plugins/datalayer/discovery/file/plugin.go @ 06986a05:
EndpointEntry{name, namespace (default "default"), address, port (a string), metricsHost, labels}); an
invalid address or port fails its initial load, and endpoints are keyed by namespace/name. Each node daemon
writes its own host's endpoints, so a multi-host setup needs them merged; this is the pure part of
`vgpu discovery merge`. Pure: the caller reads and writes the files.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_NAMESPACE = "default"  # what the router assumes for an entry without one
_FIELDS = frozenset({"name", "namespace", "address", "port", "metricsHost", "labels"})


class EndpointFileError(ValueError):
    """A file the router would refuse or misread; the message names the file, the entry and the field."""


def _entry(source: str, i: int, raw: Any) -> dict[str, Any]:
    where = f"{source}: endpoints[{i}]"
    if not isinstance(raw, Mapping):
        raise EndpointFileError(f"{where}: must be a mapping with name, address, port, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise EndpointFileError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_FIELDS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise EndpointFileError(f"{where}.name: required, a non-empty string")
    where = f"{source}: endpoint {name!r}"
    namespace = raw.get("namespace", DEFAULT_NAMESPACE)
    if not isinstance(namespace, str) or not namespace:
        raise EndpointFileError(f"{where}.namespace: must be a non-empty string when given")
    address = raw.get("address")
    try:
        ipaddress.ip_address(str(address))
    except ValueError:
        raise EndpointFileError(
            f"{where}.address: {address!r} is not an IP address; the router does not resolve names"
        ) from None
    port = raw.get("port")
    if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit():
        raise EndpointFileError(f"{where}.port: {port!r} is not a port number (1-65535)")
    if not 1 <= int(port) <= 65535:
        raise EndpointFileError(f"{where}.port: {port} is outside 1-65535")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise EndpointFileError(f"{where}.labels: must map strings to strings (quote numbers and booleans)")
    out: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "address": str(address),
        "port": str(int(port)),  # the router wants a string; YAML's unquoted 8000 is a number
        "labels": dict(sorted(labels.items())),
    }
    if "metricsHost" in raw:
        if not isinstance(raw["metricsHost"], str):
            raise EndpointFileError(f"{where}.metricsHost: must be a host:port string")
        out["metricsHost"] = raw["metricsHost"]
    return out


def parse_endpoints(source: str, doc: Any) -> list[dict[str, Any]]:
    """The endpoints of one file as the router reads them (namespace defaulted, port a string)."""
    if doc is None:
        return []  # an empty file: a host with nothing to serve yet
    if not isinstance(doc, Mapping) or set(doc) - {"endpoints"}:
        raise EndpointFileError(f"{source}: must be a mapping with one key, 'endpoints' (a list)")
    items = doc.get("endpoints") or []
    if not isinstance(items, list):
        raise EndpointFileError(f"{source}: 'endpoints' must be a list, got {type(items).__name__}")
    out = [_entry(source, i, raw) for i, raw in enumerate(items)]
    seen: dict[tuple[str, str], int] = {}
    for i, e in enumerate(out):
        key = (e["namespace"], e["name"])
        if key in seen:
            raise EndpointFileError(
                f"{source}: endpoint {key[0]}/{key[1]} is listed twice (entries {seen[key]} and {i})"
            )
        seen[key] = i
    return out


def merge_endpoints(files: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Every endpoint of every (source, parsed document), sorted by namespace/name. Two sources naming the same
    namespace/name is an error: the router keys endpoints by it and the feed matches on the name."""
    owner: dict[tuple[str, str], str] = {}
    merged: list[dict[str, Any]] = []
    for source, doc in files:
        for e in parse_endpoints(source, doc):
            key = (e["namespace"], e["name"])
            if key in owner:
                raise EndpointFileError(
                    f"endpoint {key[0]}/{key[1]} is in both {owner[key]} and {source}; names must be unique "
                    "across hosts (the router keys endpoints by namespace/name, the GPU feed by name)"
                )
            owner[key] = source
            merged.append(e)
    return sorted(merged, key=lambda e: (e["namespace"], e["name"]))
