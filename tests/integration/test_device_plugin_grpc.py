"""The plugin over real gRPC on Unix sockets, driven by a test kubelet (device_plugin.testing.kubelet)."""

from __future__ import annotations

import dataclasses
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from device_plugin.app import Plugin
from device_plugin.config import PluginConfig
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.pods import PodRecord
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.kubelet import FakeKubelet
from device_plugin.testing.pods import MemoryPods
from device_plugin.testing.workload import placed_pods
from vgpu import annotations as ann

NODE = "gpu-node-1"
DATA = Path(__file__).parent.parent / "data" / "nvml"


@dataclasses.dataclass
class Rig:
    dir: str
    kubelet: FakeKubelet
    pods: MemoryPods
    nvml: FakeNvml
    plugin: Plugin

    def new_plugin(self) -> Plugin:
        conf = PluginConfig(
            node_name=NODE,
            plugin_dir=self.dir,
            pod_resources_socket=f"{self.dir}-pr.sock",
            allocate_retry_s=0.3,
            health_probe_s=0.2,
            xid_recovery_s=3600,
            reconcile_s=0.5,
        )
        return Plugin(
            conf,
            nvml=self.nvml,
            pods=self.pods,
            kubelet=PodResourcesClient(conf.pod_resources_socket),
            is_nvml_error=real.NVMLError,
        )

    def uuids(self) -> list[str]:
        return [g.uuid for g in self.plugin.gpus]


@pytest.fixture
def rig() -> Iterator[Rig]:
    d = tempfile.mkdtemp(prefix="dp")
    kubelet = FakeKubelet(d, f"{d}-pr.sock")
    kubelet.start()
    r = Rig(d, kubelet, MemoryPods(), FakeNvml.from_file(DATA / "h100x8.yaml"), None)  # type: ignore[arg-type]
    r.plugin = r.new_plugin()
    r.plugin.start()
    assert kubelet.wait(lambda: len(kubelet.state.devices) == 80), "no devices from ListAndWatch"
    yield r
    r.plugin.stop()
    kubelet.stop()
    shutil.rmtree(d, ignore_errors=True)


def make_pods(rig: Rig, n: int, seed: int) -> list[PodRecord]:
    """n pods with 1-2 GPU containers of 1-2 vGPUs each, as the extender would place them: specs that resolve
    to the assignments, never over a GPU's memory, cores or split (device_plugin.testing.workload)."""
    return [
        p.record(namespace="llm", node=NODE, bind_time=f"2026-01-01T00:00:{i:02d}Z")
        for i, p in enumerate(placed_pods(rig.plugin.gpus, n, seed, node=NODE))
    ]


def assert_env_matches(resp_envs: dict[str, str], c: ann.ContainerAssignment) -> None:
    assert resp_envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in c.devices)
    for i, d in enumerate(c.devices):
        assert resp_envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{d.memory_mib}m"
    cores = max(d.cores for d in c.devices)
    assert resp_envs.get("CUDA_DEVICE_SM_LIMIT") == (str(cores) if cores else None)


def admit(rig: Rig, p: PodRecord) -> None:
    assert p.assignment is not None
    responses = rig.kubelet.admit(p.key, [(c.name, len(c.devices)) for c in p.assignment.containers])
    for resp, c in zip(responses, p.assignment.containers, strict=True):
        assert_env_matches(dict(resp.envs), c)
        assert resp.annotations["vgpu.io/pod"] == p.key


def test_registers_after_serving_and_advertises_replicas_with_numa(rig: Rig) -> None:
    reg = rig.kubelet.state.registrations[0]
    assert (reg.version, reg.endpoint, reg.resource_name) == ("v1beta1", "vgpu.sock", "nvidia.com/gpu")
    assert reg.options.get_preferred_allocation_available and not reg.options.pre_start_required
    devs = rig.kubelet.state.devices
    assert all(len(i) <= 63 and d.health == "Healthy" for i, d in devs.items())
    numa = {i.split("::")[0]: d.topology.nodes[0].ID for i, d in devs.items()}
    assert [numa[u] for u in rig.uuids()] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_publishes_node_inventory(rig: Rig) -> None:
    deadline = time.monotonic() + 5
    while ann.NODE_INVENTORY not in rig.pods.node_annotations.get(NODE, {}) and time.monotonic() < deadline:
        time.sleep(0.05)
    gpus = ann.decode_inventory(rig.pods.node_annotations[NODE][ann.NODE_INVENTORY])
    assert [g.uuid for g in gpus] == rig.uuids()
    assert {g.memory_mib for g in gpus} == {81559} and all(len(g.nvlink_peers) == 7 for g in gpus)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fifty_pending_pods_each_get_their_own_slice_in_any_order(rig: Rig, seed: int) -> None:
    pods = make_pods(rig, 50, seed)
    for p in pods:
        rig.pods.add(p)
    order = list(pods)
    random.Random(seed).shuffle(order)
    for p in order:
        admit(rig, p)
    rig.plugin.manager.drain()
    assert {rig.pods.get(p.key).bind_phase for p in pods} == {ann.BindPhase.ALLOCATED}


def test_pod_without_assignment_is_refused_with_a_clear_error(rig: Rig) -> None:
    # someone else's pending pod, whose first container has another shape (2 vGPUs)
    other = next(p for p in make_pods(rig, 20, 9) if p.assignment and len(p.assignment.containers[0].devices) == 2)
    rig.pods.add(other)
    with pytest.raises(grpc.RpcError) as info:
        rig.kubelet.admit("default/stranger", [("main", 1)])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "refused" in str(info.value.details())


def test_critical_xid_turns_replicas_unhealthy_and_updates_inventory(rig: Rig) -> None:
    bad = rig.uuids()[2]
    rig.nvml.inject_xid(2, 79)
    assert rig.kubelet.wait(
        lambda: all(d.health == "Unhealthy" for i, d in rig.kubelet.state.devices.items() if i.startswith(bad))
    )
    healthy = [d for i, d in rig.kubelet.state.devices.items() if not i.startswith(bad)]
    assert len(healthy) == 70 and all(d.health == "Healthy" for d in healthy)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        gpus = ann.decode_inventory(rig.pods.node_annotations[NODE][ann.NODE_INVENTORY])
        if not gpus[2].healthy:
            break
        time.sleep(0.05)
    assert [g.healthy for g in gpus] == [True, True, False, True, True, True, True, True]


def test_kubelet_restart_reregisters_within_five_seconds(rig: Rig) -> None:
    pods = make_pods(rig, 6, 4)
    for p in pods:
        rig.pods.add(p)
    admit(rig, pods[0])
    t0 = time.monotonic()
    rig.kubelet.restart()
    assert rig.kubelet.wait(lambda: len(rig.kubelet.state.registrations) == 2, timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    assert rig.kubelet.wait(lambda: rig.kubelet.state.device_updates >= 2)
    for p in pods[1:]:
        admit(rig, p)


def test_plugin_restart_rebuilds_from_apiserver_and_kubelet(rig: Rig) -> None:
    pods = make_pods(rig, 20, 5)
    for p in pods:
        rig.pods.add(p)
    for p in pods[:10]:
        admit(rig, p)
    rig.plugin.manager.drain()
    # A pod the kubelet allocated but whose bind-phase patch was lost when the old plugin died:
    rig.pods.add(dataclasses.replace(rig.pods.get(pods[9].key), bind_phase=ann.BindPhase.ALLOCATING))
    rig.plugin.stop()
    rig.plugin = rig.new_plugin()
    rig.plugin.start()
    assert rig.kubelet.wait(lambda: len(rig.kubelet.state.registrations) == 2)
    for p in pods[10:]:
        admit(rig, p)
    rig.plugin.manager.drain()
    deadline = time.monotonic() + 5
    while rig.pods.get(pods[9].key).bind_phase != ann.BindPhase.ALLOCATED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {rig.pods.get(p.key).bind_phase for p in pods} == {ann.BindPhase.ALLOCATED}
