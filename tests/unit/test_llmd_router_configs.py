"""Every shipped llm-d router config checked against the contract of the router line it is for
(tests/unit/llmd_router_contract.py): plugin types, parameter names, the attribute spelling, where the
discovery plugin is named. Each config is also checked against the OTHER line and must fail there: that is
the version skew the two files exist for, and it proves the check can fail."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from device_plugin.config import PluginConfig
from device_plugin.telemetry import epp
from vgpu.roles import ROLE_LABEL, Role

from .llmd_router_contract import (
    CONFIGS,
    FEED_METRIC,
    FEED_POD_LABEL,
    GPU_ATTRIBUTE,
    GPU_PRODUCER,
    LINES,
    ROLE_VALUES,
    RouterLine,
)
from .llmd_router_contract import (
    ROLE_LABEL as ROUTER_ROLE_LABEL,
)

ROOT = Path(__file__).resolve().parents[2]
EPP = ROOT / "deploy" / "epp"


def _paths(value: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the leaves of a parameters mapping."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _paths(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip(".")


def _get(doc: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = doc
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    return cur


def problems(doc: Mapping[str, Any], line: RouterLine) -> list[str]:
    """What the router of `line` would refuse (or silently misread) in `doc`; empty when it loads."""
    out: list[str] = []
    names: set[str] = set()
    for p in doc.get("plugins") or []:
        ptype, name = p["type"], p.get("name", p["type"])
        names.add(name)
        accepted = line.plugins.get(ptype)
        if accepted is None:
            out.append(f"{name}: plugin type {ptype!r} is not in the {line.name} contract")
            continue
        for path in _paths(p.get("parameters") or {}):
            if path not in accepted:
                out.append(f"{name}: unknown parameter {path!r} for {ptype} on {line.name}")
        params = p.get("parameters") or {}
        key = {"endpoint-attribute-filter": "attribute", "endpoint-attribute-scorer": "attributeKey"}.get(ptype)
        if key is not None:
            if line.combined_attribute:
                if params.get(key) != f"{GPU_ATTRIBUTE}/{GPU_PRODUCER}":
                    out.append(f"{name}: {key} must be {GPU_ATTRIBUTE}/{GPU_PRODUCER} on {line.name}")
            else:
                if "/" in str(params.get(key)) and "producer" not in params:
                    out.append(f"{name}: {line.name} rejects the combined {key} spelling without producer")
                if params.get(key) != GPU_ATTRIBUTE or params.get("producer") != GPU_PRODUCER:
                    out.append(f"{name}: {key}/producer must be {GPU_ATTRIBUTE}/{GPU_PRODUCER} on {line.name}")
    data = doc.get("dataLayer") or {}
    for key in data:
        if key not in line.data_layer_keys:
            out.append(f"dataLayer: unknown key {key!r}")
    if "discovery" in data:
        ref = _get(data, line.discovery_ref)
        if ref is None:
            out.append(f"dataLayer.discovery: {line.name} names the plugin at dataLayer.{'.'.join(line.discovery_ref)}")
        elif ref not in names:
            out.append(f"dataLayer.discovery: {ref!r} is not a declared plugin")
        extra = set(data["discovery"]) - {line.discovery_ref[1]}
        if extra:
            out.append(f"dataLayer.discovery: unknown keys {sorted(extra)}")
    refs = {r["pluginRef"] for prof in doc.get("schedulingProfiles") or [] for r in prof["plugins"]}
    refs |= {s["pluginRef"] for s in data.get("sources") or []}
    refs |= {e["pluginRef"] for s in data.get("sources") or [] for e in s["extractors"]}
    out += [f"reference to undeclared plugin {r!r}" for r in sorted(refs - names)]
    return out


def _load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((EPP / name).read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_loads_on_its_router_line(name: str) -> None:
    doc = _load(name)
    assert doc["apiVersion"] == "llm-d.ai/v1alpha1" and doc["kind"] == "EndpointPickerConfig"
    assert problems(doc, LINES[CONFIGS[name]]) == []


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_is_refused_by_the_other_router_line(name: str) -> None:
    other = next(line for key, line in LINES.items() if key != CONFIGS[name])
    found = problems(_load(name), other)
    assert any("attribute" in p or "producer" in p for p in found), found


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_states_the_router_versions_it_is_for(name: str) -> None:
    head = " ".join((EPP / name).read_text().splitlines()[:2])  # the first sentence names the line
    assert ("router's v0.10.x" in head) == (CONFIGS[name] == "v0.10")
    assert ("router's MAIN branch" in head) == (CONFIGS[name] == "main")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_source_scrapes_our_feed_port(name: str) -> None:
    doc = _load(name)
    source = next(p for p in doc["plugins"] if p["type"] == "dcgm-data-source")
    assert source["parameters"]["port"] == PluginConfig().epp_port != 9400
    file_mode = any(p["type"] == "file-discovery" for p in doc["plugins"])
    # Kubernetes: the node's address; file discovery has no node, so the endpoint (host) address is scraped
    assert source["parameters"].get("useNodeAddress", False) is (not file_mode)


@pytest.mark.parametrize("name", [n for n in sorted(CONFIGS) if n.startswith("file-discovery")])
def test_file_discovery_snippet_watches_the_file(name: str) -> None:
    disc = next(p for p in _load(name)["plugins"] if p["type"] == "file-discovery")
    assert disc["parameters"]["watchFile"] is True
    assert disc["parameters"]["path"].startswith("/")


def test_the_check_catches_a_renamed_parameter() -> None:
    doc = _load("endpoint-picker-config.yaml")
    source = next(p for p in doc["plugins"] if p["type"] == "dcgm-data-source")
    source["parameters"]["interval"] = "1s"  # what this config carried before: refused by strict decoding
    assert problems(doc, LINES["main"]) == [
        "vgpu-slice-source: unknown parameter 'interval' for dcgm-data-source on main"
    ]


def test_feed_and_labels_match_the_router_contract() -> None:
    assert epp.METRIC == FEED_METRIC
    assert FEED_POD_LABEL in epp.FEED_LABELS
    assert ROLE_LABEL == ROUTER_ROLE_LABEL
    assert {r.value for r in Role} <= ROLE_VALUES


def test_docs_compatibility_table_names_every_config_and_line() -> None:
    text = (ROOT / "docs" / "telemetry.md").read_text()
    table = text.split("## Router versions", 1)[1].split("\n## ", 1)[0]
    for name, line in CONFIGS.items():
        row = next((r for r in table.splitlines() if f"deploy/epp/{name}" in r), None)
        assert row is not None, name
        assert LINES[line].versions in row, (name, row)
