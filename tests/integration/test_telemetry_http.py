"""The node daemon's telemetry over real HTTP: the Plugin wired with the watchdog on a fake-NVML node serves
the exporter and the EPP feed on their own ports; the EPP feed read like llm-d's dcgm-extractor."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.app import Plugin
from device_plugin.config import PluginConfig
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.testing.node_sim import RecordingKube, build
from kube_vgpu_dev.processes import free_port
from tests.unit.test_telemetry_exporter import extractor_gpu_utilization
from tests.unit.test_watchdog_cycle import SCENARIO


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[Plugin, RecordingKube, int, int]]:
    sim = build(SCENARIO, tmp_path / "proc")
    metrics, epp = free_port(), free_port()
    conf = PluginConfig(
        node_name=sim.node,
        plugin_dir=str(tmp_path / "dp"),
        pod_resources_socket=str(tmp_path / "pr.sock"),
        watchdog_interval_s=0.1,
        enforcement_steps="event,annotate,evict",
        sm_window_s=0,
        escalate_after_s=0,
        proc_root=str(sim.proc_root),
        metrics_port=metrics,
        epp_port=epp,
        metrics_host="127.0.0.1",
        discovery_file=str(tmp_path / "endpoints.yaml"),
    )
    (tmp_path / "dp").mkdir()
    sim.nvml.advance(10)  # every timeline point of the scenario is in force
    kube = RecordingKube()
    p = Plugin(
        conf,
        nvml=sim.nvml,
        pods=sim.pods,
        kubelet=PodResourcesClient(conf.pod_resources_socket),
        is_nvml_error=real.NVMLError,
        actions=kube,
    )
    stop = threading.Event()

    def tick() -> None:  # the fake's clock drives NVML's sample timestamps: let it run like a real one
        while not stop.wait(0.05):
            sim.nvml.advance(0.05)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    p.start()
    try:
        yield p, kube, metrics, epp
    finally:
        p.stop()
        stop.set()
        ticker.join()


def scrape(port: int, want: str, timeout: float = 60.0) -> str:
    """The exposition once it holds `want` (or the last one after `timeout`; generous, it returns at once)."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        if want in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def test_exporter_and_epp_feed_over_http(plugin: tuple[Plugin, RecordingKube, int, int], tmp_path: Path) -> None:
    p, kube, metrics, epp = plugin
    node_text = scrape(metrics, "vgpu_slice_enforcement_actions_total{")
    fams = {f.name: f for f in text_string_to_metric_families(node_text)}
    used = {s.labels["pod"]: s.value for s in fams["vgpu_slice_memory_used_bytes"].samples}
    assert used["mem-hog"] == 12000 * 2**20
    assert "DCGM_FI_DEV_GPU_UTIL" not in node_text  # the EPP feed lives on its own port only
    epp_text = scrape(epp, "DCGM_FI_DEV_GPU_UTIL{")
    assert "vgpu_slice" not in epp_text
    assert extractor_gpu_utilization(epp_text, "sm-hog") == 1.0  # 70 % SM on a 30 % quota
    assert extractor_gpu_utilization(epp_text, "good") == pytest.approx(0.9)
    assert any(e["pod"] == "serving/mem-hog" for e in kube.events)  # enforcement reached the apiserver side
    deadline = time.monotonic() + 60  # the ladder climbs on the watchdog's clock; a loaded machine is slower
    while "serving/mem-hog" not in kube.evictions and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "serving/mem-hog" in kube.evictions
    assert (tmp_path / "endpoints.yaml").exists()
    assert p.watchdog is not None and p.watchdog.snapshot().cycles > 0


def test_ports_already_in_use_do_not_stop_the_plugin(tmp_path: Path) -> None:
    sim = build(SCENARIO, tmp_path / "proc")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = int(busy.getsockname()[1])
        (tmp_path / "dp").mkdir()
        conf = PluginConfig(
            node_name=sim.node,
            plugin_dir=str(tmp_path / "dp"),
            pod_resources_socket=str(tmp_path / "pr.sock"),
            metrics_port=port,
            epp_port=0,
            metrics_host="127.0.0.1",
            proc_root=str(sim.proc_root),
        )
        p = Plugin(conf, nvml=sim.nvml, pods=sim.pods, kubelet=None, is_nvml_error=real.NVMLError)
        p.start()
        try:
            assert p.metrics_servers == [] and p.watchdog is not None
        finally:
            p.stop()
