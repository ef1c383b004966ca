"""MPS operated by the plugin and the HAMi-core option, over real gRPC with a test kubelet: the daemon (a fake
nvidia-cuda-mps-control) started with the plugin, MPS clients' mounts, the replicas Unhealthy and Allocate
refused while the daemon is down, recovery, `quit` on stop; HAMi-core's library and preload mounted only when
the option names it."""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.app import Plugin
from device_plugin.config import PluginConfig
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.pods import PodRecord
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.kubelet import FakeKubelet
from device_plugin.testing.pods import MemoryPods
from device_plugin.testing.workload import placed_pods
from kube_vgpu_dev.processes import free_port
from tests.mps_fake import cleanup, commands, crash, fake_paths
from vgpu import annotations as ann

NODE = "gpu-node-1"
SCENARIO = {"driver": "550.54.15", "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": 2}]}


@dataclass
class Rig:
    root: Path
    kubelet: FakeKubelet
    pods: MemoryPods
    nvml: FakeNvml
    plugin: Plugin
    metrics_port: int

    def healthy(self) -> set[str]:
        return {d.health for d in self.kubelet.state.devices.values()}

    def pod(self, i: int) -> PodRecord:
        placed = placed_pods(self.plugin.gpus, 6, 7, node=NODE, max_containers=1, max_count=1)[i]
        record = placed.record(namespace="llm", node=NODE, bind_time=f"2026-01-01T00:00:{i:02d}Z")
        self.pods.add(record)
        return record

    def admit(self, p: PodRecord) -> pb.ContainerAllocateResponse:
        assert p.assignment is not None
        return self.kubelet.admit(p.key, [(c.name, len(c.devices)) for c in p.assignment.containers])[0]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
            return str(r.read().decode())


def _rig(root: Path, *, mps: bool, hami: bool) -> Rig:
    paths = fake_paths(root)
    (root / "libvgpu.so").write_bytes(b"\x7fELF not really")
    kubelet = FakeKubelet(str(root / "dp"), str(root / "pr.sock"))
    (root / "dp").mkdir()
    kubelet.start()
    port = free_port()
    conf = PluginConfig(
        node_name=NODE,
        plugin_dir=str(root / "dp"),
        pod_resources_socket=str(root / "pr.sock"),
        allocate_retry_s=0.3,
        health_probe_s=0.2,
        reconcile_s=0.5,
        mps=mps,
        mps_control_binary=paths.binary,
        mps_pipe_dir=paths.pipe_dir,
        mps_log_dir=paths.log_dir,
        mps_shm_dir=paths.shm_dir,
        mps_probe_s=0.2,
        mps_backoff_max_s=1,
        hami_core_library=str(root / "libvgpu.so") if hami else "",
        hami_core_dir=str(root / "hami-core"),
        metrics_host="127.0.0.1",
        metrics_port=port,
        epp_port=0,
        cache_dir_on_host=str(root / "containers"),
    )
    nvml = FakeNvml(SCENARIO)
    pods = MemoryPods()
    plugin = Plugin(
        conf, nvml=nvml, pods=pods, kubelet=PodResourcesClient(conf.pod_resources_socket), is_nvml_error=real.NVMLError
    )
    plugin.start()
    return Rig(root, kubelet, pods, nvml, plugin, port)


@pytest.fixture
def mps_rig() -> Iterator[Rig]:
    root = Path(tempfile.mkdtemp(prefix="mps"))  # short: Unix socket paths are limited to 108 bytes
    r = _rig(root, mps=True, hami=True)
    yield r
    r.plugin.stop()
    r.kubelet.stop()
    cleanup(fake_paths(root))
    shutil.rmtree(root, ignore_errors=True)


def test_mps_daemon_runs_with_the_plugin_and_clients_get_its_folders(mps_rig: Rig) -> None:
    r = mps_rig
    assert r.kubelet.wait(lambda: len(r.kubelet.state.devices) == 20 and r.healthy() == {"Healthy"}, timeout=60)
    assert r.nvml.compute_modes == {0: 3, 1: 3}
    assert commands(fake_paths(r.root))[0].startswith("-d pipe=")
    p = r.pod(0)
    resp = r.admit(p)
    mounts = {m.container_path: m for m in resp.mounts}
    pipe = str(r.root / "pipe")
    assert resp.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe and mounts[pipe].host_path == pipe
    assert mounts["/dev/shm"].host_path == str(r.root / "shm")
    assert resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={p.assignment.containers[0].devices[0].memory_mib}M"  # type: ignore[union-attr]
    # HAMi-core, provided: the library and the preload naming it, read-only, and the shared lock folder
    assert mounts["/usr/local/vgpu/libvgpu.so"].host_path == str(r.root / "libvgpu.so")
    assert mounts["/usr/local/vgpu/libvgpu.so"].read_only and mounts["/etc/ld.so.preload"].read_only
    preload = Path(mounts["/etc/ld.so.preload"].host_path)
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert Path(mounts["/tmp/vgpulock"].host_path).is_dir()
    assert 'vgpu_mps_daemon_up{Hostname="gpu-node-1",reason=""} 1.0' in r.metrics()


def test_allocate_is_refused_while_the_daemon_is_down_and_served_once_it_is_back(mps_rig: Rig) -> None:
    r = mps_rig
    paths = fake_paths(r.root)
    assert r.kubelet.wait(lambda: len(r.kubelet.state.devices) == 20 and r.healthy() == {"Healthy"}, timeout=60)
    (Path(paths.pipe_dir) / "fail-start").write_text("MPS server failed to start")
    crash(paths)
    assert r.kubelet.wait(lambda: r.healthy() == {"Unhealthy"}, timeout=30)
    assert r.plugin.mps is not None
    deadline = time.monotonic() + 30
    while r.plugin.mps.status().failures < 2 and time.monotonic() < deadline:  # lost, then a restart failed
        time.sleep(0.05)
    p = r.pod(1)
    assert p.assignment is not None
    ids = [i for i in r.kubelet.state.devices if i.startswith(p.assignment.containers[0].devices[0].uuid)][:1]
    with pytest.raises(grpc.RpcError) as info:
        assert r.kubelet.stub is not None
        r.kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = str(info.value.details())
    assert "MPS control daemon down" in details and "MPS server failed to start" in details, details
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        raw = r.pods.node_annotations.get(NODE, {}).get(ann.NODE_INVENTORY)
        gpus = ann.decode_inventory(raw) if raw else ()  # not published yet: the publisher runs on its own thread
        if gpus and not any(g.healthy for g in gpus):
            break
        time.sleep(0.05)
    assert [g.healthy for g in gpus] == [False, False]  # the extender places nothing here meanwhile
    text = r.metrics()
    assert "vgpu_mps_daemon_up{" in text and "MPS server failed to start" in text
    (Path(paths.pipe_dir) / "fail-start").unlink()
    assert r.kubelet.wait(lambda: r.healthy() == {"Healthy"}, timeout=30)
    assert r.admit(p).envs["CUDA_MPS_PIPE_DIRECTORY"] == paths.pipe_dir
    assert r.plugin.mps.status().restarts == 1
    assert "vgpu_mps_daemon_restarts_total" in r.metrics()
    r.plugin.stop()
    assert commands(paths)[-1] == "quit" and r.nvml.compute_modes == {0: 0, 1: 0}
    r.plugin.stop = lambda: None  # type: ignore[method-assign]  # stopped already; the fixture calls it again


def test_without_mps_or_hami_core_no_such_mounts() -> None:
    root = Path(tempfile.mkdtemp(prefix="plain"))
    r = _rig(root, mps=False, hami=False)
    try:
        assert r.kubelet.wait(lambda: len(r.kubelet.state.devices) == 20 and r.healthy() == {"Healthy"})
        resp = r.admit(r.pod(0))
        assert [m.container_path for m in resp.mounts] == ["/var/run/vgpu"]
        assert not any(k.startswith("CUDA_MPS") for k in resp.envs) and "CUDA_DEVICE_MEMORY_LIMIT_0" in resp.envs
        assert not (root / "hami-core").exists() and not (root / "pipe").exists()
        assert "vgpu_mps_daemon_up" not in r.metrics()
    finally:
        r.plugin.stop()
        r.kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
