"""HAMi pods and cordoned GPUs through the real kube-scheduler and the extender as a process (docs/migrating-from-hami.md,
docs/annotations.md "Cordon a GPU").

A pod carrying only HAMi's annotations (`nvidia.com/use-gputype`, `nvidia.com/nouse-gpuuuid`, `nvidia.com/use-gpuuuid`)
lands only on a GPU HAMi would allow; a GPU the admin cordons (`vgpu.io/cordoned-gpus` on the Node) gets no new slice
while the pod already on it keeps it, and takes slices again once uncordoned. Every check reads the truth back from the
apiserver (the pods' assignments) and the extender's /state and /metrics.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.controlplane import ControlPlane
from tests.e2e.vgpu_stack import GPU_MEM, SCHEDULER, SPLIT, Extender, extender_and_scheduler
from vgpu import annotations as ann
from vgpu import hami
from vgpu.devices import GpuDevice

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def vgpu(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Extender]]:
    with extender_and_scheduler(control_plane, name="vgpu-extender-hami") as ext:
        yield control_plane, ext


def _uuid(tag: str, node: int, gpu: int) -> str:
    """A UUID shaped as nvidia-smi prints one (the cordon and HAMi's UUID keys accept only those)."""
    return f"GPU-{tag}{node:03d}{gpu:01d}-0000-4000-8000-{uuid.uuid4().hex[:12]}"


def _nodes(cp: ControlPlane, tag: str, models: list[str], gpus: int) -> tuple[dict[str, str], list[list[str]]]:
    """One node per model with `gpus` GPUs each; the nodeSelector and each node's GPU UUIDs."""
    selector = {"kube-vgpu.e2e/group": f"hami-{tag}"}
    uuids: list[list[str]] = []
    for n, model in enumerate(models):
        ids = [_uuid(tag, n, i) for i in range(gpus)]
        uuids.append(ids)
        inventory = [GpuDevice(u, i, model, GPU_MEM, split_count=SPLIT, numa=0) for i, u in enumerate(ids)]
        cp.add_node(
            f"hami-{tag}-{n}",
            {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(gpus * SPLIT)},
            labels=selector,
            annotations={ann.NODE_INVENTORY: ann.encode_inventory(inventory)},
        )
    return selector, uuids


def _hami_pod(name: str, selector: dict[str, str], annotations: dict[str, str], pct: int = 10) -> dict[str, Any]:
    """A HAMi pod as its users write it (HAMi's resource names and annotations), sent to our scheduler."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": str(pct), "nvidia.com/gpucores": str(pct)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": selector,
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest", "resources": {"limits": limits}}],
        },
    }


def _gpu_of(pod: Any) -> str:
    slices = ann.decode_assignment(pod.metadata.annotations[ann.POD_ASSIGNMENT]).slices()
    assert len(slices) == 1
    return slices[0].uuid


def _failed_scheduling(cp: ControlPlane, name: str, namespace: str, text: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in reversed(cp.pod_events(name, namespace)):
            if e.reason == "FailedScheduling" and text in (e.message or ""):
                return str(e.message)
        time.sleep(0.5)
    raise AssertionError(f"no FailedScheduling event of {name} mentioning {text!r}: {cp.pod_events(name, namespace)}")


def _metric(ext: Extender, name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` whose labels include `labels`, from the extender's /metrics."""
    text = ext.probe("/metrics").decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


def _until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_a_hami_pod_lands_only_where_hami_would_allow_it(vgpu: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, _ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:4]
    selector, (a100s, h100s) = _nodes(cp, tag, [A100, H100], 2)
    # use-gputype H100 (a substring of HAMi's type "NVIDIA-NVIDIA H100 80GB HBM3"), minus one H100 by UUID: only one
    # GPU of the four is allowed, though the binpack/spread policies alone would use the others too.
    only_one = {hami.USE_GPU_TYPE: "h100", hami.NOUSE_GPU_UUID: h100s[0], hami.GPU_POLICY: "spread"}
    names = [f"hami-{i}" for i in range(4)]
    for name in names:
        core.create_namespaced_pod(namespace, _hami_pod(name, selector, only_one))
    pods = [cp.wait_for_pod(name, namespace, timeout=60) for name in names]
    assert {_gpu_of(p) for p in pods} == {h100s[1]}, [_gpu_of(p) for p in pods]
    # use-gpuuuid pins to a listed GPU (and HAMi then ignores nouse-gpuuuid).
    pinned = {hami.USE_GPU_UUID: f"{a100s[1]},GPU-00000000-0000-0000-0000-000000000000", hami.NOUSE_GPU_UUID: a100s[1]}
    core.create_namespaced_pod(namespace, _hami_pod("pinned", selector, pinned))
    assert _gpu_of(cp.wait_for_pod("pinned", namespace, timeout=60)) == a100s[1]
    # A pod nothing here allows stays pending, and the scheduler says why on every node.
    core.create_namespaced_pod(namespace, _hami_pod("nowhere", selector, {hami.USE_GPU_TYPE: "B200"}))
    msg = _failed_scheduling(cp, "nowhere", namespace, "GPU model not allowed")
    assert not core.read_namespaced_pod("nowhere", namespace).spec.node_name
    # A value HAMi does not define is refused with a reason naming the annotation, never guessed at.
    core.create_namespaced_pod(namespace, _hami_pod("bad", selector, {hami.NODE_POLICY: "Spread"}))
    bad = _failed_scheduling(cp, "bad", namespace, "hami.io/node-scheduler-policy='Spread' is invalid")
    print(f"HAMi: 4 pods on the one allowed GPU, pinned pod on {a100s[1]}; nowhere: {msg[:160]}; bad: {bad[:160]}")


def test_a_cordoned_gpu_gets_no_new_slice_while_the_running_pod_keeps_its_own(
    vgpu: tuple[ControlPlane, Extender], namespace: str
) -> None:
    cp, ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:4]
    selector, ((g0, g1),) = _nodes(cp, tag, [H100], 2)
    node = f"hami-{tag}-0"
    core.create_namespaced_pod(namespace, _hami_pod("running", selector, {hami.USE_GPU_UUID: g0}, pct=30))
    running = cp.wait_for_pod("running", namespace, timeout=60)
    assert _gpu_of(running) == g0
    # The admin cordons GPU 0 (a bad entry next to it is reported, not silently dropped).
    cordon = {"metadata": {"annotations": {ann.NODE_CORDONED_GPUS: f"{g0}, gpu0"}}}
    core.patch_node(node, cordon)
    _until("the extender to see the cordon", lambda: _metric(ext, "vgpu_gpu_cordoned", Hostname=node, UUID=g0) == 1)
    assert _metric(ext, "vgpu_gpu_cordoned", Hostname=node, UUID=g1) == 0
    assert _metric(ext, "vgpu_node_cordoned_gpus", Hostname=node) == 1
    assert _metric(ext, "vgpu_node_cordon_invalid_entries", Hostname=node, problem="malformed") == 1
    assert _metric(ext, "vgpu_node_cordon_invalid_entries", Hostname=node, problem="unknown") == 0
    state = next(n for n in ext.get("/state")["nodes"] if n["name"] == node)
    assert state["cordonedGpus"] == [g0]
    # New pods: every one goes to GPU 1, though spread alone would put some on the emptier GPU 0 ...
    names = [f"new-{i}" for i in range(3)]
    for name in names:
        core.create_namespaced_pod(namespace, _hami_pod(name, selector, {hami.GPU_POLICY: "spread"}, pct=20))
    assert {_gpu_of(cp.wait_for_pod(n, namespace, timeout=60)) for n in names} == {g1}
    # ... one that may only use GPU 0 waits, saying the GPU is cordoned ...
    core.create_namespaced_pod(namespace, _hami_pod("wants-g0", selector, {hami.USE_GPU_UUID: g0}))
    msg = _failed_scheduling(cp, "wants-g0", namespace, "GPU cordoned")
    # ... while the running pod keeps its slice: still bound there, in the apiserver and in the extender's books.
    running = core.read_namespaced_pod("running", namespace)
    assert running.spec.node_name == node and _gpu_of(running) == g0 and running.metadata.deletion_timestamp is None
    held = [x for x in ext.get("/state")["allocations"] if x["pod"] == f"{namespace}/running"]
    assert [d["uuid"] for d in held[0]["assignment"]["containers"][0]["devices"]] == [g0]
    # Uncordoned: the waiting pod lands on GPU 0 (the node change makes the extender nudge it).
    core.patch_node(node, {"metadata": {"annotations": {ann.NODE_CORDONED_GPUS: None}}})
    assert _gpu_of(cp.wait_for_pod("wants-g0", namespace, timeout=60)) == g0
    print(f"cordon: 3 new pods all on GPU 1, running pod kept GPU 0; pending while cordoned: {msg[:160]}")
