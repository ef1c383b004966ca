"""Reading the CLI's inputs: cluster files and workloads from disk or from the bundled demo data.

The core parses mappings; this module owns the I/O and turns every problem into a CliError that names
the file and, for a malformed cluster file, the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from vgpu.annotations import Assignment
from vgpu.clusterfile import ClusterFileError, parse_cluster
from vgpu.devices import NodeInventory
from vgpu_cli.common import EXIT_USAGE, CliError

DEMO_CLUSTER = "demo-cluster.yaml"
DEMO_WORKLOAD = "demo-workload.yaml"


def _read(path: str | None, bundled: str) -> tuple[str, str]:
    """(text, name shown in messages) of a file, or of the bundled data file when no path is given."""
    if path is None:
        return resources.files("vgpu_cli").joinpath("data", bundled).read_text(encoding="utf-8"), f"<bundled {bundled}>"
    try:
        return Path(path).read_text(encoding="utf-8"), path
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}", EXIT_USAGE) from None


def load_cluster(path: str | None) -> tuple[list[NodeInventory], list[tuple[str, Assignment]]]:
    """Nodes and existing allocations of a cluster file (YAML or JSON)."""
    text, name = _read(path, DEMO_CLUSTER)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: not valid YAML: {exc}") from None
    if not isinstance(doc, Mapping):
        raise CliError(f"{name}: invalid cluster file: <root>: expected a mapping with 'nodes'")
    try:
        return parse_cluster(doc)
    except ClusterFileError as exc:
        raise CliError(f"{name}: {exc}") from None


def load_workload(path: str | None) -> list[dict[str, Any]]:
    """Pod objects, in order, from a multi-document YAML/JSON file or a `kind: List` / `PodList`.

    Documents that are not Pods (e.g. a Service shipped alongside) are skipped, as kubectl would
    create them but the scheduler never sees them.
    """
    text, name = _read(path, DEMO_WORKLOAD)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: not valid YAML: {exc}") from None
    pods: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise CliError(f"{name}: document {i}: expected a Kubernetes object (a mapping)")
        items = doc.get("items") if doc.get("kind") in ("List", "PodList") else [doc]
        if not isinstance(items, list):
            raise CliError(f"{name}: document {i}: 'items' must be a list")
        for j, item in enumerate(items):
            if not isinstance(item, dict):
                raise CliError(f"{name}: document {i} item {j}: expected a Pod (a mapping)")
            if item.get("kind", "Pod") != "Pod":
                continue
            if not isinstance(item.get("metadata"), dict) or not item["metadata"].get("name"):
                raise CliError(f"{name}: document {i} item {j}: metadata.name is required")
            pods.append(item)
    return pods
