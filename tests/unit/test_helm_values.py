"""The Helm chart's static files (no helm needed): values.yaml is documented and valid under values.schema.json,
the schema's node-policy enum is the policy registry, the chart's version follows the package, and its copy of the
Grafana dashboard is the shipped one. tests/integration/test_helm_chart.py renders the chart with the real helm."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu.placement import registry

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kube-vgpu"
# Keys whose contents are free-form Kubernetes or label maps: their sub-keys need no comment of their own.
FREE_FORM = {"resources", "affinity", "nodeSelector", "tolerations", "labels", "annotations"}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_schema_node_policies_are_the_registered_ones() -> None:
    # A policy added to (or removed from) vgpu/placement/registry.py must be added to the schema too;
    # experiment variants stay out: the chart offers production policies only.
    enum = _schema()["properties"]["extender"]["properties"]["nodePolicy"]["enum"]
    assert sorted(enum) == registry.production_names()
    assert not registry.EXPERIMENTAL & set(enum)


def test_values_yaml_is_valid_under_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(_schema())
    jsonschema.Draft202012Validator(_schema()).validate(_values())


def test_every_value_is_documented_with_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z_][\w.-]*):", line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join(k for _, k in [*stack, (indent, key)])
        if not any(k in FREE_FORM for _, k in stack) and not lines[i - 1].strip().startswith("#"):
            undocumented.append(path)
        stack.append((indent, key))
    assert undocumented == []


def test_chart_version_follows_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2" and chart["name"] == "kube-vgpu" and chart["type"] == "application"
    assert chart["appVersion"] == project["version"]
    assert _values()["image"]["tag"] == ""  # the image tag follows appVersion


def test_chart_dashboard_is_the_shipped_one() -> None:
    # Helm cannot read files outside the chart, so the chart holds a copy: keep it identical.
    shipped = (ROOT / "deploy" / "grafana" / "kube-vgpu-dashboard.json").read_bytes()
    assert (CHART / "files" / "kube-vgpu-dashboard.json").read_bytes() == shipped
