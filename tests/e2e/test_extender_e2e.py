"""The real kube-scheduler calls our extender over HTTPS and binds through it (docs/extender.md).

The extender runs as its own process with the RBAC of deploy/manifests/extender.yaml; kube-scheduler
runs the shipped deploy/scheduler/kube-scheduler-config.yaml with only the URL and CA filled in.
Every check reads the truth back from the apiserver (pod annotations) and compares it with the
extender's own view (GET /state).
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import ssl
import time
import urllib.error
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.controlplane import ControlPlane
from tests.e2e.vgpu_stack import BIND_GRACE_S, GPU_MEM, SCHEDULER, SPLIT, Extender, extender_and_scheduler, gpu_nodes
from vgpu import annotations as ann


@pytest.fixture(scope="module")
def vgpu(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Extender]]:
    with extender_and_scheduler(control_plane) as ext:
        yield control_plane, ext


def _pod(name: str, selector: dict[str, str], limits: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": selector,
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest", "resources": {"limits": limits}}],
        },
    }


def _slice(mem_pct: int, cores: int) -> dict[str, str]:
    return {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": str(mem_pct), "nvidia.com/gpucores": str(cores)}


def _wait_settled(core: client.CoreV1Api, namespace: str, names: list[str], timeout: float = 120) -> dict[str, Any]:
    """Wait until every pod is bound or reported unschedulable and the bound set has been stable for 3 s.

    Stability matters: a pod whose bind lost a race is retried by kube-scheduler and may still land."""
    deadline = time.monotonic() + timeout
    last: tuple[frozenset[str], float] = (frozenset(), 0.0)
    while True:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names}
        bound = frozenset(n for n, p in pods.items() if p.spec.node_name)
        failed = {
            e.involved_object.name
            for e in core.list_namespaced_event(namespace).items
            if e.reason == "FailedScheduling"
        }
        pending = [n for n in pods if n not in bound]
        now = time.monotonic()
        if bound != last[0]:
            last = (bound, now)
        if len(pods) == len(names) and all(n in failed for n in pending) and now - last[1] >= 3:
            return pods
        if now > deadline:
            raise TimeoutError(f"{len(pending)} pods neither bound nor reported unschedulable: {pending[:10]}")
        time.sleep(0.5)


def _check_invariants(pods: dict[str, Any], ext: Extender) -> dict[str, int]:
    """No GPU over memory/cores/split; annotations and bindings agree; the extender's state equals them."""
    per_gpu: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    bound = 0
    for name, p in pods.items():
        a_raw = (p.metadata.annotations or {}).get(ann.POD_ASSIGNMENT)
        if p.spec.node_name:
            bound += 1
            assert a_raw, f"{name} is bound to {p.spec.node_name} without an assignment"
            a = ann.decode_assignment(a_raw)
            assert a.node == p.spec.node_name, f"{name}: assignment on {a.node}, bound to {p.spec.node_name}"
            for d in a.slices():
                g = per_gpu[d.uuid]
                g[0] += d.memory_mib
                g[1] += d.cores
                g[2] += 1
    for uuid_, (mem, cores, sharers) in per_gpu.items():
        assert mem <= GPU_MEM and cores <= 100 and sharers <= SPLIT, (
            f"{uuid_} over-committed: {mem} MiB, {cores} %, {sharers}"
        )
    view = ext.get("/state")
    mine = {
        x["pod"].split("/", 1)[1]: x["assignment"]
        for x in view["allocations"]
        if x["pod"].split("/", 1)[0] == next(iter(pods.values())).metadata.namespace
    }
    from_api = {n: json.loads(p.metadata.annotations[ann.POD_ASSIGNMENT]) for n, p in pods.items() if p.spec.node_name}
    for n, a in from_api.items():
        assert n in mine, f"extender lost {n}"
        got = [(d["uuid"], d["memoryMiB"], d["cores"]) for c in mine[n]["containers"] for d in c["devices"]]
        want = [(d["uuid"], d["memoryMiB"], d["cores"]) for c in a["containers"] for d in c["devices"]]
        assert got == want, f"{n}: extender holds {got}, apiserver says {want}"
    # A pod bound after `pods` was listed (kube-scheduler retries a pending pod when a failed bind frees room) is in
    # /state but unbound in `pods`: judge what the extender holds against a list taken after /state was read.
    namespace = next(iter(pods.values())).metadata.namespace
    core = client.CoreV1Api(ext.cp.api_client())
    bound_now = {p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.spec.node_name}
    extra = set(mine) - bound_now
    assert not extra, f"extender holds slices for pods the apiserver has not bound: {sorted(extra)}"
    return {
        "bound": bound,
        "gpus_used": len(per_gpu),
        "max_sharers": max((s for _, _, s in per_gpu.values()), default=0),
    }


def test_fractional_pods_follow_binpack_and_spread(vgpu: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, _ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:5]
    selector = gpu_nodes(cp, f"bp-{tag}", 2, 2)
    binpack = {ann.POD_NODE_POLICY: "binpack"}
    core.create_namespaced_pod(namespace, _pod("first", selector, _slice(25, 25), annotations=binpack))
    first = cp.wait_for_pod("first", namespace)
    core.create_namespaced_pod(namespace, _pod("second", selector, _slice(25, 25), annotations=binpack))
    second = cp.wait_for_pod("second", namespace)
    a1 = ann.decode_assignment(first.metadata.annotations[ann.POD_ASSIGNMENT])
    a2 = ann.decode_assignment(second.metadata.annotations[ann.POD_ASSIGNMENT])
    assert second.spec.node_name == first.spec.node_name  # binpack: the fuller node
    assert a2.slices()[0].uuid == a1.slices()[0].uuid  # ... and the fuller GPU
    assert a2.slices()[0].memory_mib == GPU_MEM // 4 and a2.slices()[0].cores == 25
    assert second.metadata.annotations[ann.POD_BIND_PHASE] == "allocating"
    spread = _pod("third", selector, _slice(25, 25), annotations={ann.POD_NODE_POLICY: "spread"})
    core.create_namespaced_pod(namespace, spread)
    third = cp.wait_for_pod("third", namespace)
    assert third.spec.node_name != first.spec.node_name
    print(
        f"binpack: first+second on {first.spec.node_name} GPU {a1.slices()[0].index}; spread: third on {third.spec.node_name}"
    )


def test_pod_that_fits_nowhere_stays_pending_with_per_node_reasons(
    vgpu: tuple[ControlPlane, Extender], namespace: str
) -> None:
    cp, _ = vgpu
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, f"nf-{uuid.uuid4().hex[:5]}", 2, 2)
    core.create_namespaced_pod(
        namespace, _pod("huge", selector, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000"})
    )
    # The first attempt may come before kube-scheduler has the nodes' status (they were just made): "Insufficient
    # nvidia.com/gpu" from its own filter, the extender never asked. The status update requeues the pod; wait for the
    # event that carries the extender's reasons.
    deadline = time.monotonic() + 90
    messages: list[str] = []
    while time.monotonic() < deadline and not any("card too small" in m for m in messages):
        messages = [e.message or "" for e in cp.pod_events("huge", namespace) if e.reason == "FailedScheduling"]
        time.sleep(0.5)
    assert messages, "no FailedScheduling event"
    reason = next((m for m in reversed(messages) if "card too small" in m), messages[-1])
    assert "0/" in reason and "card too small" in reason and "container 'vllm'" in reason, messages
    assert not core.read_namespaced_pod("huge", namespace).spec.node_name
    print(f"FailedScheduling: {reason}")


def _burst(core: client.CoreV1Api, namespace: str, selector: dict[str, str], count: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    shapes = [(10, 10), (20, 20), (25, 30), (30, 40), (40, 50), (50, 50)]
    roles = ["prefill", "decode", "decode", None]
    names = []
    bodies = []
    for i in range(count):
        mem, cores = rng.choice(shapes)
        role = rng.choice(roles)
        labels = {"llm-d.ai/model": f"m{i % 4}"} | ({"llm-d.ai/role": role} if role else {})
        names.append(f"p{i:03d}")
        bodies.append(_pod(names[-1], selector, _slice(mem, cores), labels=labels))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: core.create_namespaced_pod(namespace, b), bodies))
    return names


def test_200_pods_on_20_nodes_never_overcommit(vgpu: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, f"burst-{uuid.uuid4().hex[:5]}", 20, 4)
    t0 = time.monotonic()
    names = _burst(core, namespace, selector, 200, seed=1)
    pods = _wait_settled(core, namespace, names, timeout=180)
    took = time.monotonic() - t0
    stats = _check_invariants(pods, ext)
    assert stats["bound"] >= 150, stats  # the mix needs ~62 of 80 GPUs
    print(
        f"200 pods / 20 nodes x 4 GPUs: {stats['bound']} bound on {stats['gpus_used']} GPUs, max {stats['max_sharers']} sharers, {took:.1f} s; invariants hold"
    )


def test_extender_killed_mid_burst_recovers_exact_state(vgpu: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, f"crash-{uuid.uuid4().hex[:5]}", 10, 4)
    # The burst is created on a worker thread while this one waits for the 30th bind, so the kill lands mid-burst:
    # created first and polled after, a loaded machine had bound all 100 before the kill ("killed at 100/100").
    with concurrent.futures.ThreadPoolExecutor(1) as creator:
        creating = creator.submit(_burst, core, namespace, selector, 100, 2)
        deadline = time.monotonic() + 60
        while sum(1 for p in core.list_namespaced_pod(namespace).items if p.spec.node_name) < 30:
            assert time.monotonic() < deadline, "burst did not start binding"
            if creating.done():
                creating.result()  # a failed create, raised here
            time.sleep(0.1)
        ext.kill()
        bound_at_kill = sum(1 for p in core.list_namespaced_pod(namespace).items if p.spec.node_name)
        names = creating.result()
    time.sleep(2)  # kube-scheduler sees connection refused meanwhile and backs off
    ext.start()
    pods = _wait_settled(core, namespace, names, timeout=180)
    time.sleep(BIND_GRACE_S + 2)  # reservations of binds cut short by the kill expire after the grace
    pods = _wait_settled(core, namespace, names, timeout=60)
    stats = _check_invariants(pods, ext)
    stuck = [
        n
        for n, p in pods.items()
        if not p.spec.node_name and (p.metadata.annotations or {}).get(ann.POD_BIND_PHASE) == "allocating"
    ]
    assert not stuck, f"pods left with a stale reservation: {stuck}"
    assert stats["bound"] >= 90, stats
    print(f"killed at {bound_at_kill}/100 bound, restarted; now {stats['bound']} bound, state equals annotations")


def test_deleted_pod_frees_its_slice(vgpu: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, f"del-{uuid.uuid4().hex[:5]}", 1, 1)
    core.create_namespaced_pod(namespace, _pod("holder", selector, _slice(100, 100)))
    holder = cp.wait_for_pod("holder", namespace)
    uuid_ = ann.decode_assignment(holder.metadata.annotations[ann.POD_ASSIGNMENT]).slices()[0].uuid
    core.create_namespaced_pod(namespace, _pod("waiter", selector, _slice(60, 60)))
    time.sleep(3)
    assert not core.read_namespaced_pod("waiter", namespace).spec.node_name
    cp.delete_pod("holder", namespace)
    waiter = cp.wait_for_pod("waiter", namespace, timeout=90)
    assert ann.decode_assignment(waiter.metadata.annotations[ann.POD_ASSIGNMENT]).slices()[0].uuid == uuid_
    held = [x for x in ext.get("/state")["allocations"] if x["pod"] == f"{namespace}/holder"]
    assert held == []
    # The extender nudged the pod it had rejected once it freed the slice (docs/extender.md, "Requeue"), so the
    # retry does not hinge on kube-scheduler seeing the deletion after the extender did.
    cp.wait_for_pod(
        "waiter", namespace, timeout=60, condition=lambda p: ann.POD_REQUEUE in (p.metadata.annotations or {})
    )


def test_capacity_freed_without_a_cluster_event_requeues_the_waiter(
    vgpu: tuple[ControlPlane, Extender], namespace: str
) -> None:
    """The extender frees a slice that kube-scheduler saw no event for: the worst case of the race where the extender
    applies a deletion after kube-scheduler already retried (and was rejected again). A reservation written by a
    bind that never created its Binding (a pod of another scheduler, never bound) expires after the bind grace
    inside the extender only; without the nudge the waiter would sit in kube-scheduler's unschedulable pool for
    `podMaxInUnschedulablePodsDuration` (5 min). The ghost's bind-time is forged far into the future: the
    reservation still ends one bind grace after the extender first saw it, whatever bind-time it claims."""
    cp, _ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, f"rq-{uuid.uuid4().hex[:5]}", 1, 1)
    node = f"{selector['kube-vgpu.e2e/group']}-00"
    gpu = f"GPU-{node}-0"
    ghost_slice = ann.DeviceSlice(gpu, 0, GPU_MEM, 100)
    assignment = ann.Assignment(node, (ann.ContainerAssignment("vllm", (ghost_slice,)),))
    grace = BIND_GRACE_S  # the e2e extender's --bind-grace-seconds
    expires_in = grace  # from when the extender first saw it: the far-future bind-time below does not count
    ghost = _pod("ghost", selector, _slice(100, 100))
    ghost["spec"]["schedulerName"] = "nobody"  # kube-scheduler ignores it; it stays unbound
    ghost["metadata"]["annotations"] = {
        ann.POD_ASSIGNMENT: ann.encode_assignment(assignment),
        ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
        ann.POD_BIND_TIME: "9999999999",  # forged: would pin the whole card forever if it were believed
    }
    started = time.monotonic()
    core.create_namespaced_pod(namespace, ghost)
    deadline = time.monotonic() + 60
    while not any(x["pod"] == f"{namespace}/ghost" for x in _ext.get("/state")["allocations"]):
        assert time.monotonic() < deadline, "the extender never reserved the ghost's slice"
        time.sleep(0.1)
    core.create_namespaced_pod(namespace, _pod("waiter", selector, _slice(60, 60)))
    time.sleep(max(0.0, expires_in - 2 - (time.monotonic() - started)))
    # The reservation lasts until at least `started + grace` (the extender saw the ghost after it was created): a
    # read begun before then must find the waiter unbound. A loaded machine may get here later; then there is
    # nothing this read can prove, and the bind below still shows the slice was freed.
    read_at = time.monotonic()
    unbound = not core.read_namespaced_pod("waiter", namespace).spec.node_name
    if read_at - started < expires_in:
        assert unbound, "the waiter was bound while the ghost's slice was held"
    # Expired by the extender's reaper (every grace/4) or at the next /filter, then the nudge: bound well inside the
    # 5 minutes an unschedulable pod would otherwise wait (kube-scheduler's podMaxInUnschedulablePodsDuration; its
    # leftover flush runs every 30 s), whatever the forged bind-time says. 90 s leaves a loaded machine its time.
    waiter = cp.wait_for_pod("waiter", namespace, timeout=90)
    assert time.monotonic() - started < 120, "not freed: pinned by the forged bind-time?"
    cp.wait_for_pod(
        "waiter", namespace, timeout=60, condition=lambda p: ann.POD_REQUEUE in (p.metadata.annotations or {})
    )
    assert ann.decode_assignment(waiter.metadata.annotations[ann.POD_ASSIGNMENT]).slices()[0].uuid == gpu


def test_without_a_client_certificate_every_verb_is_refused(vgpu: tuple[ControlPlane, Extender]) -> None:
    """The extender's own CA signs kube-scheduler's certificate; a client that trusts the server but presents no
    certificate, or one from the cluster CA (any kubeconfig user's), gets no answer at all: the handshake fails."""
    cp, ext = vgpu
    bare = ssl.create_default_context(cadata=cp.ca.cert_pem.decode())
    other_ca = ssl.create_default_context(cadata=cp.ca.cert_pem.decode())
    other_ca.load_cert_chain(*cp.ca.issue_client_cert("vgpu-extender").write(cp.pki_dir, "not-the-scheduler"))
    body = {"PodName": "x", "PodNamespace": "default", "PodUID": "u", "Node": "n", "Pod": {}, "NodeNames": []}
    for ctx in (bare, other_ca):
        for verb in ("/filter", "/prioritize", "/bind", "/state"):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                ext.post(verb, body, ctx=ctx)
    assert ext.get("/state")["version"] == "v1"  # with kube-scheduler's certificate: answered


def test_bind_of_a_running_pod_changes_nothing(vgpu: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = vgpu
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, f"rebind-{uuid.uuid4().hex[:5]}", 2, 1)
    core.create_namespaced_pod(namespace, _pod("victim", selector, _slice(90, 90)))
    victim = cp.wait_for_pod("victim", namespace)
    other = next(n for n in (f"{selector['kube-vgpu.e2e/group']}-0{i}" for i in (0, 1)) if n != victim.spec.node_name)
    before = core.read_namespaced_pod("victim", namespace)
    state_before = [x for x in ext.get("/state")["allocations"] if x["pod"] == f"{namespace}/victim"]
    reply = ext.post(
        "/bind", {"PodName": "victim", "PodNamespace": namespace, "PodUID": victim.metadata.uid, "Node": other}
    )
    assert "already bound to" in reply["Error"]
    after = core.read_namespaced_pod("victim", namespace)
    assert after.metadata.annotations == before.metadata.annotations and after.spec.node_name == victim.spec.node_name
    assert [x for x in ext.get("/state")["allocations"] if x["pod"] == f"{namespace}/victim"] == state_before != []
