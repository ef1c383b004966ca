"""Topology through the real kube-scheduler and the extender as a process (docs/topology.md).

Three nodes of four GPUs each advertise their links in `vgpu.io/node-inventory`: PCIe-only, NVLink-bridged pairs,
NVSwitch. A TP4 pod that requires NVLink lands on the NVSwitch node, the next one waits with the reason, a TP2 pod
without the annotation still gets two NVLink peers (a bridged pair), and an invalid value is refused naming the
annotation. Every check reads the pods' assignments back from the apiserver.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.controlplane import ControlPlane
from tests.e2e.vgpu_stack import GPU_MEM, SCHEDULER, SPLIT, Extender, extender_and_scheduler
from vgpu import annotations as ann
from vgpu.devices import GpuDevice
from vgpu.topology import Link, node_topology

KINDS = {
    "pcie": lambda i: (),
    "bridged": lambda i: (i ^ 1,),
    "nvswitch": lambda i: tuple(j for j in range(4) if j != i),
}


@pytest.fixture(scope="module")
def vgpu(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Extender]]:
    with extender_and_scheduler(control_plane, name="vgpu-extender-topology") as ext:
        yield control_plane, ext


def _nodes(cp: ControlPlane, tag: str) -> tuple[dict[str, str], dict[str, list[GpuDevice]]]:
    selector = {"kube-vgpu.e2e/group": f"topo-{tag}"}
    out: dict[str, list[GpuDevice]] = {}
    for kind, peers in KINDS.items():
        name = f"topo-{tag}-{kind}"
        ids = [f"GPU-{name}-{i}" for i in range(4)]
        gpus = [
            GpuDevice(
                ids[i], i, "H100", GPU_MEM, split_count=SPLIT, numa=i // 2, nvlink_peers=tuple(ids[j] for j in peers(i))
            )
            for i in range(4)
        ]
        out[name] = gpus
        cp.add_node(
            name,
            {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(4 * SPLIT)},
            labels=selector,
            annotations={ann.NODE_INVENTORY: ann.encode_inventory(gpus)},
        )
    return selector, out


def _pod(name: str, selector: dict[str, str], gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": selector,
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:latest",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def _failed_scheduling(cp: ControlPlane, name: str, namespace: str, text: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in reversed(cp.pod_events(name, namespace)):
            if e.reason == "FailedScheduling" and text in (e.message or ""):
                return str(e.message)
        time.sleep(0.5)
    raise AssertionError(f"no FailedScheduling event of {name} mentioning {text!r}: {cp.pod_events(name, namespace)}")


def _link(pod: Any, nodes: dict[str, list[GpuDevice]]) -> tuple[str, Link]:
    a = ann.decode_assignment(pod.metadata.annotations[ann.POD_ASSIGNMENT])
    assert a.node == pod.spec.node_name
    return a.node, node_topology(nodes[a.node]).link([d.uuid for d in a.slices()])


def test_nvlink_is_required_preferred_and_refused_with_reasons(
    vgpu: tuple[ControlPlane, Extender], namespace: str
) -> None:
    cp, _ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:4]
    selector, nodes = _nodes(cp, tag)
    required = {ann.POD_REQUIRE_NVLINK: "true"}
    core.create_namespaced_pod(namespace, _pod("tp4", selector, 4, required))
    node, link = _link(cp.wait_for_pod("tp4", namespace, timeout=60), nodes)
    assert (node, link) == (f"topo-{tag}-nvswitch", Link.NVLINK_CROSS_NUMA)
    # The NVSwitch node is full now: a second one waits, and the scheduler says why for the nodes that cannot link 4.
    core.create_namespaced_pod(namespace, _pod("tp4-b", selector, 4, required))
    waiting = _failed_scheduling(cp, "tp4-b", namespace, "needs 4 GPUs that are all NVLink peers")
    assert not core.read_namespaced_pod("tp4-b", namespace).spec.node_name
    # Without the annotation a TP2 still gets NVLink peers: the bridged node's pair, not two PCIe cards.
    core.create_namespaced_pod(namespace, _pod("tp2", selector, 2))
    node2, link2 = _link(cp.wait_for_pod("tp2", namespace, timeout=60), nodes)
    assert (node2, link2) == (f"topo-{tag}-bridged", Link.NVLINK)
    # A value that is neither true nor false is refused on every node, naming the annotation.
    core.create_namespaced_pod(namespace, _pod("bad", selector, 2, {ann.POD_REQUIRE_NVLINK: "yes"}))
    bad = _failed_scheduling(cp, "bad", namespace, "vgpu.io/require-nvlink='yes' is invalid")
    print(
        f"topology e2e: tp4 on {node} ({link.name}), tp2 on {node2} ({link2.name}); waiting: {waiting[:200]}; bad: {bad[:120]}"
    )
