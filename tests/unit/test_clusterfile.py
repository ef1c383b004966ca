"""Cluster files: good documents parse to inventories and allocations; bad ones name the path."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from vgpu import annotations as ann
from vgpu.clusterfile import ClusterFileError, dump_cluster, parse_cluster
from vgpu.roles import Role
from vgpu.state import ClusterState

GOOD = """
version: v1
nodes:
  - name: gpu-a
    cpuMilli: 64000
    memoryMiB: 524288
    labels: {topology.kubernetes.io/zone: z1}
    gpus:
      - {uuid: GPU-a-0, index: 0, model: H100-80GB, memoryMiB: 81920, numa: 0, nvlink: [GPU-a-1]}
      - {uuid: GPU-a-1, index: 1, model: H100-80GB, memoryMiB: 81920, numa: 1, nvlink: [GPU-a-0], healthy: false}
  - name: gpu-b
    gpuTemplate: {count: 4, model: A100-40GB, memoryMiB: 40960, split: 4, nvlink: all, numaNodes: 2}
allocations:
  - pod: llm/llama-decode-0
    assignment:
      node: gpu-a
      role: decode
      model: llm/llama
      containers:
        - name: vllm
          devices: [{uuid: GPU-a-0, index: 0, memoryMiB: 20480, cores: 25}]
  - pod: llm/llama-prefill-0
    assignment:
      node: gpu-b
      role: prefill
      containers:
        - name: vllm
          devices:
            - {uuid: GPU-gpu-b-0, index: 0, memoryMiB: 20480, cores: 50}
            - {uuid: GPU-gpu-b-1, index: 1, memoryMiB: 20480, cores: 50}
"""


def _good() -> dict[str, Any]:
    doc = yaml.safe_load(GOOD)
    assert isinstance(doc, dict)
    return doc


def test_explicit_gpu_lists() -> None:
    nodes, _ = parse_cluster(_good())
    a = nodes[0]
    assert (a.name, a.cpu_milli, a.memory_mib, a.labels) == (
        "gpu-a",
        64000,
        524288,
        {"topology.kubernetes.io/zone": "z1"},
    )
    g0, g1 = a.gpus
    assert (g0.uuid, g0.model, g0.memory_mib, g0.cores, g0.split_count, g0.numa) == (
        "GPU-a-0",
        "H100-80GB",
        81920,
        100,
        10,
        0,
    )
    assert (g0.healthy, g1.healthy, g0.nvlink_peers) == (True, False, ("GPU-a-1",))


def test_gpu_template_with_nvlink_all() -> None:
    nodes, _ = parse_cluster(_good())
    b = nodes[1]
    uuids = [g.uuid for g in b.gpus]
    assert uuids == [f"GPU-gpu-b-{i}" for i in range(4)]
    assert [g.index for g in b.gpus] == [0, 1, 2, 3]
    assert [g.numa for g in b.gpus] == [0, 0, 1, 1]
    assert all(g.split_count == 4 and g.memory_mib == 40960 for g in b.gpus)
    for g in b.gpus:
        assert set(g.nvlink_peers) == set(uuids) - {g.uuid}


def test_template_without_nvlink_has_no_peers() -> None:
    doc = {"nodes": [{"name": "n", "gpuTemplate": {"count": 2, "model": "L4", "memoryMiB": 23034}}]}
    nodes, allocations = parse_cluster(doc)
    assert [g.nvlink_peers for g in nodes[0].gpus] == [(), ()] and allocations == []


def test_allocations_apply_to_a_state() -> None:
    nodes, allocations = parse_cluster(_good())
    assert [(k, a.role, a.model) for k, a in allocations] == [
        ("llm/llama-decode-0", Role.DECODE, "llm/llama"),
        ("llm/llama-prefill-0", Role.PREFILL, None),
    ]
    state = ClusterState()
    for n in nodes:
        state.upsert_node(n)
    for key, a in allocations:
        state.apply(key, a)
    assert state.totals()["memory_used_mib"] == 3 * 20480
    assert state.nodes["gpu-b"].gpus[1].prefill == 1


def test_dump_then_parse_round_trips() -> None:
    nodes, allocations = parse_cluster(_good())
    dumped = dump_cluster(nodes, allocations)
    again = parse_cluster(yaml.safe_load(yaml.safe_dump(dumped)))
    assert again == (nodes, allocations)
    assert [n.labels for n in again[0]] == [n.labels for n in nodes]


def _bad(path: list[str | int], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_good())
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_bad(["version"], "v2"), "version: Input should be 'v1'"),
        (_bad(["nodes"], _DELETE), "nodes: Field required"),
        (_bad(["nodes"], {}), "nodes: Input should be a valid list"),
        (_bad(["nodes", 0, "name"], ""), "nodes.0.name: String should have at least 1 character"),
        (_bad(["nodes", 0, "cpuMilli"], -1), "nodes.0.cpuMilli: Input should be greater than or equal to 0"),
        (_bad(["nodes", 0, "gpus", 1, "memoryMiB"], -5), "nodes.0.gpus.1.memoryMiB: Input should be greater than 0"),
        (
            _bad(["nodes", 0, "gpus", 0, "cores"], 101),
            "nodes.0.gpus.0.cores: Input should be less than or equal to 100",
        ),
        (_bad(["nodes", 0, "gpus", 0, "index"], -1), "nodes.0.gpus.0.index"),
        (
            _bad(["nodes", 0, "gpus", 0, "memoryMiB"], True),
            "nodes.0.gpus.0.memoryMiB: Value error, expected an integer",
        ),
        (
            _bad(["nodes", 1, "gpuTemplate", "count"], True),
            "nodes.1.gpuTemplate.count: Value error, expected an integer",
        ),
        (_bad(["nodes", 0, "gpus", 0, "numa"], False), "nodes.0.gpus.0.numa"),
        (_bad(["nodes", 0, "gpus", 0, "uuid"], _DELETE), "nodes.0.gpus.0.uuid: Field required"),
        (_bad(["nodes", 0, "gpus", 0, "color"], "green"), "nodes.0.gpus.0.color: Extra inputs are not permitted"),
        (
            _bad(["nodes", 0, "gpuTemplate"], {"count": 1, "model": "x", "memoryMiB": 1}),
            "give either 'gpus' or 'gpuTemplate'",
        ),
        (
            _bad(["nodes", 1, "gpuTemplate", "nvlink"], "some"),
            "nodes.1.gpuTemplate.nvlink: Input should be 'all', 'pairs' or 'none'",
        ),
        (_bad(["nodes", 1, "gpuTemplate", "count"], 0), "nodes.1.gpuTemplate.count"),
        (_bad(["nodes", 1, "name"], "gpu-a"), "duplicate node names ['gpu-a']"),
        (_bad(["nodes", 0, "gpus", 1, "uuid"], "GPU-a-0"), "node gpu-a: duplicate GPU uuid GPU-a-0"),
        (_bad(["allocations", 0, "pod"], "no-namespace"), "allocations.0.pod: String should match pattern"),
        # The assignment is decoded by the vgpu.io/assignment codec: its messages, under the allocation's path.
        (
            _bad(["allocations", 0, "assignment", "role"], "router"),
            "allocations.0.assignment: unknown role 'router'; allowed: prefill, decode",
        ),
        (
            _bad(["allocations", 1, "assignment", "containers", 0, "devices", 0, "cores"], 150),
            "allocations.1.assignment: containers[0].devices[0]: field 'cores' must be 0..100, got 150",
        ),
        (_bad(["allocations", 0, "assignment", "node"], _DELETE), "allocations.0.assignment: missing field 'node'"),
        (
            _bad(["allocations", 0, "assignment"], "gpu-a"),
            "allocations.0.assignment: Input should be a valid dictionary",
        ),
        (
            _bad(["allocations", 0, "assignment", "colour"], "red"),
            "allocations.0.assignment: unknown field(s) ['colour']; allowed: containers, model, node, role",
        ),
        (
            _bad(["allocations", 0, "assignment", "containers", 0, "device"], []),
            "allocations.0.assignment: containers[0]: unknown field(s) ['device']; allowed: devices, name",
        ),
        (
            _bad(["allocations", 0, "assignment", "containers", 0, "devices", 0, "mem"], 1),
            "allocations.0.assignment: containers[0].devices[0]: unknown field(s) ['mem']",
        ),
        (
            _bad(["allocations", 0, "assignment", "version"], "v1"),
            "allocations.0.assignment: unknown field(s) ['version']",
        ),
        (
            _bad(["allocations", 1, "assignment", "containers", 0, "devices", 1, "uuid"], "GPU-gpu-b-0"),
            "allocations.1.assignment: containers[0]: a container's vGPUs must be on distinct GPUs",
        ),
    ],
)
def test_bad_files_name_the_path(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster(doc)
    assert str(info.value).startswith("invalid cluster file: ")
    assert message in str(info.value)


def test_the_cluster_file_and_the_annotation_share_one_assignment_codec() -> None:
    """What the file's `assignment` holds is the annotation's value without its version, both ways."""
    _, allocations = parse_cluster(_good())
    for (_, a), raw in zip(allocations, _good()["allocations"], strict=True):
        assert ann.decode_assignment(json.dumps({"version": ann.VERSION, **raw["assignment"]})) == a
        assert json.loads(ann.encode_assignment(a)) == {"version": ann.VERSION, **ann.assignment_to_obj(a)}
    dumped = dump_cluster(*parse_cluster(_good()))
    assert [x["assignment"] for x in dumped["allocations"]] == [ann.assignment_to_obj(a) for _, a in allocations]
