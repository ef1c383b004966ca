"""Node exporter and EPP feed: exposition parsed by prometheus_client's parser; EPP checked against the
semantics of llm-d's dcgm-extractor (re-implemented below); the file-discovery writer."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.pods import PodRecord
from device_plugin.telemetry.discovery_file import MAX_BYTES, DiscoveryFileWriter, endpoints, render, write_atomic
from device_plugin.telemetry.epp import epp_registry
from device_plugin.telemetry.exporter import SLICE_LABELS, node_registry
from device_plugin.testing.node_sim import RecordingKube, SimNode
from device_plugin.watchdog.slices import Slice, SliceId
from device_plugin.watchdog.watchdog import Watchdog

from .test_watchdog_cycle import make, run_for

MIB = 2**20


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def extractor_gpu_utilization(exposition: str, pod_name: str) -> float | None:
    """llm-d dcgm-extractor: DCGM_FI_DEV_GPU_UTIL gauge samples whose `pod` label equals the endpoint's pod
    name (samples without a pod label are kept too), max, / 100. None where it would report an error."""
    fam = families(exposition).get("DCGM_FI_DEV_GPU_UTIL")
    if fam is None:
        return None
    assert fam.type == "gauge"
    values = [s.value for s in fam.samples if s.labels.get("pod", pod_name) == pod_name]
    return max(values) / 100.0 if values else None


@pytest.fixture
def ran(tmp_path: Path) -> tuple[SimNode, Watchdog, RecordingKube]:
    sim, wd, kube = make(tmp_path)
    run_for(sim, wd, 12)
    return sim, wd, kube


def test_node_exporter_per_gpu_and_per_slice(ran: Any) -> None:
    sim, wd, _ = ran
    text = generate_latest(node_registry(wd.snapshot)).decode()
    fams = families(text)
    gpu0 = sim.gpus[0]
    total = {s.labels["UUID"]: s.value for s in fams["vgpu_node_gpu_memory_total_bytes"].samples}
    assert total[gpu0.uuid] == gpu0.memory_mib * MIB and len(total) == 8
    used = {s.labels["UUID"]: s.value for s in fams["vgpu_node_gpu_memory_used_bytes"].samples}
    assert used[gpu0.uuid] == (12000 + 15000 + 512) * MIB  # mem-hog + good + the host daemon
    roles = {(s.labels["gpu"], s.labels["role"]): s.value for s in fams["vgpu_node_gpu_role_slices"].samples}
    assert roles[("0", "prefill")] == 1 and roles[("0", "decode")] == 1
    lim = fams["vgpu_slice_memory_limit_bytes"].samples
    assert set(lim[0].labels) == set(SLICE_LABELS)
    hog = {
        s.name: s.value
        for f in fams.values()
        for s in f.samples
        if s.labels.get("pod") == "mem-hog" and "kind" not in s.labels and "step" not in s.labels
    }
    assert hog["vgpu_slice_memory_used_bytes"] == 12000 * MIB and hog["vgpu_slice_memory_limit_bytes"] == 10240 * MIB
    assert hog["vgpu_slice_cores_quota_ratio"] == pytest.approx(0.30)
    sat = {s.labels["pod"]: s.value for s in fams["vgpu_slice_saturation_ratio"].samples}
    assert sat["sm-hog"] == 1.0 and sat["good"] == pytest.approx(0.9)
    viol = {
        (s.labels["pod"], s.labels["kind"]): s.value
        for s in fams["vgpu_slice_violations"].samples
        if s.name.endswith("_total")
    }
    assert viol == {("mem-hog", "memory"): 1.0, ("sm-hog", "sm"): 1.0}
    acts = {
        (s.labels["pod"], s.labels["step"], s.labels["outcome"])
        for s in fams["vgpu_slice_enforcement_actions"].samples
        if s.name.endswith("_total")
    }
    assert ("mem-hog", "evict", "done") in acts and ("sm-hog", "event", "done") in acts
    active = {(s.labels["pod"], s.labels["kind"]): s.value for s in fams["vgpu_slice_violation_active"].samples}
    assert active[("mem-hog", "memory")] == 1.0 and active[("good", "memory")] == 0.0
    assert fams["vgpu_watchdog_cycles"].samples[0].value == 12
    hard = fams["vgpu_node_hard_memory_limits_supported"].samples[0]
    assert hard.value == 0.0 and "615" in hard.labels["reason"]


def test_epp_feed_matches_the_extractor(ran: Any) -> None:
    _, wd, _ = ran
    text = generate_latest(epp_registry(wd.snapshot)).decode()
    fam = families(text)["DCGM_FI_DEV_GPU_UTIL"]
    assert {tuple(sorted(s.labels)) for s in fam.samples} == {("UUID", "gpu", "namespace", "pod")}
    snap = {s.slice.id.pod: s.saturation for s in wd.snapshot().slices}
    for pod_name, sat in snap.items():
        assert extractor_gpu_utilization(text, pod_name) == pytest.approx(sat / 100.0)
    assert extractor_gpu_utilization(text, "not-on-this-node") is None
    assert extractor_gpu_utilization(text, "sm-hog") == 1.0


def test_epp_feed_takes_max_over_a_pods_gpus(tmp_path: Path) -> None:
    two_gpu = {
        "pods": [
            {
                "name": "tp2",
                "namespace": "serving",
                "containers": [
                    {
                        "name": "vllm",
                        "slices": [
                            {"gpu": 0, "memoryMiB": 8000, "cores": 40},
                            {"gpu": 1, "memoryMiB": 8000, "cores": 40},
                        ],
                        "processes": [
                            {"pid": 7001, "gpu": 0, "timeline": [{"t": 0, "memoryMiB": 100, "sm": 10}]},
                            {"pid": 7002, "gpu": 1, "timeline": [{"t": 0, "memoryMiB": 100, "sm": 30}]},
                        ],
                    }
                ],
            }
        ]
    }
    _sim, wd, _ = make(tmp_path, scenario=two_gpu)
    wd.cycle()
    text = generate_latest(epp_registry(wd.snapshot)).decode()
    assert len(families(text)["DCGM_FI_DEV_GPU_UTIL"].samples) == 2
    assert extractor_gpu_utilization(text, "tp2") == pytest.approx(0.75)  # max(10/40, 30/40)


def _slice(pod: str, gpu: int, cores: int = 30) -> Slice:
    return Slice(
        SliceId("serving", pod, "vllm", f"GPU-{gpu}"), f"uid-{pod}", gpu, 10240 * MIB, cores, "decode", "llama"
    )


def test_discovery_endpoints_and_atomic_refresh(tmp_path: Path) -> None:
    pods = [
        PodRecord("serving", "a", "uid-a", "n", pod_ip="10.0.0.5", labels=(("llm-d.ai/role", "decode"),)),
        PodRecord("serving", "b", "uid-b", "n", pod_ip=""),  # no IP yet: not an endpoint
        PodRecord("serving", "c", "uid-c", "n", pod_ip="10.0.0.7"),  # no slice: not ours
    ]
    items = endpoints(pods, [_slice("a", 0), _slice("a", 1, 20), _slice("b", 2)], port="8000")
    assert [i["name"] for i in items] == ["a"]
    a = items[0]
    assert a["address"] == "10.0.0.5" and a["port"] == "8000" and a["namespace"] == "serving"
    labels = a["labels"]
    assert isinstance(labels, dict)
    assert labels["llm-d.ai/role"] == "decode" and labels["vgpu.io/gpu"] == "GPU-0,GPU-1"
    assert labels["vgpu.io/gpu-memory-bytes"] == str(2 * 10240 * MIB) and labels["vgpu.io/gpu-cores"] == "30,20"
    target = tmp_path / "eps" / "endpoints.yaml"
    writer = DiscoveryFileWriter(target, port="8000")
    writer(pods, [_slice("a", 0)])
    writer(pods, [_slice("a", 0)])
    assert writer.writes == 1  # unchanged content is not rewritten
    doc = json.loads(target.read_text())
    assert doc["endpoints"][0]["port"] == "8000"
    assert os.listdir(target.parent) == ["endpoints.yaml"]  # no temp files left behind


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "endpoints.json"
    bodies = [
        render(
            [{"name": f"p{i}", "namespace": "n", "address": "10.0.0.1", "port": "80", "labels": {"x": "y" * (i * 50)}}]
        )
        for i in range(40)
    ]
    bad: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                json.loads(target.read_bytes())
            except FileNotFoundError:
                continue
            except ValueError as exc:
                bad.append(str(exc))

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(5):
        for body in bodies:
            write_atomic(target, body)
    stop.set()
    t.join()
    assert bad == []


def test_oversized_file_is_refused() -> None:
    big: list[dict[str, object]] = [
        {"name": "p", "namespace": "n", "address": "10.0.0.1", "port": "80", "labels": {"x": "y" * MAX_BYTES}}
    ]
    with pytest.raises(ValueError, match="1 MiB"):
        render(big)
