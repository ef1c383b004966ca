"""Preemption of slices through the real kube-scheduler's own preemption path (docs/priority.md).

PriorityClasses batch-low (100), batch-mid (200) and online (100000); one node of two 80 GiB GPUs split 4 ways,
whose 8 `nvidia.com/gpu` replicas batch pods fill. An online pod that fits nowhere fails our /filter as
resolvable; kube-scheduler's DefaultPreemption dry-runs its in-tree filters (which count replicas only: it would
evict one pod), calls our preempt verb, evicts exactly the set we answer, nominates the node, and the online pod
binds through the extender onto the freed GPU. A watcher checks every 50 ms that no GPU is ever over-committed.
There is no kubelet: the test confirms each graceful deletion as a kubelet would (grace 0 once it is asked to
terminate), and nothing else.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.controlplane import ControlPlane
from tests.e2e.vgpu_stack import GPU_MEM, SCHEDULER, Extender, extender_and_scheduler
from vgpu import annotations as ann
from vgpu.devices import GpuDevice

SPLIT = 4
CLASSES = {"batch-low": 100, "batch-mid": 200, "online": 100000}


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Extender]]:
    sched = client.SchedulingV1Api(control_plane.api_client())
    for name, value in CLASSES.items():
        try:
            sched.create_priority_class({"metadata": {"name": name}, "value": value})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    with extender_and_scheduler(control_plane) as ext:
        yield control_plane, ext


def _node(cp: ControlPlane, name: str) -> dict[str, str]:
    """Two GPUs split 4 ways: 8 replicas of nvidia.com/gpu, as the device plugin would advertise them."""
    gpus = [GpuDevice(f"GPU-{name}-{i}", i, "H100-80GB", GPU_MEM, split_count=SPLIT, numa=0) for i in range(2)]
    selector = {"kube-vgpu.e2e/node": name}
    cp.add_node(
        name,
        {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(2 * SPLIT)},
        labels=selector,
        annotations={ann.NODE_INVENTORY: ann.encode_inventory(gpus)},
    )
    return selector


def _pod(
    name: str, selector: dict[str, str], mib: int, cls: str, *, gpu: str | None = None, **meta: Any
) -> dict[str, Any]:
    annotations = {"nvidia.com/use-gpuuuid": gpu} if gpu else {}
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, **meta},
        "spec": {
            "schedulerName": SCHEDULER,
            "priorityClassName": cls,
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "vllm/vllm-openai:latest", "resources": {"limits": limits}}],
        },
    }


class Watcher(threading.Thread):
    """Polls the namespace: records every pod ever seen bound, every deletion, and any GPU over its memory or
    sharer limit at any poll (terminating pods still hold their slices); confirms graceful deletions at once."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = core, namespace
        self.stop = threading.Event()
        self.overcommits: list[str] = []
        self.seen: set[str] = set()
        self.gone: list[str] = []
        self.polls = 0

    def run(self) -> None:
        while not self.stop.is_set():
            pods = self.core.list_namespaced_pod(self.namespace).items
            names = {p.metadata.name for p in pods}
            self.gone += [n for n in sorted(self.seen - names) if n not in self.gone]
            per_gpu: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
            for p in pods:
                self.seen.add(p.metadata.name)
                raw = (p.metadata.annotations or {}).get(ann.POD_ASSIGNMENT)
                if p.spec.node_name and raw:
                    for s in ann.decode_assignment(raw).slices():
                        per_gpu[s.uuid][0] += s.memory_mib
                        per_gpu[s.uuid][1] += 1
                if p.metadata.deletion_timestamp is not None:  # the kubelet's part: the container stopped
                    try:
                        self.core.delete_namespaced_pod(p.metadata.name, self.namespace, grace_period_seconds=0)
                    except client.ApiException as exc:
                        if exc.status != 404:
                            raise
            for gpu, (mib, sharers) in per_gpu.items():
                if mib > GPU_MEM or sharers > SPLIT:
                    self.overcommits.append(f"{gpu}: {mib} MiB, {sharers} sharers")
            self.polls += 1
            time.sleep(0.05)


def _fill(core: client.CoreV1Api, cp: ControlPlane, ns: str, sel: dict[str, str], node: str, **extra: Any) -> None:
    """GPU 0: x1 30000 (mid), x2 30000, x3 10000, x4 10000 (low, in creation order); GPU 1: y1..y4 20000 (mid)."""
    plan = [("x1", 30000, "batch-mid", 0), ("x2", 30000, "batch-low", 0), ("x3", 10000, "batch-low", 0)]
    plan += [("x4", 10000, "batch-low", 0)] + [(f"y{i}", 20000, "batch-mid", 1) for i in range(1, 5)]
    for name, mib, cls, gpu in plan:
        core.create_namespaced_pod(ns, _pod(name, sel, mib, cls, gpu=f"GPU-{node}-{gpu}", **extra.get(name, {})))
        cp.wait_for_pod(name, ns, timeout=60)
        time.sleep(1.1)  # creationTimestamp has 1 s resolution: "youngest" must be well defined


def _preempted_events(core: client.CoreV1Api, ns: str, want: set[str], timeout: float = 60) -> set[str]:
    """The pods with a Preempted event, once `want` are among them (or as they are after `timeout`): kube-scheduler
    sends its events from a goroutine of their own, so a victim's event may reach the apiserver after the preemptor
    was bound."""
    deadline = time.monotonic() + timeout
    while True:
        got = {e.involved_object.name for e in core.list_namespaced_event(ns).items if e.reason == "Preempted"}
        if want <= got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _online_and_late(
    core: client.CoreV1Api, cp: ControlPlane, ext: Extender, ns: str, sel: dict[str, str], node: str
) -> tuple[Watcher, Any]:
    watcher = Watcher(core, ns)
    watcher.start()
    try:
        core.create_namespaced_pod(ns, _pod("online", sel, 35000, "online"))
        # A batch pod of the victims' own priority arrives while the preemption is under way: it fits the freed
        # room on its own, but that room is the online pod's.
        time.sleep(0.3)
        core.create_namespaced_pod(ns, _pod("late", sel, 35000, "batch-low"))
        online = cp.wait_for_pod("online", ns, timeout=90)
        time.sleep(3)  # the late pod has had its retries on the freed capacity
    finally:
        watcher.stop.set()
        watcher.join(10)
    assert not watcher.overcommits, watcher.overcommits
    assert watcher.polls > 10
    late = core.read_namespaced_pod("late", ns)
    assert not late.spec.node_name, f"the lower-priority pod took {late.spec.node_name}"
    a = ann.decode_assignment(online.metadata.annotations[ann.POD_ASSIGNMENT])
    assert online.spec.node_name == node and [s.uuid for s in a.slices()] == [f"GPU-{node}-0"]
    assert a.slices()[0].memory_mib == 35000
    return watcher, online


def test_online_pod_evicts_exactly_the_extenders_victims(stack: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = stack
    core = client.CoreV1Api(cp.api_client())
    node = f"pre-{uuid.uuid4().hex[:5]}"
    sel = _node(cp, node)
    _fill(core, cp, namespace, sel, node)
    watcher, _ = _online_and_late(core, cp, ext, namespace, sel, node)
    # Our choice: the two cheapest pods that free 35000 MiB on one GPU are x2 and a 10000 pod (x3 + x4 free too
    # little; y pods are batch-mid); of x3/x4 the younger, x4. kube-scheduler's replica count alone evicts one.
    assert sorted(watcher.gone) == ["x2", "x4"]
    assert _preempted_events(core, namespace, {"x2", "x4"}) >= {"x2", "x4"}
    left = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
    assert left == {"x1", "x3", "y1", "y2", "y3", "y4", "online", "late"}
    assert 'vgpu_extender_preempt_calls_total{outcome="answered"}' in ext.probe("/metrics").decode()


def test_a_pdb_that_forbids_a_victim_steers_the_choice(stack: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = stack
    core = client.CoreV1Api(cp.api_client())
    node = f"pdb-{uuid.uuid4().hex[:5]}"
    sel = _node(cp, node)
    _fill(core, cp, namespace, sel, node, x2={"labels": {"app": "x2"}})
    pdb = {"metadata": {"name": "keep-x2"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x2"}}}}
    client.PolicyV1Api(cp.api_client()).create_namespaced_pod_disruption_budget(namespace, pdb)
    # No disruption controller runs here: the budget's status keeps disruptionsAllowed 0, as it would with x2 its
    # only pod and minAvailable 1.
    watcher, _ = _online_and_late(core, cp, ext, namespace, sel, node)
    # x2 spared: x1 (mid) + the younger 10000 pod, still on GPU 0 (two mid pods on GPU 1 cost more).
    assert sorted(watcher.gone) == ["x1", "x4"]
