"""The device manager: devices to advertise, preferred allocations, and Allocate → the right pod's slice.

Knows nothing of gRPC (device_plugin.server translates). Decisions are serialised by an in-process lock
held only while deciding — never while reading the apiserver or the kubelet, never through a retry wait, and
never a lock stored anywhere that could outlive the process.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from device_plugin.envs import ContainerSlice, EnvSettings, container_slice
from device_plugin.health import GpuHealth, HealthBoard
from device_plugin.matching import (
    Candidate,
    MatchError,
    Mismatch,
    NotVisible,
    PreferredCall,
    holding,
    match,
    offer_text,
    preferred,
)
from device_plugin.pods import KubeletPods, KubeletView, PodRecord, PodSource
from device_plugin.replicas import gpu_of, replica_ids
from vgpu import annotations as ann
from vgpu.assignment_check import AssignmentRefused, NodeGpus, check_assignment, shown
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.devices import GpuDevice
from vgpu.priority import runtime_priority

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    healthy: bool
    numa: int | None


class AllocationError(Exception):
    """Allocate refused: the kubelet fails the pod's admission with this message."""


class DeviceManager:
    def __init__(
        self,
        *,
        node: str,
        resource: str,
        gpus: tuple[GpuDevice, ...],
        board: HealthBoard,
        pods: PodSource,
        kubelet: KubeletPods | None,
        settings: EnvSettings = EnvSettings(),
        names: ResourceNames | None = None,
        defaults: RequestDefaults = RequestDefaults(),
        retry_s: float = 2.0,
        retry_interval_s: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.node = node
        self.resource = resource
        self.gpus = gpus
        self.board = board
        self.pods = pods
        self.kubelet = kubelet
        self.settings = settings
        # The extender's resource names and request defaults: an assignment is checked against what the
        # pod's requests resolve to with them (vgpu.assignment_check).
        self.names = names if names is not None else ResourceNames(count=resource)
        self.defaults = defaults
        self.retry_s = retry_s
        self.retry_interval_s = retry_interval_s
        self.sleep = sleep
        self._lock = threading.Lock()
        self._served: dict[tuple[str, str], tuple[str, ...]] = {}
        self._patches: queue.Queue[PodRecord | None] = queue.Queue()
        self._patcher: threading.Thread | None = None
        # The kubelet's last GetPreferredAllocation per size: Allocate's refusals say what it offered.
        self._offers: dict[int, PreferredCall] = {}

    # --- ListAndWatch ----------------------------------------------------------------------------

    def devices(self) -> list[Replica]:
        _, health = self.board.snapshot()
        out: list[Replica] = []
        for g in self.gpus:
            ok = g.healthy and health.get(g.uuid, GpuHealth(False, "unknown")).healthy
            out.extend(Replica(rid, ok, g.numa) for rid in replica_ids(g.uuid, g.split_count))
        return out

    # --- kubelet calls ---------------------------------------------------------------------------

    def _inputs(self) -> tuple[list[PodRecord], KubeletView | None]:
        view = self.kubelet.view(resource=self.resource) if self.kubelet is not None else None
        return self.pods.list_node_pods(node=self.node), view

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        try:
            pods, view = self._inputs()
        except Exception as exc:
            log.warning("GetPreferredAllocation: cannot list pods (%s); letting the kubelet choose", exc)
            return []
        with self._lock:
            answer = preferred(
                available, must_include, size, pods, node=self.node, kubelet=view, served=self._served.keys()
            )
            self._offers[size] = PreferredCall(tuple(available), tuple(must_include), size, tuple(answer))
            return answer

    def allocate(self, requests: list[list[str]]) -> list[ContainerSlice]:
        """One slice per container request, all or none, or AllocationError naming why.

        Only "not visible yet" (no pod waiting for the request in the list just read, or the list could not
        be read) is re-read, for up to retry_s, and the wait holds no lock: other pods are served meanwhile.
        Everything else is final at once — device IDs we do not advertise or that are unhealthy, an ambiguous
        or mismatched request, an assignment vgpu.assignment_check refuses — re-reading would not change it.
        """
        self.check_devices(requests)
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                pods, view = self._inputs()
            except Exception as exc:  # apiserver unreachable: may come back within retry_s
                last = f"cannot read pods: {exc}"
            else:
                with self._lock:
                    try:
                        return self._serve(requests, pods, view)
                    except NotVisible as exc:
                        last = str(exc)
            if time.monotonic() >= deadline:
                raise AllocationError(f"vGPU Allocate refused: {last}")
            self.sleep(self.retry_interval_s)

    def check_devices(self, requests: list[list[str]]) -> None:
        """Every request names at least one device, and only healthy replicas we advertise (else final)."""
        if not requests:
            raise AllocationError("vGPU Allocate refused: the request names no container")
        advertised = {r.id: r for r in self.devices()}
        for i, ids in enumerate(requests):
            if not ids:
                raise AllocationError(f"vGPU Allocate refused: container request {i} names no device")
            for rid in ids:
                replica = advertised.get(rid)
                if replica is None:
                    raise AllocationError(
                        f"vGPU Allocate refused: device {shown(rid)} is not advertised by this plugin for "
                        f"{self.resource} (its devices are <GPU uuid>::<n> for this node's {len(self.gpus)} GPU(s))"
                    )
                if not replica.healthy:
                    reason = self.board.get(gpu_of(rid)).reason or "unhealthy at discovery"
                    raise AllocationError(f"vGPU Allocate refused: device {rid} is unhealthy ({reason})")

    def _serve(
        self, requests: list[list[str]], pods: list[PodRecord], view: KubeletView | None
    ) -> list[ContainerSlice]:
        """Under the lock: match and slice every container request against one read of the pods, recording
        them as served only when all succeed (a failure part-way leaves nothing served, so a retry can)."""
        served = dict(self._served)
        out: list[ContainerSlice] = []
        named: dict[str, PodRecord] = {}
        for ids in requests:
            cand = self._match(ids, pods, view, served)
            assert cand.pod.assignment is not None
            try:
                out.append(
                    container_slice(
                        cand.container,
                        namespace=cand.pod.namespace,
                        pod=cand.pod.name,
                        pod_uid=cand.pod.uid,
                        index=cand.pod.assignment.containers.index(cand.container),
                        settings=self.settings,
                        runtime_priority=runtime_priority(
                            cand.pod.spec,
                            cand.container.name,
                            resource=self.names.priority,
                            online_min=self.settings.online_priority_min,
                        ),
                    )
                )
            except ValueError as exc:  # vet() refuses these first; never serve a path we could not build
                raise AllocationError(f"vGPU Allocate refused: pod {cand.pod.key}: {exc}") from None
            served[(cand.pod.uid, cand.container.name)] = tuple(ids)
            named[cand.pod.uid] = cand.pod
            log.info("Allocate %s -> %s[%s]", ids, cand.pod.key, cand.container.name)
        self._served = served
        for pod in named.values():
            if self._pod_done(pod):
                self._patches.put(pod)
        return out

    def node_gpus(self) -> NodeGpus:
        """This node's GPUs and which are unhealthy now (discovery or the health board)."""
        _, health = self.board.snapshot()
        unhealthy: dict[str, str] = {}
        for g in self.gpus:
            h = health.get(g.uuid, GpuHealth(False, "no health reported"))
            if not g.healthy or not h.healthy:
                unhealthy[g.uuid] = h.reason or "unhealthy at discovery"
        return NodeGpus(node=self.node, gpus={g.uuid: g for g in self.gpus}, unhealthy=unhealthy)

    def vet(
        self,
        cand: Candidate,
        pods: list[PodRecord],
        view: KubeletView | None,
        served: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
    ) -> None:
        """vgpu.assignment_check on the candidate's whole pod, counting every assignment held on the node
        (`served`: what this process has served, with the containers of the request in progress)."""
        pod = cand.pod
        assert pod.assignment is not None
        check_assignment(
            pod.assignment,
            pod.spec,
            pod=pod.key,
            pod_uid=pod.uid,
            node=self.node_gpus(),
            held=holding(
                pods,
                node=self.node,
                kubelet=view,
                served=(self._served if served is None else served).keys(),
                exclude_uid=pod.uid,
            ),
            names=self.names,
            defaults=self.defaults,
        )

    def _match(
        self,
        ids: list[str],
        pods: list[PodRecord],
        view: KubeletView | None,
        served: Mapping[tuple[str, str], tuple[str, ...]],
    ) -> Candidate:
        """The container `ids` is for; NotVisible passes through (retried), every other refusal is final."""

        def vet(cand: Candidate) -> None:
            self.vet(cand, pods, view, served)

        try:
            return match(ids, pods, node=self.node, kubelet=view, served=served.keys(), vet=vet)
        except NotVisible:
            raise
        except AssignmentRefused as exc:
            log.warning("pod %s: assignment refused: %s", exc.pod, exc)
            raise AllocationError(f"vGPU Allocate refused: {exc}") from None
        except Mismatch as exc:
            numa = {g.uuid: g.numa for g in self.gpus}
            offer = offer_text(self._offers.get(len(ids)), ids, numa, exc.assigned)
            raise AllocationError(f"vGPU Allocate refused: {exc}; {offer}") from None
        except MatchError as exc:
            raise AllocationError(f"vGPU Allocate refused: {exc}") from None

    def _pod_done(self, pod: PodRecord) -> bool:
        assert pod.assignment is not None
        return all((pod.uid, c.name) in self._served for c in pod.assignment.containers if c.devices)

    # --- bind-phase bookkeeping ------------------------------------------------------------------

    def mark_allocated(self, pod: PodRecord) -> None:
        """bind-phase allocating → allocated; failures are logged (reconcile() retries them)."""
        try:
            self.pods.patch_pod_annotations(
                namespace=pod.namespace, name=pod.name, annotations={ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATED.value}
            )
        except Exception as exc:
            log.warning("pod %s: cannot set bind-phase allocated: %s", pod.key, exc)

    def reconcile(self) -> int:
        """After a restart (or periodically): pods whose GPU containers all hold devices in the kubelet but
        are still `allocating` are marked allocated; forget served entries of pods that are gone."""
        view = self.kubelet.view(resource=self.resource) if self.kubelet is not None else None
        pods = self.pods.list_node_pods(node=self.node)
        done = 0
        with self._lock:
            live = {p.uid for p in pods}
            for key in [k for k in self._served if k[0] not in live]:
                del self._served[key]
            for p in pods:
                if p.bind_phase != ann.BindPhase.ALLOCATING or p.assignment is None or p.assignment.node != self.node:
                    continue
                gpu_containers = [c.name for c in p.assignment.containers if c.devices]
                held = all(
                    (p.uid, n) in self._served or (view is not None and view.devices.get((p.key, n)))
                    for n in gpu_containers
                )
                if gpu_containers and held:
                    self.mark_allocated(p)
                    done += 1
        return done

    def _patch_loop(self) -> None:
        while True:
            pod = self._patches.get()
            try:
                if pod is None:
                    return
                self.mark_allocated(pod)
            finally:
                self._patches.task_done()

    def start(self) -> None:
        self._patcher = threading.Thread(target=self._patch_loop, name="bind-phase", daemon=True)
        self._patcher.start()

    def stop(self) -> None:
        if self._patcher is not None:
            self._patches.put(None)
            self._patcher.join(timeout=5)

    def drain(self) -> None:
        """Wait until queued bind-phase patches are written (tests, shutdown)."""
        if self._patcher is not None:
            self._patches.join()

    def served(self) -> Mapping[tuple[str, str], tuple[str, ...]]:
        with self._lock:
            return dict(self._served)
