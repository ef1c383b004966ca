"""Topology through the extender as a real HTTP server: /filter reasons for vgpu.io/require-nvlink, /prioritize
preferring a node that gives an NVLink set, /bind writing a connected set."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.extender_server import HTTP_TIMEOUT_S, running_extender
from vgpu.clusterfile import parse_cluster

NODES = ["pcie", "bridged", "nvswitch"]
CLUSTER: dict[str, Any] = {
    "version": "v1",
    "nodes": [
        {"name": "pcie", "gpuTemplate": {"count": 4, "model": "L40S", "memoryMiB": 46068, "numaNodes": 2}},
        {
            "name": "bridged",
            "gpuTemplate": {"count": 4, "model": "H100-PCIe", "memoryMiB": 81920, "numaNodes": 2, "nvlink": "pairs"},
        },
        {
            "name": "nvswitch",
            "gpuTemplate": {"count": 4, "model": "H100-SXM", "memoryMiB": 81920, "numaNodes": 2, "nvlink": "all"},
        },
    ],
    "allocations": [
        {  # GPU 0 of the bridged node is full: its pair 0-1 is broken, 2-3 is whole
            "pod": "llm/busy",
            "assignment": {
                "node": "bridged",
                "containers": [
                    {"name": "c", "devices": [{"uuid": "GPU-bridged-0", "index": 0, "memoryMiB": 81920, "cores": 100}]}
                ],
            },
        }
    ],
}


def pod(name: str, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "uid": str(uuid.uuid4()), "annotations": annotations or {}},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    return path


@pytest.fixture
def extender(cluster_file: Path) -> Any:
    with running_extender("--source", "file", "--cluster-file", str(cluster_file), "--persist") as url:
        yield url


def test_require_nvlink_filter_names_why_each_node_fails(extender: str) -> None:
    p = pod("tp4", 4, {"vgpu.io/require-nvlink": "true"})
    body = httpx.post(f"{extender}/filter", json={"Pod": p, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S).json()
    assert body["NodeNames"] == ["nvswitch"]
    assert body["FailedAndUnresolvableNodes"]["pcie"] == (
        "container 'vllm' needs 4 GPUs that are all NVLink peers (vgpu.io/require-nvlink); at most 1 of this node's "
        "GPUs that could ever host it are NVLink peers of each other (no NVLink between its GPUs)"
    )
    assert "3 of 4 GPUs can host one" in body["FailedNodes"]["bridged"]  # GPU 0 is full: that reason comes first


def test_require_nvlink_waits_where_the_connected_set_is_only_busy(tmp_path: Path) -> None:
    doc = copy.deepcopy(CLUSTER)
    held = {"name": "c", "devices": [{"uuid": "GPU-bridged-2", "index": 2, "memoryMiB": 40000, "cores": 50}]}
    doc["allocations"].append({"pod": "llm/half", "assignment": {"node": "bridged", "containers": [held]}})
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    p = pod("tp2", 2, {"vgpu.io/require-nvlink": "true"})
    with running_extender("--source", "file", "--cluster-file", str(path)) as url:
        body = httpx.post(f"{url}/filter", json={"Pod": p, "NodeNames": ["bridged"]}, timeout=HTTP_TIMEOUT_S).json()
    assert body["NodeNames"] == []
    assert body["FailedNodes"]["bridged"] == (  # resolvable: when GPU 0 or 2 frees, a pair is whole again
        "container 'vllm' needs 2 GPUs that are all NVLink peers (vgpu.io/require-nvlink); "
        "of the 2 GPUs that can host its slice now, at most 1 are NVLink peers of each other"
    )


def test_an_invalid_value_fails_every_node_with_the_annotation_named(extender: str) -> None:
    p = pod("bad", 2, {"vgpu.io/require-nvlink": "yes"})
    body = httpx.post(f"{extender}/filter", json={"Pod": p, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S).json()
    assert body["NodeNames"] == []
    reasons = {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}
    assert set(reasons) == set(NODES)
    assert all("vgpu.io/require-nvlink='yes' is invalid" in r for r in reasons.values())


def test_prioritize_ranks_nodes_by_the_set_they_can_give(extender: str) -> None:
    r = httpx.post(f"{extender}/prioritize", json={"Pod": pod("tp2", 2), "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S)
    scores = {h["Host"]: h["Score"] for h in r.json()}
    # bridged: its idle pair 2-3 fills a whole NVLink domain; nvswitch: linked, but 2 of 4 idle; pcie: no link.
    assert scores["bridged"] > scores["nvswitch"] > scores["pcie"]


def test_bind_writes_a_connected_set(cluster_file: Path) -> None:
    p = pod("tp2", 2)
    with running_extender("--source", "file", "--cluster-file", str(cluster_file), "--persist") as url:
        httpx.post(f"{url}/filter", json={"Pod": p, "NodeNames": ["bridged"]}, timeout=HTTP_TIMEOUT_S)
        m = p["metadata"]
        r = httpx.post(
            f"{url}/bind",
            json={"PodName": m["name"], "PodNamespace": "llm", "PodUID": m["uid"], "Node": "bridged"},
            timeout=HTTP_TIMEOUT_S,
        )
        assert r.json() == {"Error": ""}
    _, allocations = parse_cluster(yaml.safe_load(cluster_file.read_text()))
    held = dict(allocations)
    assert sorted(d.uuid for d in held["llm/tp2"].slices()) == ["GPU-bridged-2", "GPU-bridged-3"]
