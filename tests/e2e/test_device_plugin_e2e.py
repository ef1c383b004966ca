"""The device plugin (fake NVML, test kubelet) against a real kube-apiserver: node inventory annotation,
Allocate matched from real pod annotations for 50 bound pods in kubelet and shuffled orders, kubelet and
plugin restarts."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_plugin.app import Plugin
from device_plugin.config import PluginConfig
from device_plugin.kube import KubePodSource
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.kubelet import FakeKubelet
from device_plugin.testing.workload import placed_pods, spec_containers
from vgpu import annotations as ann

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e
DATA = Path(__file__).parent.parent / "data" / "nvml"


class Node:
    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(cp.api_client())
        self.name = f"gpu-{uuid.uuid4().hex[:6]}"
        self.namespace = namespace
        cp.add_node(self.name, {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "80"})
        self.dir = tempfile.mkdtemp(prefix="dpe")
        self.kubelet = FakeKubelet(self.dir, f"{self.dir}-pr.sock")
        self.kubelet.start()
        self.nvml = FakeNvml.from_file(DATA / "h100x8.yaml")
        self.plugin = self.new_plugin()

    def new_plugin(self) -> Plugin:
        conf = PluginConfig(
            node_name=self.name,
            plugin_dir=self.dir,
            pod_resources_socket=f"{self.dir}-pr.sock",
            allocate_retry_s=1.0,
            reconcile_s=1.0,
        )
        return Plugin(
            conf,
            nvml=self.nvml,
            pods=KubePodSource(self.core),
            kubelet=PodResourcesClient(conf.pod_resources_socket),
            is_nvml_error=real.NVMLError,
        )

    def close(self) -> None:
        self.plugin.stop()
        self.kubelet.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def bind_like_the_extender(self, name: str, a: ann.Assignment, i: int) -> None:
        """Create the pod, write assignment + bind-phase allocating + bind-time, then the binding."""
        # Requests that resolve to exactly the assignment: the plugin refuses anything else (assignment_check).
        containers = spec_containers(a)
        self.core.create_namespaced_pod(
            self.namespace, {"metadata": {"name": name}, "spec": {"containers": containers}}
        )
        self.core.patch_namespaced_pod(
            name,
            self.namespace,
            {
                "metadata": {
                    "annotations": {
                        ann.POD_ASSIGNMENT: ann.encode_assignment(a),
                        ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
                        ann.POD_BIND_TIME: f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
                    }
                }
            },
        )
        self.core.create_namespaced_binding(
            self.namespace,
            {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": self.name}},
            _preload_content=False,
        )

    def phase(self, name: str) -> str | None:
        pod = self.core.read_namespaced_pod(name, self.namespace)
        return (pod.metadata.annotations or {}).get(ann.POD_BIND_PHASE)


@pytest.fixture
def node(control_plane: ControlPlane, namespace: str) -> Iterator[Node]:
    n = Node(control_plane, namespace)
    n.plugin.start()
    assert n.kubelet.wait(lambda: len(n.kubelet.state.devices) == 80, timeout=90)
    yield n
    n.close()


def assignments(node: Node, count: int, seed: int) -> dict[str, ann.Assignment]:
    """One GPU container per pod, 1-2 vGPUs, all of them together within every GPU's memory, cores and split."""
    placed = placed_pods(node.plugin.gpus, count, seed, node=node.name, max_containers=1)
    return {f"p{i:02d}": p.assignment for i, p in enumerate(placed)}


def admit_and_check(node: Node, name: str, a: ann.Assignment) -> None:
    c = a.containers[0]
    [resp] = node.kubelet.admit(f"{node.namespace}/{name}", [(c.name, len(c.devices))])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in c.devices)
    assert [resp.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(len(c.devices))] == [
        f"{d.memory_mib}m" for d in c.devices
    ]
    cores = c.devices[0].cores
    assert resp.envs.get("CUDA_DEVICE_SM_LIMIT") == (str(cores) if cores else None)


def wait_phases(node: Node, names: list[str], want: str = "allocated", timeout: float = 90.0) -> None:
    """The plugin writes bind-phase from a queue of its own after each Allocate (retried every reconcile_s): 50 PATCHes
    on a loaded machine take a while, so 90 s; it returns as soon as every pod has it."""
    deadline = time.monotonic() + timeout
    left = list(names)
    while left and time.monotonic() < deadline:
        left = [n for n in left if node.phase(n) != want]
        time.sleep(0.2)
    assert not left, f"bind-phase not {want}: {left}"


def test_node_inventory_annotation_is_published(node: Node) -> None:
    deadline = time.monotonic() + 60  # the plugin's first PATCH of its node, behind its start on a loaded machine
    value = None
    while value is None and time.monotonic() < deadline:
        value = (node.core.read_node(node.name).metadata.annotations or {}).get(ann.NODE_INVENTORY)
        time.sleep(0.1)
    assert value is not None
    gpus = ann.decode_inventory(value)
    assert len(gpus) == 8 and {g.model for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert [g.numa for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("order", ["kubelet", "shuffled"])
def test_fifty_bound_pods_get_their_own_slices(node: Node, order: str) -> None:
    want = assignments(node, 50, seed=7)
    for i, (name, a) in enumerate(want.items()):
        node.bind_like_the_extender(name, a, i)
    names = list(want)
    if order == "shuffled":
        random.Random(11).shuffle(names)
    for name in names:
        admit_and_check(node, name, want[name])
    wait_phases(node, names)


def test_kubelet_restart_and_plugin_restart(node: Node) -> None:
    want = assignments(node, 12, seed=3)
    for i, (name, a) in enumerate(want.items()):
        node.bind_like_the_extender(name, a, i)
    names = list(want)
    for name in names[:4]:
        admit_and_check(node, name, want[name])
    node.kubelet.restart()
    # Re-registered (at least once: the plugin may see its socket gone and kubelet.sock back as two events).
    assert node.kubelet.wait(lambda: len(node.kubelet.state.registrations) >= 2, timeout=90)
    for name in names[4:8]:
        admit_and_check(node, name, want[name])
    node.plugin.stop()
    registered = len(node.kubelet.state.registrations)  # the stopped plugin registers no more
    node.plugin = node.new_plugin()
    node.plugin.start()
    assert node.kubelet.wait(lambda: len(node.kubelet.state.registrations) > registered, timeout=90)
    for name in names[8:]:
        admit_and_check(node, name, want[name])
    wait_phases(node, names)
