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
from device_plugin.testing.workload import PlacedPod, placed_pods, pod_uid
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
            # A kubelet whose Topology Manager aligns devices: replicas then carry their NUMA node (policy
            # unknown or best-effort sends none, see docs/device-plugin.md).
            topology_manager_policy="restricted",
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
    deadline = time.monotonic() + 30
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
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # the publisher writes on its own thread: the first annotation may not be there yet
        raw = rig.pods.node_annotations.get(NODE, {}).get(ann.NODE_INVENTORY)
        gpus = ann.decode_inventory(raw) if raw else ()
        if gpus and not gpus[2].healthy:
            break
        time.sleep(0.05)
    assert [g.healthy for g in gpus] == [True, True, False, True, True, True, True, True]


def test_kubelet_restart_reregisters_and_serves_again(rig: Rig) -> None:
    """The socket watch (a 0.5 s poll) re-serves and re-registers. No wall-clock bound: the 5 s this test once
    asserted included the test kubelet's own gRPC restart and the old server's 1 s grace, and a loaded 2-core
    machine overran it; a watch that never fires still fails the 30 s wait."""
    pods = make_pods(rig, 6, 4)
    for p in pods:
        rig.pods.add(p)
    admit(rig, pods[0])
    updates = rig.kubelet.state.device_updates
    rig.kubelet.restart()
    assert rig.kubelet.wait(lambda: len(rig.kubelet.state.registrations) >= 2)
    # the new server's ListAndWatch sent the device list to the restarted kubelet (not counted before the restart)
    assert rig.kubelet.wait(lambda: rig.kubelet.state.device_updates > updates)
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
    assert rig.kubelet.wait(lambda: len(rig.kubelet.state.registrations) >= 2)
    for p in pods[10:]:
        admit(rig, p)
    rig.plugin.manager.drain()
    deadline = time.monotonic() + 30
    while rig.pods.get(pods[9].key).bind_phase != ann.BindPhase.ALLOCATED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {rig.pods.get(p.key).bind_phase for p in pods} == {ann.BindPhase.ALLOCATED}


# --- defence in depth: assignments the extender could not have written are refused over gRPC -----------------


def placed(rig: Rig, name: str, *containers: tuple[str, list[tuple[int, int, int]]], i: int = 0) -> PodRecord:
    """A pod in bind-phase allocating whose spec asks exactly for its assignment (gpu index, MiB, cores)."""
    uuids = rig.uuids()
    a = ann.Assignment(
        node=NODE,
        containers=tuple(
            ann.ContainerAssignment(c, tuple(ann.DeviceSlice(uuids[g], g, mem, cores) for g, mem, cores in slices))
            for c, slices in containers
        ),
    )
    return PlacedPod(name, pod_uid(77, i), a).record(
        namespace="team", node=NODE, bind_time=f"2026-01-01T00:00:{i:02d}Z"
    )


def refused_over_grpc(rig: Rig, p: PodRecord) -> str:
    rig.pods.add(p)
    assert p.assignment is not None
    with pytest.raises(grpc.RpcError) as info:
        rig.kubelet.admit(p.key, [(c.name, len(c.devices)) for c in p.assignment.containers])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not any(uid == p.uid for uid, _ in rig.plugin.manager.served()), "a refused pod was recorded as served"
    assert rig.pods.get(p.key).bind_phase == ann.BindPhase.ALLOCATING
    # What the kubelet then does with a pod whose admission failed (UnexpectedAdmissionError): phase Failed.
    rig.pods.add(dataclasses.replace(rig.pods.get(p.key), phase="Failed"))
    return str(info.value.details())


def test_traversal_container_name_is_refused_and_reaches_no_path(rig: Rig) -> None:
    p = placed(rig, "evil", ("x/../../../../../../../../../etc", [(0, 81559, 100)]))
    msg = refused_over_grpc(rig, p)
    assert msg == (
        "vGPU Allocate refused: pod team/evil container 'x/../../../../../../../../../etc': the assignment's "
        "container name is not a DNS-1123 label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters)"
    )


def test_assignment_inconsistent_with_the_pod_spec_is_refused(rig: Rig) -> None:
    p = placed(rig, "greedy", ("vllm", [(0, 81559, 100)]))
    asks = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "10"}
    p = dataclasses.replace(p, spec={"spec": {"containers": [{"name": "vllm", "resources": {"limits": asks}}]}})
    msg = refused_over_grpc(rig, p)
    assert msg == (
        f"vGPU Allocate refused: pod team/greedy container 'vllm': the assignment gives 81559 MiB on GPU "
        f"{rig.uuids()[0]} but the container's requests resolve to 8192 MiB there (nvidia.com/gpumem=8192)"
    )


def test_foreign_gpu_is_refused(rig: Rig) -> None:
    p = placed(rig, "far", ("vllm", [(0, 8192, 10)]))
    assert p.assignment is not None
    foreign = ann.DeviceSlice("GPU-0badc0de-0000-0000-0000-000000000000", 0, 8192, 10)
    p = dataclasses.replace(
        p, assignment=dataclasses.replace(p.assignment, containers=(ann.ContainerAssignment("vllm", (foreign,)),))
    )
    msg = refused_over_grpc(rig, p)
    assert msg.startswith(
        f"vGPU Allocate refused: pod team/far container 'vllm': GPU 'GPU-0badc0de-0000-0000-0000-000000000000' "
        f"is not a GPU of node {NODE} (its GPUs: "
    )


def test_unhealthy_gpu_is_refused(rig: Rig) -> None:
    bad = rig.uuids()[2]
    rig.nvml.inject_xid(2, 79)
    assert rig.kubelet.wait(
        lambda: all(d.health == "Unhealthy" for i, d in rig.kubelet.state.devices.items() if i.startswith(bad))
    )
    msg = refused_over_grpc(rig, placed(rig, "sick", ("vllm", [(2, 8192, 10)])))
    assert msg.startswith(f"vGPU Allocate refused: pod team/sick container 'vllm': GPU {bad} is unhealthy (")


def test_over_commit_by_two_assignments_is_refused_also_after_a_plugin_restart(rig: Rig) -> None:
    first = placed(rig, "first", ("vllm", [(0, 61440, 60)]), i=1)
    rig.pods.add(first)
    admit(rig, first)
    # Served in this process, bind-phase not yet `allocated` in the apiserver: still counted.
    second = placed(rig, "second", ("vllm", [(0, 30720, 30)]), i=2)
    msg = refused_over_grpc(rig, second)
    assert msg == (
        f"vGPU Allocate refused: pod team/second container 'vllm': GPU {rig.uuids()[0]} would be over-committed: "
        "memory 61440 + 30720 MiB > 81559 MiB (already held by 1 slice(s) of team/first)"
    )
    rig.plugin.manager.drain()
    assert rig.pods.get(first.key).bind_phase == ann.BindPhase.ALLOCATED
    # A new process knows nothing in memory: the apiserver's bind-phase allocated is what it counts.
    rig.plugin.stop()
    rig.plugin = rig.new_plugin()
    rig.plugin.start()
    assert rig.kubelet.wait(lambda: len(rig.kubelet.state.registrations) >= 2)
    third = placed(rig, "third", ("vllm", [(0, 8192, 50)]), i=3)
    msg = refused_over_grpc(rig, third)
    assert "would be over-committed: cores 60 + 50% > 100% (already held by 1 slice(s) of team/first)" in msg
    fits = placed(rig, "fits", ("vllm", [(0, 8192, 40)]), i=4)
    rig.pods.add(fits)
    admit(rig, fits)  # exactly what is left is still served
