"""Slices on this node (from the pods' vgpu.io/assignment annotations) and process -> slice attribution."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from device_plugin.pods import PodRecord
from device_plugin.watchdog.cgroup import ContainerRef
from vgpu.annotations import BindPhase

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, order=True)
class SliceId:
    namespace: str
    pod: str
    container: str
    uuid: str


@dataclass(frozen=True, slots=True)
class Slice:
    id: SliceId
    pod_uid: str
    gpu_index: int
    memory_limit: int  # bytes
    cores: int  # percent of the GPU's SMs; 0 = best effort
    role: str
    model: str


def node_slices(pods: Iterable[PodRecord], node: str) -> list[Slice]:
    """Every slice held on `node` by a pod that may be running (not failed, not finished)."""
    out: list[Slice] = []
    for pod in pods:
        a = pod.assignment
        if a is None or a.node != node or pod.phase in ("Succeeded", "Failed"):
            continue
        if pod.bind_phase == BindPhase.FAILED:
            continue
        for c in a.containers:
            for d in c.devices:
                out.append(
                    Slice(
                        id=SliceId(pod.namespace, pod.name, c.name, d.uuid),
                        pod_uid=pod.uid,
                        gpu_index=d.index,
                        memory_limit=d.memory_mib * MIB,
                        cores=d.cores,
                        role=a.role.value,
                        model=a.model or "",
                    )
                )
    return out


class SliceIndex:
    """Lookups for attribution: (pod uid, GPU) -> slices, container id -> name."""

    def __init__(self, slices: Iterable[Slice], pods: Iterable[PodRecord]) -> None:
        self.slices = {s.id: s for s in slices}
        self.by_pod_gpu: dict[tuple[str, str], list[Slice]] = {}
        for s in self.slices.values():
            self.by_pod_gpu.setdefault((s.pod_uid, s.id.uuid), []).append(s)
        self.names: Mapping[str, str] = {cid: name for p in pods for cid, name in p.container_ids}
        self.pod_uids = frozenset(s.pod_uid for s in self.slices.values())

    def attribute(self, ref: ContainerRef | None, uuid: str) -> Slice | None:
        """The slice a process on GPU `uuid` belongs to: its container's slice on that GPU, or the pod's only
        slice on that GPU when the container ID is not (yet) in the pod status. None: not one of ours."""
        if ref is None:
            return None
        candidates = self.by_pod_gpu.get((ref.pod_uid, uuid), [])
        name = self.names.get(ref.container_id)
        if name is not None:
            for s in candidates:
                if s.id.container == name:
                    return s
            return None
        return candidates[0] if len(candidates) == 1 else None
