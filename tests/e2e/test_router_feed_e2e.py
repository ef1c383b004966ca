"""Kubernetes mode on the real control plane: the llm-d file-discovery file the node daemon writes and its
router feed agree on every pod. Pods are bound like the extender binds them (real kube-apiserver, real pod
UIDs), admitted through the test kubelet, given pod IPs; their GPU processes live in the pods' cgroups (a
fake /proc) on a fake-NVML H100 node. Every endpoint of the discovery file must have its own feed value,
read as llm-d's dcgm-extractor does (samples whose `pod` is the endpoint name, max, /100), every pod with a
slice must be in both, and the values must be the slices' SM use over their quotas (0 when idle)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from device_plugin.app import Plugin
from device_plugin.config import PluginConfig
from device_plugin.kube import KubePodSource
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.kubelet import FakeKubelet
from device_plugin.testing.node_sim import cgroup_v2_systemd
from device_plugin.testing.workload import spec_containers
from kube_vgpu_dev.processes import free_port
from tests.unit.test_telemetry_exporter import extractor_gpu_utilization, families
from vgpu import annotations as ann
from vgpu.roles import Role

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e
GPUS = [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": 4}]

# name -> (GPU indexes, cores, role, SM % per GPU of its process (None: no process, idle))
PODS: dict[str, tuple[list[int], int, Role, list[int | None]]] = {
    "prefill-0": ([0], 60, Role.PREFILL, [30]),
    "decode-0": ([0], 20, Role.DECODE, [18]),
    "decode-1": ([1], 25, Role.DECODE, [None]),
    "tp2-0": ([2, 3], 40, Role.PREFILL_DECODE, [10, 34]),
    "decode-2": ([1], 50, Role.DECODE, [20]),
}


class Node:
    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(cp.api_client())
        self.name = f"gpu-{uuid.uuid4().hex[:6]}"
        self.namespace = namespace
        cp.add_node(self.name, {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "40"})
        self.dir = Path(tempfile.mkdtemp(prefix="rfe"))
        self.proc = self.dir / "proc"
        self.discovery = self.dir / "eps" / "endpoints.yaml"
        (self.dir / "plugins").mkdir()
        self.kubelet = FakeKubelet(str(self.dir / "plugins"), f"{self.dir}-pr.sock")
        self.kubelet.start()
        self.nvml = FakeNvml({"gpus": GPUS}, clock=time.monotonic)
        self.epp_port = free_port()
        conf = PluginConfig(
            node_name=self.name,
            plugin_dir=str(self.dir / "plugins"),
            pod_resources_socket=f"{self.dir}-pr.sock",
            allocate_retry_s=1.0,
            reconcile_s=1.0,
            split_count=10,
            watchdog_interval_s=0.2,
            pods_refresh_s=0.5,
            proc_root=str(self.proc),
            hard_memory_limits=False,
            metrics_host="127.0.0.1",
            metrics_port=0,
            epp_port=self.epp_port,
            discovery_file=str(self.discovery),
            discovery_port="8000",
            enforcement_dry_run=True,
        )
        self.plugin = Plugin(
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

    def run_pod(self, i: int, name: str, gpus: list[int], cores: int, role: Role, sm: list[int | None]) -> None:
        """Bind like the extender, admit through the kubelet, set the pod IP, start its GPU processes."""
        by_index = {g.index: g for g in self.plugin.gpus}
        a = ann.Assignment(
            node=self.name,
            containers=(
                ann.ContainerAssignment(
                    name="vllm",
                    devices=tuple(ann.DeviceSlice(by_index[g].uuid, g, 16384, cores) for g in gpus),
                ),
            ),
            role=role,
            model="llama",
        )
        labels = {"app": "vllm", "llm-d.ai/role": role.value}
        self.core.create_namespaced_pod(
            self.namespace,
            {"metadata": {"name": name, "labels": labels}, "spec": {"containers": spec_containers(a)}},
        )
        self.core.patch_namespaced_pod(
            name,
            self.namespace,
            {
                "metadata": {
                    "annotations": {
                        ann.POD_ASSIGNMENT: ann.encode_assignment(a),
                        ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
                        ann.POD_BIND_TIME: f"2026-01-01T00:00:{i:02d}Z",
                    }
                }
            },
        )
        self.core.create_namespaced_binding(
            self.namespace,
            {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": self.name}},
            _preload_content=False,
        )
        [resp] = self.kubelet.admit(f"{self.namespace}/{name}", [("vllm", len(gpus))])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(by_index[g].uuid for g in gpus)
        uid = self.core.read_namespaced_pod(name, self.namespace).metadata.uid
        cid = uuid.uuid5(uuid.NAMESPACE_DNS, name).hex * 2  # 64 hex, as containerd's
        self.core.patch_namespaced_pod_status(
            name,
            self.namespace,
            {
                "status": {
                    "phase": "Running",
                    "podIP": f"10.244.0.{10 + i}",
                    "containerStatuses": [
                        {
                            "name": "vllm",
                            "containerID": f"containerd://{cid}",
                            "image": "registry.invalid/vllm:1",
                            "imageID": "",
                            "ready": True,
                            "restartCount": 0,
                            "state": {"running": {}},
                        }
                    ],
                }
            },
        )
        for k, (g, use) in enumerate(zip(gpus, sm, strict=True)):
            if use is None:
                continue
            pid = 6000 + 10 * i + k
            (self.proc / str(pid)).mkdir(parents=True)
            (self.proc / str(pid) / "cgroup").write_text(cgroup_v2_systemd(uid, cid))
            self.nvml.processes.append({"gpu": g, "pid": pid, "timeline": [{"t": 0, "memoryMiB": 4000, "sm": use}]})


@pytest.fixture
def node(control_plane: ControlPlane, namespace: str) -> Iterator[Node]:
    n = Node(control_plane, namespace)
    n.plugin.start()
    assert n.kubelet.wait(lambda: len(n.kubelet.state.devices) == 40, timeout=90)
    yield n
    n.close()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_discovery_file_and_feed_agree_on_every_pod(node: Node) -> None:
    for i, (name, spec) in enumerate(PODS.items()):
        node.run_pod(i, name, *spec)
    expect = {
        name: max((use or 0) / cores for use in sm) for name, (_g, cores, _r, sm) in PODS.items()
    }  # SM use over quota, max over the pod's GPUs
    deadline = time.monotonic() + 90  # the plugin's pod refresh, Allocate bookkeeping and feed, on a loaded machine
    last: Any = None
    while time.monotonic() < deadline:
        try:
            doc = json.loads(node.discovery.read_text())
            text = _scrape(node.epp_port)
            endpoints = {e["name"]: e for e in doc["endpoints"]}
            fed = {s.labels["pod"] for s in families(text)["DCGM_FI_DEV_GPU_UTIL"].samples}
            values = {n: extractor_gpu_utilization(text, n) for n in endpoints}
            last = (sorted(endpoints), sorted(fed), values)
            if set(endpoints) == set(fed) == set(PODS) and all(
                values[n] == pytest.approx(v) for n, v in expect.items()
            ):
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    else:
        raise AssertionError(f"discovery file and feed never agreed with the pods: {last}")
    print(f"\nrouter feed e2e: {len(endpoints)} pods, discovery file = feed; values {values}")
    for name, e in endpoints.items():
        labels = e["labels"]
        gpus, cores, role, _ = PODS[name]
        assert e["namespace"] == node.namespace and e["port"] == "8000" and e["address"].startswith("10.244.0.")
        assert labels["llm-d.ai/role"] == role.value and labels["llm-d.ai/model"] == "llama"
        assert len(labels["vgpu.io/gpu"].split(",")) == len(gpus)
        assert labels["vgpu.io/gpu-cores"] == ",".join([str(cores)] * len(gpus))
    assert values["decode-1"] == 0.0  # idle: in the feed with 0, not missing
    assert len({round(v or 0, 6) for v in values.values()}) == len(values)  # each pod its own value
