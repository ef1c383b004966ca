"""vgpu_cli.files: workloads as multi-document YAML or Lists; non-Pod objects skipped; bundled data loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import make_pod
from vgpu_cli import files
from vgpu_cli.common import CliError


@pytest.mark.parametrize(
    ("docs", "names"),
    [
        ([make_pod("a"), make_pod("b")], ["a", "b"]),
        ([{"apiVersion": "v1", "kind": "List", "items": [make_pod("a"), make_pod("b")]}], ["a", "b"]),
        ([{"apiVersion": "v1", "kind": "PodList", "items": [make_pod("x")]}, make_pod("y")], ["x", "y"]),
        ([{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}, make_pod("a")], ["a"]),
        ([None, make_pod("a")], ["a"]),
    ],
)
def test_load_workload_keeps_pods_in_order(tmp_path: Path, docs: list[object], names: list[str]) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert [p["metadata"]["name"] for p in files.load_workload(str(path))] == names


def test_bundled_data_loads() -> None:
    nodes, _ = files.load_cluster(None)
    pods = files.load_workload(None)
    assert nodes and pods
    assert all(p["kind"] == "Pod" for p in pods)
    assert len({n.name for n in nodes}) == len(nodes)


def test_json_cluster_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        '{"version": "v1", "nodes": [{"name": "n", "gpuTemplate": {"count": 1, "model": "L4", "memoryMiB": 23034}}]}'
    )
    nodes, allocations = files.load_cluster(str(path))
    assert [n.name for n in nodes] == ["n"] and allocations == []


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="cannot read") as exc:
        files.load_workload(str(tmp_path))  # a directory
    assert str(tmp_path) in str(exc.value) and exc.value.code == 2
