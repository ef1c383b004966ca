"""Cordoned GPUs: parsed and validated (vgpu.cordon), no new slice in the fit, the running ones kept, reported in the
extender's log and metrics."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.sync import StateSync
from tests.conftest import make_info
from vgpu import annotations as ann
from vgpu import cordon
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.clusterfile import dump_cluster, parse_cluster
from vgpu.devices import Cordon, GpuDevice
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.pod import PodInfo
from vgpu.state import ClusterState, GpuUsage

G0, G1 = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-1111-1111-1111-111111111111"
GPUS = (GpuDevice(G0, 0, "NVIDIA H100 80GB HBM3", 81920), GpuDevice(G1, 1, "NVIDIA H100 80GB HBM3", 81920))


def _node(name: str = "n", **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {ann.NODE_INVENTORY: ann.encode_inventory(GPUS), **annotations}}}


def _first(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return float(u.device.index)


# ---- parsing


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, Cordon()),
        ({ann.NODE_CORDONED_GPUS: ""}, Cordon()),
        ({ann.NODE_CORDONED_GPUS: f" {G1} ,"}, Cordon(uuids=frozenset({G1}))),
        ({cordon.HAMI_DEVICE_CORDON: G0}, Cordon(uuids=frozenset({G0}))),  # HAMi's key carries over
        ({ann.NODE_CORDONED_GPUS: G0, cordon.HAMI_DEVICE_CORDON: G1}, Cordon(uuids=frozenset({G0, G1}))),
        (
            {ann.NODE_CORDONED_GPUS: f"GPU 1,{G0},0,GPU-x::1"},
            Cordon(uuids=frozenset({G0}), malformed=("GPU 1", "0", "GPU-x::1")),
        ),
        (
            {ann.NODE_CORDONED_GPUS: f"{G0},GPU-elsewhere,GPU-elsewhere"},
            Cordon(uuids=frozenset({G0, "GPU-elsewhere"}), unknown=("GPU-elsewhere",)),
        ),
    ],
)
def test_parse_cordon(annotations: dict[str, str], expected: Cordon) -> None:
    assert cordon.parse_cordon(annotations, (g.uuid for g in GPUS)) == expected


def test_problems_name_the_keys_the_entries_and_what_is_allowed() -> None:
    got = cordon.problems("n", Cordon(malformed=("GPU 1",), unknown=("GPU-elsewhere",)))
    assert got == [
        "node n: vgpu.io/cordoned-gpus / hami.io/device-cordon: not GPU UUIDs, ignored: 'GPU 1'; "
        "allowed: GPU-... or MIG-... UUIDs",
        "node n: vgpu.io/cordoned-gpus / hami.io/device-cordon: cordoned but not in the node's inventory: GPU-elsewhere",
    ]
    assert cordon.problems("n", Cordon(uuids=frozenset({G0}))) == []


# ---- the extender: state, fit, running slices, reports


def test_a_cordoned_gpu_gets_no_new_slice_while_the_slice_on_it_stays() -> None:
    state = ClusterState()
    sync = StateSync(state)
    sync.node_event("ADDED", _node())
    running = Assignment("n", (ContainerAssignment("main", (DeviceSlice(G0, 0, 1000, 10),)),))
    state.apply("ns/running", running)
    sync.node_event("MODIFIED", _node(**{ann.NODE_CORDONED_GPUS: G0}))
    node = state.nodes["n"]
    assert node.inventory.cordoned == {G0}
    assert state.assignments["ns/running"] == running and node.by_uuid[G0].sharers == 1  # still held
    fit = fit_node(node, make_info(gpumem=1000), state.config, _first)
    assert isinstance(fit, NodePlacement) and fit.containers[0].devices[0].uuid == G1
    fit = fit_node(node, make_info(gpu=2, gpumem=1000), state.config, _first)
    assert isinstance(fit, FitFailure) and fit.unresolvable and "GPU cordoned on 1" in fit.reason
    sync.node_event("MODIFIED", _node())  # uncordoned: the GPU takes slices again
    fit = fit_node(state.nodes["n"], make_info(gpu=2, gpumem=1000), state.config, _first)
    assert isinstance(fit, NodePlacement)
    assert state.assignments["ns/running"] == running


def test_bad_entries_are_logged_and_counted_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    state = ClusterState()
    seen: list[tuple[str, str]] = []
    sync = StateSync(state, on_problem=lambda kind, msg: seen.append((kind, msg)))
    bad = _node(**{ann.NODE_CORDONED_GPUS: f"{G1},gpu1,GPU-gone"})
    with caplog.at_level(logging.ERROR, logger="scheduler_extender.sync"):
        sync.node_event("ADDED", bad)
        sync.node_event("MODIFIED", bad)  # the periodic inventory write: not reported again
    assert [k for k, _ in seen] == ["cordon", "cordon"]
    assert "'gpu1'" in seen[0][1] and "GPU-gone" in seen[1][1]
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2
    assert state.nodes["n"].inventory.cordoned == {G1, "GPU-gone"}  # the good entries hold
    sync.node_event("MODIFIED", _node(**{ann.NODE_CORDONED_GPUS: G1}))
    sync.node_event("MODIFIED", bad)  # fixed, then broken again: reported again
    assert len(seen) == 4


def test_metrics_show_cordoned_gpus_and_bad_entries() -> None:
    state = ClusterState()
    StateSync(state).node_event("ADDED", _node(**{ann.NODE_CORDONED_GPUS: f"{G1},gpu1,GPU-gone"}))
    text = generate_latest(ExtenderMetrics(state).registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "cordon" in s.name
    }
    labels = {"Hostname": "n", "modelName": "NVIDIA H100 80GB HBM3"}
    assert samples[("vgpu_gpu_cordoned", tuple(sorted({**labels, "gpu": "1", "UUID": G1}.items())))] == 1
    assert samples[("vgpu_gpu_cordoned", tuple(sorted({**labels, "gpu": "0", "UUID": G0}.items())))] == 0
    assert samples[("vgpu_node_cordoned_gpus", (("Hostname", "n"),))] == 1
    assert samples[("vgpu_node_cordon_invalid_entries", (("Hostname", "n"), ("problem", "malformed")))] == 1
    assert samples[("vgpu_node_cordon_invalid_entries", (("Hostname", "n"), ("problem", "unknown")))] == 1


def test_the_state_snapshot_keeps_the_nodes_own_cordoned_gpus_and_reads_back() -> None:
    state = ClusterState()
    StateSync(state).node_event("ADDED", _node(**{ann.NODE_CORDONED_GPUS: f"{G1},GPU-gone"}))
    doc = dump_cluster(list(state.nodes[n].inventory for n in state.nodes), [])
    assert doc["nodes"][0]["cordonedGpus"] == [G1]  # GPU-gone marks no GPU: left out, the file would refuse it
    nodes, _ = parse_cluster(doc)
    assert nodes[0].cordoned == {G1}
