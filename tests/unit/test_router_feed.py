"""What the llm-d router reads from us: endpoint labels its filters use, GPU lists without repeats, and a feed
that has a value for every slice-holding pod (an endpoint without one scores as saturated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from device_plugin.pods import PodRecord
from device_plugin.telemetry.discovery_file import endpoints
from device_plugin.telemetry.epp import epp_registry
from device_plugin.watchdog.slices import Slice, SliceId

from .test_telemetry_exporter import MIB, extractor_gpu_utilization, families
from .test_watchdog_cycle import make


def _s(container: str, gpu: int, cores: int, role: str = "prefill-decode", model: str = "") -> Slice:
    return Slice(SliceId("serving", "tp", container, f"GPU-{gpu}"), "uid-tp", gpu, 1024 * MIB, cores, role, model)


def test_gpu_lists_name_each_gpu_once_and_sum_the_sm_share_per_gpu() -> None:
    pod = PodRecord("serving", "tp", "uid-tp", "n", pod_ip="10.0.0.9", labels=(("app", "vllm"),))
    held = [_s("vllm", 1, 30, model="llama"), _s("sidecar", 1, 10), _s("vllm", 0, 40, model="llama")]
    (item,) = endpoints([pod], held, port="8000")
    labels = item["labels"]
    assert isinstance(labels, dict)
    assert labels["vgpu.io/gpu"] == "GPU-0,GPU-1"  # index order, each once
    assert labels["vgpu.io/gpu-cores"] == "40,40"  # GPU-1: 30 + 10
    assert labels["vgpu.io/gpu-memory-bytes"] == str(3 * 1024 * MIB)
    assert labels["llm-d.ai/role"] == "prefill-decode" and labels["llm-d.ai/model"] == "llama"
    assert labels["app"] == "vllm"


def test_port_may_differ_per_endpoint() -> None:
    pods = [PodRecord("serving", n, f"uid-{n}", "n", pod_ip="10.0.0.9") for n in ("a", "b")]
    held = [Slice(SliceId("serving", n, "c", "GPU-0"), f"uid-{n}", 0, MIB, 10, "decode", "") for n in ("a", "b")]
    items = endpoints(pods, held, port=lambda p: "8000" if p.name == "a" else "8001")
    assert [(i["name"], i["port"]) for i in items] == [("a", "8000"), ("b", "8001")]


IDLE: dict[str, Any] = {
    "pods": [
        {
            "name": "busy",
            "namespace": "serving",
            "role": "decode",
            "containers": [
                {
                    "name": "vllm",
                    "slices": [{"gpu": 0, "memoryMiB": 8000, "cores": 50}],
                    "processes": [{"pid": 7101, "gpu": 0, "timeline": [{"t": 0, "memoryMiB": 100, "sm": 25}]}],
                }
            ],
        },
        {  # holds a slice, runs nothing on the GPU yet (model loading, or idle)
            "name": "idle",
            "namespace": "serving",
            "role": "decode",
            "containers": [{"name": "vllm", "slices": [{"gpu": 1, "memoryMiB": 8000, "cores": 50}]}],
        },
    ]
}


def test_an_idle_slice_holder_is_reported_as_zero_not_left_out(tmp_path: Path) -> None:
    _sim, wd, _ = make(tmp_path, scenario=IDLE)
    wd.cycle()
    text = generate_latest(epp_registry(wd.snapshot)).decode()
    assert extractor_gpu_utilization(text, "busy") == pytest.approx(0.5)
    assert extractor_gpu_utilization(text, "idle") == 0.0  # a value, not the router's missing-value path


def test_a_gpu_that_cannot_be_read_keeps_the_last_value_served(tmp_path: Path) -> None:
    sim, wd, _ = make(tmp_path, scenario=IDLE)
    registry = epp_registry(wd.snapshot)
    wd.cycle()
    assert extractor_gpu_utilization(generate_latest(registry).decode(), "busy") == pytest.approx(0.5)
    sim.nvml.inject_error("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", gpu=0)
    wd.cycle()
    assert all(s.slice.id.pod != "busy" for s in wd.snapshot().slices)  # no verdict this cycle
    text = generate_latest(registry).decode()
    assert extractor_gpu_utilization(text, "busy") == pytest.approx(0.5)
    # a fresh collector never served it: 0, still present
    fresh = generate_latest(epp_registry(wd.snapshot)).decode()
    assert {s.labels["pod"] for s in families(fresh)["DCGM_FI_DEV_GPU_UTIL"].samples} == {"busy", "idle"}
    assert extractor_gpu_utilization(fresh, "busy") == 0.0


def test_the_feed_is_rendered_once_per_snapshot_not_per_scrape(tmp_path: Path) -> None:
    from device_plugin.telemetry.serve import CachedExposition

    _sim, wd, _ = make(tmp_path, scenario=IDLE)
    wd.cycle()
    app = CachedExposition(epp_registry(wd.snapshot), wd.snapshot)
    first = app.body()
    assert [app.body() for _ in range(50)] == [first] * 50 and app.renders == 1
    assert first == generate_latest(epp_registry(wd.snapshot))
    wd.cycle()  # a new snapshot: rendered again
    app.body()
    assert app.renders == 2
