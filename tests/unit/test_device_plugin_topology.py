"""The device plugin's side of the Topology Manager agreement: the node policy it states (settings, else the
kubelet's config file), the NUMA it advertises per replica, and Allocate refusals that say what the kubelet
offered (docs/device-plugin.md, "Topology Manager agreement")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from device_plugin.health import HealthBoard
from device_plugin.inventory import InventoryPublisher
from device_plugin.kubelet_config import node_policy, read_kubelet_config
from device_plugin.manager import AllocationError, DeviceManager, Replica
from device_plugin.server import device_pb
from device_plugin.testing.pods import MemoryPods
from device_plugin.testing.workload import PlacedPod, pod_uid
from vgpu import annotations as ann
from vgpu import kubelet_topology as kt
from vgpu.devices import GpuDevice

NODE = "gpu-1"
GPUS = tuple(
    GpuDevice(f"GPU-{i:08x}-1111-2222-3333-444444444444", i, "H100", 81920, split_count=2, numa=i // 2)
    for i in range(4)
)


def kubelet_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + body)
    return str(path)


def test_the_policy_is_read_from_the_kubelet_config_file(tmp_path: Path) -> None:
    f = kubelet_file(tmp_path, "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n")
    assert read_kubelet_config(f) == ("single-numa-node", "pod")
    got = node_policy(policy="", scope="", kubelet_config=f, numa="auto", gpu_numa=[0, 0, 1, 1])
    assert got == kt.NodePolicy("single-numa-node", "pod", numa_advertised=True, numa_nodes=(0, 1))


def test_settings_win_over_the_file_and_no_file_means_the_kubelet_defaults(tmp_path: Path) -> None:
    f = kubelet_file(tmp_path, "topologyManagerPolicy: single-numa-node\n")
    assert node_policy(policy="restricted", scope="", kubelet_config=f, numa="auto", gpu_numa=[0, 1]).policy == (
        "restricted"
    )
    # A file without the fields: the kubelet's defaults.
    bare = kubelet_file(tmp_path, "maxPods: 110\n")
    got = node_policy(policy="", scope="", kubelet_config=bare, numa="auto", gpu_numa=[0, 1])
    assert got == kt.NodePolicy("none", "container", numa_advertised=True, numa_nodes=(0, 1))


def test_an_unknown_policy_hides_numa_which_every_policy_admits(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    got = node_policy(policy="", scope="", kubelet_config=missing, numa="auto", gpu_numa=[0, 1])
    assert (got.policy, got.numa_advertised) == ("none", False)
    assert node_policy(policy="", scope="", kubelet_config=missing, numa="always", gpu_numa=[0, 1]).numa_advertised


def test_a_value_the_kubelet_would_not_accept_is_logged_and_taken_as_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = kubelet_file(tmp_path, "topologyManagerPolicy: strict\n")
    with caplog.at_level(logging.ERROR):
        got = node_policy(policy="", scope="", kubelet_config=f, numa="auto", gpu_numa=[0, 1])
    assert got.policy == "none"
    assert "topologyManagerPolicy 'strict' is not one of none, best-effort, restricted, single-numa-node" in caplog.text


@pytest.mark.parametrize(
    ("policy", "mode", "gpu_numa", "advertised"),
    [
        ("none", "auto", [0, 1], True),
        ("best-effort", "auto", [0, 1], False),  # would only refuse what best-effort admits
        ("restricted", "auto", [0, 1], True),
        ("single-numa-node", "auto", [0, 1], True),
        ("single-numa-node", "never", [0, 1], False),
        ("best-effort", "always", [0, 1], True),
        ("single-numa-node", "auto", [None, None], False),  # NVML knows no NUMA node: nothing to send
    ],
)
def test_what_is_advertised_per_policy(policy: str, mode: str, gpu_numa: list[int | None], advertised: bool) -> None:
    got = node_policy(policy=policy, scope="container", kubelet_config="/nonexistent", numa=mode, gpu_numa=gpu_numa)  # type: ignore[arg-type]
    assert got.numa_advertised is advertised


def test_list_and_watch_sends_numa_only_when_advertised() -> None:
    r = Replica("GPU-a::0", True, 1)
    assert [n.ID for n in device_pb(r).topology.nodes] == [1]
    assert not device_pb(r, numa=False).HasField("topology")


def test_the_inventory_states_the_policy_next_to_the_gpus() -> None:
    pods = MemoryPods()
    policy = kt.NodePolicy("restricted", numa_nodes=(0, 1))
    pub = InventoryPublisher(node=NODE, gpus=GPUS, board=HealthBoard(g.uuid for g in GPUS), pods=pods, kubelet=policy)
    assert pub.publish()
    value = pods.node_annotations[NODE][ann.NODE_INVENTORY]
    assert kt.policy_of(value) == policy and len(ann.decode_inventory(value)) == 4


def manager(pods: MemoryPods) -> DeviceManager:
    return DeviceManager(
        node=NODE,
        resource="nvidia.com/gpu",
        gpus=GPUS,
        board=HealthBoard(g.uuid for g in GPUS),
        pods=pods,
        kubelet=None,
        retry_s=0.0,
    )


def placed(gpus: list[int]) -> MemoryPods:
    a = ann.Assignment(
        node=NODE,
        containers=(ann.ContainerAssignment("main", tuple(ann.DeviceSlice(GPUS[g].uuid, g, 4096, 10) for g in gpus)),),
    )
    pods = MemoryPods()
    pods.add(PlacedPod("p", pod_uid(16, 0), a).record(namespace="ns", node=NODE, bind_time="t0"))
    return pods


def rid(g: int, n: int = 0) -> str:
    return f"{GPUS[g].uuid}::{n}"


def test_a_refusal_names_what_the_kubelet_offered_when_it_narrowed_to_another_numa_node() -> None:
    """The issue's case: assigned GPU 2 (NUMA 1); the kubelet offered NUMA 0's replicas only, we answered [],
    it picked GPU 0 itself. The refusal says so instead of blaming GetPreferredAllocation."""
    m = manager(placed([2]))
    numa0 = [rid(0), rid(0, 1), rid(1), rid(1, 1)]
    assert m.preferred(numa0, [], 1) == []
    with pytest.raises(AllocationError) as err:
        m.allocate([[rid(0)]])
    text = str(err.value)
    assert f"offered GetPreferredAllocation 4 free replica(s) on {GPUS[0].uuid} (NUMA 0, 2 replicas)" in text
    assert f"not the assigned {GPUS[2].uuid} (NUMA 1)" in text
    assert "we answered []" in text and f"it then chose {GPUS[0].uuid} (NUMA 0, 1 replica)" in text
    assert "not honoured" not in text


def test_a_refusal_of_two_replicas_of_one_gpu_chosen_without_asking_says_so() -> None:
    m = manager(placed([0, 1]))
    with pytest.raises(AllocationError) as err:
        m.allocate([[rid(0), rid(0, 1)]])
    text = str(err.value)
    assert "two vGPUs of one container on the same GPU" in text
    assert f"the kubelet chose {GPUS[0].uuid} (NUMA 0, 2 replicas) without calling GetPreferredAllocation" in text


def test_the_preferred_answer_still_serves_the_assigned_gpus() -> None:
    m = manager(placed([2, 3]))
    every = [rid(g, n) for g in range(4) for n in range(2)]
    answer = m.preferred(every, [], 2)
    assert answer == [rid(2), rid(3)]
    assert len(m.allocate([answer])) == 1
