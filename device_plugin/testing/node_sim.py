"""A simulated GPU node for watchdog/telemetry tests, demos and the overhead benchmark.

From a compact description of pods -> containers -> slices -> processes it builds the three things the
watchdog reads: a FakeNvml scenario (processes with memory/SM timelines on their GPUs), a /proc root whose
`<pid>/cgroup` files put each process in its container (cgroup v2, systemd driver, containerd), and the
pods with their `vgpu.io/assignment` (MemoryPods). Never imported by production code.

    pods:
      - name: llama-prefill-0
        namespace: serving
        role: prefill
        containers:
          - name: vllm
            slices: [{gpu: 0, memoryMiB: 20000, cores: 50}]
            processes: [{pid: 5001, gpu: 0, timeline: [{t: 0, memoryMiB: 18000, sm: 40}]}]
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_plugin.nvml import real
from device_plugin.nvml.discovery import discover
from device_plugin.pods import PodRecord
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.pods import MemoryPods
from vgpu import annotations as ann
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.roles import Role
from vgpu.state import ClusterState


def container_id(pod: str, container: str) -> str:
    return hashlib.sha256(f"{pod}/{container}".encode()).hexdigest()


def pod_uid(namespace: str, pod: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{namespace}/{pod}"))


def cgroup_v2_systemd(uid: str, cid: str, qos: str = "burstable") -> str:
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/cri-containerd-{cid}.scope\n"


@dataclass
class RecordingKube:
    """KubeActions that records calls; `pdb_blocks` makes evictions answer 429 (refused by a PDB)."""

    events: list[dict[str, str]] = field(default_factory=list)
    annotations: list[tuple[str, dict[str, str | None]]] = field(default_factory=list)
    evictions: list[str] = field(default_factory=list)
    eviction_uids: list[str] = field(default_factory=list)  # the UID each eviction named (its precondition)
    pdb_blocks: bool = False

    def create_pod_event(
        self, *, namespace: str, pod: str, uid: str, reason: str, message: str, event_type: str = "Warning"
    ) -> None:
        self.events.append({"pod": f"{namespace}/{pod}", "uid": uid, "reason": reason, "message": message})

    def patch_pod_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.annotations.append((f"{namespace}/{name}", dict(annotations)))

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> bool:
        self.evictions.append(f"{namespace}/{name}")
        self.eviction_uids.append(uid)
        return not self.pdb_blocks


@dataclass
class SimNode:
    node: str
    nvml: FakeNvml
    pods: MemoryPods
    proc_root: Path
    gpus: tuple[GpuDevice, ...]
    handles: dict[str, object]

    def cluster_state(self) -> ClusterState:
        """The scheduler's view of this node: its inventory with every simulated pod's assignment applied."""
        state = ClusterState()
        state.upsert_node(NodeInventory(name=self.node, gpus=self.gpus))
        for pod in self.pods.pods.values():
            assert pod.assignment is not None
            state.apply(pod.key, pod.assignment)
        return state


def build(
    spec: Mapping[str, Any], proc_root: Path, *, node: str = "node-a", gpus: list[Mapping[str, Any]] | None = None
) -> SimNode:
    """Build the fake NVML, the /proc tree under proc_root and the pods of `spec` (see the module doc)."""
    processes: list[Mapping[str, Any]] = list(spec.get("hostProcesses", []))
    pods = MemoryPods()
    nvml_gpus = gpus or [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": 8, "nvlink": "switch"}]
    nvml = FakeNvml(
        {
            "driver": spec.get("driver", "550.54.15"),
            "gpus": nvml_gpus,
            "memoryLimits": spec.get("memoryLimits", "unsupported"),
        }
    )
    nvml.nvmlInit()
    devices, handles = discover(nvml, split_count=10, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
    by_index = {d.index: d for d in devices}
    for i, p in enumerate(spec.get("pods", [])):
        ns, name = str(p.get("namespace", "default")), str(p["name"])
        uid = str(p.get("uid") or pod_uid(ns, name))
        containers = []
        ids = []
        for c in p.get("containers", []):
            cid = container_id(name, str(c["name"]))
            ids.append((cid, str(c["name"])))
            containers.append(
                ann.ContainerAssignment(
                    name=str(c["name"]),
                    devices=tuple(
                        ann.DeviceSlice(
                            by_index[int(s["gpu"])].uuid, int(s["gpu"]), int(s["memoryMiB"]), int(s.get("cores", 0))
                        )
                        for s in c.get("slices", [])
                    ),
                )
            )
            for proc in c.get("processes", []):
                pid = int(proc["pid"])
                (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
                (proc_root / str(pid) / "cgroup").write_text(cgroup_v2_systemd(uid, cid))
                processes.append({"gpu": int(proc["gpu"]), "pid": pid, "timeline": proc["timeline"]})
        assignment = ann.Assignment(
            node=node, containers=tuple(containers), role=Role(p.get("role", "prefill-decode")), model=p.get("model")
        )
        pods.add(
            PodRecord(
                namespace=ns,
                name=name,
                uid=uid,
                node=node,
                phase="Running",
                bind_phase=ann.BindPhase.ALLOCATED,
                assignment=assignment,
                container_ids=tuple(ids),
                pod_ip=str(p.get("ip", f"10.0.{i // 250}.{i % 250 + 2}")),
                labels=tuple(sorted((str(k), str(v)) for k, v in (p.get("labels") or {}).items())),
            )
        )
    for proc in spec.get("hostProcesses", []):
        pid = int(proc["pid"])
        (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc_root / str(pid) / "cgroup").write_text("0::/system.slice/some-daemon.service\n")
    nvml.processes = processes
    return SimNode(node=node, nvml=nvml, pods=pods, proc_root=proc_root, gpus=devices, handles=handles)
