"""Static checks of the shipped telemetry config: the EPP config is wired to our feed, and every metric the
Grafana dashboard queries is one our exporters produce (the e2e test then proves each query has data)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.config import PluginConfig
from device_plugin.telemetry.epp import METRIC, epp_registry
from device_plugin.telemetry.exporter import node_registry
from scheduler_extender.metrics import ExtenderMetrics

from .test_watchdog_cycle import SCENARIO, make, run_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_epp_config_uses_our_feed_and_declares_every_plugin_it_references() -> None:
    doc = yaml.safe_load((DEPLOY / "epp" / "endpoint-picker-config.yaml").read_text())
    assert doc["apiVersion"] == "llm-d.ai/v1alpha1" and doc["kind"] == "EndpointPickerConfig"
    names = {p.get("name", p["type"]) for p in doc["plugins"]}
    refs = {r["pluginRef"] for prof in doc["schedulingProfiles"] for r in prof["plugins"]}
    refs |= {s["pluginRef"] for s in doc["dataLayer"]["sources"]}
    refs |= {e["pluginRef"] for s in doc["dataLayer"]["sources"] for e in s["extractors"]}
    assert refs <= names, refs - names
    source = next(p for p in doc["plugins"] if p["type"] == "dcgm-data-source")
    assert source["parameters"]["port"] == PluginConfig().epp_port != 9400
    assert source["parameters"]["useNodeAddress"] is True
    types = {p["type"] for p in doc["plugins"]}
    assert {
        "dcgm-extractor",
        "endpoint-attribute-filter",
        "endpoint-attribute-scorer",
        "prefix-cache-scorer",
        "queue-scorer",
    } <= types


def test_dashboard_queries_only_metrics_we_export(tmp_path: Path) -> None:
    sim, wd, _ = make(tmp_path, scenario={**SCENARIO, "driver": "615.71.09", "memoryLimits": "supported"})
    run_for(sim, wd, 12)
    ext = ExtenderMetrics(sim.cluster_state())
    ext.latency.labels("filter").observe(0.001)
    ext.filter_failure("no-fit")
    text = "".join(
        generate_latest(r).decode() for r in (node_registry(wd.snapshot), epp_registry(wd.snapshot), ext.registry)
    )
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    dash = json.loads((DEPLOY / "grafana" / "kube-vgpu-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b((?:vgpu|DCGM)_[A-Za-z0-9_]+)\b", e)}
    assert METRIC in used
    assert used - exported == set()
