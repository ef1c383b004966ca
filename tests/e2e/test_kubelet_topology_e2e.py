"""The node's Topology Manager policy through the real kube-scheduler and the extender as a process
(docs/device-plugin.md, "Topology Manager agreement").

A node whose inventory states `single-numa-node`, filled and then freed to one replica on each NUMA node: a pod
asking 2 vGPUs is refused before binding (FailedScheduling with the kubelet's view: it would refuse the pod),
where a NUMA-blind extender would have bound it across NUMA nodes for the kubelet to reject. When the node's
inventory states policy none instead, the same pod is scheduled on the two GPUs across the NUMA nodes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.controlplane import ControlPlane
from tests.e2e.vgpu_stack import GPU_MEM, SCHEDULER, Extender, extender_and_scheduler
from vgpu import annotations as ann
from vgpu import kubelet_topology as kt
from vgpu.devices import GpuDevice

SPLIT = 4
NUMA = (0, 0, 1, 1)


@pytest.fixture(scope="module")
def vgpu(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Extender]]:
    with extender_and_scheduler(control_plane, name="vgpu-extender-numa") as ext:
        yield control_plane, ext


def _pod(name: str, selector: dict[str, str], gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem-percentage": "25"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": selector,
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest", "resources": {"limits": limits}}],
        },
    }


def _gpus_of(pod: Any) -> list[str]:
    return [d.uuid for d in ann.decode_assignment(pod.metadata.annotations[ann.POD_ASSIGNMENT]).slices()]


def _failed_scheduling(cp: ControlPlane, name: str, namespace: str, text: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in reversed(cp.pod_events(name, namespace)):
            if e.reason == "FailedScheduling" and text in (e.message or ""):
                return str(e.message)
        time.sleep(0.5)
    raise AssertionError(f"no FailedScheduling event of {name} mentioning {text!r}: {cp.pod_events(name, namespace)}")


def test_single_numa_node_refuses_before_binding_and_none_schedules_across(
    vgpu: tuple[ControlPlane, Extender], namespace: str
) -> None:
    cp, ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:6]
    node, selector = f"numa-{tag}", {"kube-vgpu.e2e/group": f"numa-{tag}"}
    gpus = [
        GpuDevice(
            f"GPU-{tag}{i:02d}-0000-4000-8000-{uuid.uuid4().hex[:12]}", i, "H100", GPU_MEM, split_count=SPLIT, numa=n
        )
        for i, n in enumerate(NUMA)
    ]

    def inventory(policy: kt.Policy) -> str:
        return kt.with_policy(ann.encode_inventory(gpus), kt.NodePolicy(policy, numa_nodes=(0, 1)))

    cp.add_node(
        node,
        {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(len(gpus) * SPLIT)},
        labels=selector,
        annotations={ann.NODE_INVENTORY: inventory("single-numa-node")},
    )
    # Every replica taken, by the extender (NUMA 0 first, as the kubelet would admit them) ...
    fillers = [f"fill-{i}" for i in range(len(gpus) * SPLIT)]
    for name in fillers:
        core.create_namespaced_pod(namespace, _pod(name, selector, 1))
    on: dict[str, list[str]] = {}
    for name in fillers:
        on.setdefault(_gpus_of(cp.wait_for_pod(name, namespace, timeout=90))[0], []).append(name)
    assert sorted(len(v) for v in on.values()) == [SPLIT] * len(gpus)
    # ... then one freed on GPU 1 (NUMA 0) and one on GPU 2 (NUMA 1).
    for g in (gpus[1], gpus[2]):
        cp.delete_pod(on[g.uuid][0], namespace)
    deadline = time.monotonic() + 60
    while sum(a["pod"].startswith(f"{namespace}/") for a in ext.get("/state")["allocations"]) != len(fillers) - 2:
        assert time.monotonic() < deadline, "the extender did not release the deleted pods"
        time.sleep(0.3)
    core.create_namespaced_pod(namespace, _pod("tp2", selector, 2))
    msg = _failed_scheduling(cp, "tp2", namespace, "would refuse 2 vGPU(s)")
    assert "single-numa-node" in msg and "NUMA 0: 1, NUMA 1: 1" in msg
    assert not core.read_namespaced_pod("tp2", namespace).spec.node_name
    # The same node under policy none: the kubelet offers every replica, the pod goes across NUMA nodes.
    core.patch_node(node, {"metadata": {"annotations": {ann.NODE_INVENTORY: inventory("none")}}})
    placed = cp.wait_for_pod("tp2", namespace, timeout=60)
    assert sorted(_gpus_of(placed)) == sorted([gpus[1].uuid, gpus[2].uuid])
    print(f"single-numa-node: refused before binding ({msg[:200]}); policy none: bound across NUMA nodes")
