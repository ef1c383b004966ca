"""Chaos for the device plugin: `vgpu-device-plugin` runs as its own process (fake NVML, eight H100s) against the
real kube-apiserver, reached only through tests/e2e/chaos_proxy.py, and talks real gRPC over Unix sockets to the
test kubelet (device_plugin.testing.kubelet).

- Killed mid-Allocate: the plugin's pod LIST inside an Allocate is held by the proxy and the plugin SIGKILLed
  while the kubelet waits for the answer; a second time while its bind-phase PATCH (after an answered Allocate)
  is held. A new process is started on the same folder; the kubelet admits the first pod again.
- Kubelet restarted: every socket in the folder removed and kubelet.sock recreated, as kubelet v1.34 does.

After each the invariants are checked on what the kubelet holds and the apiserver records: every pod served
exactly once (one "Allocate" log line across all plugin processes, a repeated Allocate refused), no replica
handed to two containers, no GPU over its memory, cores or split, every pod `allocated`. One summary line per
fault (pytest -s, or the CI log) gives the time to recover.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.nvml import real
from device_plugin.nvml.discovery import discover
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.kubelet import FakeKubelet
from device_plugin.testing.workload import PlacedPod, placed_pods, spec_containers
from tests.e2e.chaos_proxy import ChaosProxy, behind_proxy
from tests.e2e.controlplane import ControlPlane
from vgpu import annotations as ann
from vgpu.devices import GpuDevice

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "tests" / "data" / "nvml" / "h100x8.yaml"
SPLIT = 10
HELD_S = 30.0  # how long the proxy holds the request the kill must land inside (far longer than the test needs)


# The plugin is started by exec from a launcher that asks for SIGKILL when this process dies, not through
# ControlPlane.spawn: its preexec_fn makes subprocess fork() and run Python code in the child, and a fork of this
# process, which has gRPC threads (the test kubelet), sometimes hung the child before exec (gRPC's fork handlers).
# Without preexec_fn, subprocess uses vfork+exec, which runs no fork handlers.
_LAUNCH = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "  # 1 = PR_SET_PDEATHSIG
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


class PluginProcess:
    """`vgpu-device-plugin` as a child process logging to `log_path`; `kill` is SIGKILL, `stop` SIGTERM."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            self.popen = subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class PluginNode:
    """A Node object, a test kubelet on a temp folder, and the plugin as a process restartable on that folder."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.namespace = namespace
        self.core = client.CoreV1Api(cp.api_client())
        self.name = f"dpc-{uuid.uuid4().hex[:6]}"
        # Tainted: no scheduler in the shared session may bind another module's pending pods here (this test binds
        # its own pods directly, as the extender's Binding does, which taints do not stop).
        cp.add_node(
            self.name,
            {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(8 * SPLIT)},
            taints=[{"key": "kube-vgpu.e2e/device-plugin-chaos", "value": self.name, "effect": "NoSchedule"}],
        )
        self.dir = tempfile.mkdtemp(prefix="dpc")
        self.pr_socket = f"{self.dir}-pr.sock"
        self.kubelet = FakeKubelet(self.dir, self.pr_socket)
        self.kubelet.start()
        # The GPUs the plugin will discover from the same scenario (for placing pods the way the extender does).
        gpus, _ = discover(
            FakeNvml.from_file(SCENARIO), split_count=SPLIT, is_nvml_error=lambda e: isinstance(e, real.NVMLError)
        )
        self.gpus: tuple[GpuDevice, ...] = gpus
        self.kubeconfig = cp.write_kubeconfig("vgpu-device-plugin", groups=("system:masters",), name=self.name)
        self.proxy: ChaosProxy = behind_proxy(cp, self.name, self.kubeconfig)
        self.procs: list[PluginProcess] = []

    @property
    def proc(self) -> PluginProcess:
        return self.procs[-1]

    def start_plugin(self) -> None:
        """A new plugin process; returns once the kubelet has its registration (and so its socket)."""
        want, updates = len(self.kubelet.state.registrations) + 1, self.kubelet.state.device_updates
        argv = [
            sys.executable,
            "-m",
            "device_plugin.main",
            f"--node-name={self.name}",
            f"--plugin-dir={self.dir}",
            f"--pod-resources-socket={self.pr_socket}",
            f"--fake-nvml={SCENARIO}",
            f"--kubeconfig={self.kubeconfig}",
            f"--split-count={SPLIT}",
            "--watchdog=false",
            "--allocate-retry-s=1",
            "--reconcile-s=60",  # one reconciliation at start, then none while a fault is staged
        ]
        self.procs.append(PluginProcess(argv, self.cp.logs_dir / f"{self.name}-plugin-{len(self.procs) + 1}.log"))
        assert self.kubelet.wait(lambda: len(self.kubelet.state.registrations) >= want, timeout=60), self.proc.tail()
        assert self.kubelet.wait(lambda: self.kubelet.state.device_updates > updates, timeout=90), self.proc.tail()
        assert len(self.kubelet.state.devices) == 8 * SPLIT

    def kill_plugin(self) -> None:
        """SIGKILL: no graceful shutdown, as an OOM kill or a node-level crash."""
        self.proc.kill()

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        self.kubelet.stop()
        self.proxy.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- pods, as the extender leaves them: assignment + bind-phase allocating + bind-time, then the binding --

    def bind(self, p: PlacedPod, i: int) -> None:
        self.core.create_namespaced_pod(
            self.namespace, {"metadata": {"name": p.name}, "spec": {"containers": spec_containers(p.assignment)}}
        )
        self.core.patch_namespaced_pod(
            p.name,
            self.namespace,
            {
                "metadata": {
                    "annotations": {
                        ann.POD_ASSIGNMENT: ann.encode_assignment(p.assignment),
                        ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATING.value,
                        ann.POD_BIND_TIME: f"2026-01-01T00:00:{i:02d}Z",
                    }
                }
            },
        )
        self.core.create_namespaced_binding(
            self.namespace,
            {"metadata": {"name": p.name}, "target": {"apiVersion": "v1", "kind": "Node", "name": self.name}},
            _preload_content=False,
        )

    def key(self, p: PlacedPod) -> str:
        return f"{self.namespace}/{p.name}"

    def admit(self, p: PlacedPod) -> None:
        """The kubelet admits the pod; every container's answer must be its own assigned slice."""
        responses = self.kubelet.admit(self.key(p), [(c.name, len(c.devices)) for c in p.assignment.containers])
        for resp, c in zip(responses, p.assignment.containers, strict=True):
            assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in c.devices)
            assert resp.annotations["vgpu.io/pod"] == self.key(p)

    def phases(self) -> dict[str, str | None]:
        return {
            p.metadata.name: (p.metadata.annotations or {}).get(ann.POD_BIND_PHASE)
            for p in self.core.list_namespaced_pod(self.namespace).items
        }

    def wait_allocated(self, names: list[str], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            phases = self.phases()
            if all(phases.get(n) == ann.BindPhase.ALLOCATED.value for n in names):
                return
            time.sleep(0.1)
        raise AssertionError(f"not all allocated: { {n: phases.get(n) for n in names} }\n{self.proc.tail()}")

    def served_lines(self, p: PlacedPod) -> int:
        """ "Allocate ... -> ns/pod[container]" log lines across every plugin process this node has run."""
        pattern = re.compile(rf"Allocate \[.*\] -> {re.escape(self.key(p))}\[")
        return sum(len(pattern.findall(proc.log_path.read_text(errors="replace"))) for proc in self.procs)


def invariants(node: PluginNode, pods: list[PlacedPod]) -> dict[str, int]:
    """What the kubelet holds, checked against the assignments: a replica in one container at most, each
    container on its assigned GPUs, per GPU the held slices within memory, cores and split."""
    by_key = {node.key(p): p for p in pods}
    replicas: collections.Counter[str] = collections.Counter()
    per_gpu: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    wrong = 0
    with node.kubelet.state.cond:
        held = dict(node.kubelet.state.allocated)
    for (key, cname), ids in held.items():
        replicas.update(ids)
        c = next(c for c in by_key[key].assignment.containers if c.name == cname)
        wrong += sorted(i.split("::")[0] for i in ids) != sorted(d.uuid for d in c.devices)
        for d in c.devices:
            g = per_gpu[d.uuid]
            g[0], g[1], g[2] = g[0] + d.memory_mib, g[1] + d.cores, g[2] + 1
    gpus = {g.uuid: g for g in node.gpus}
    over = [u for u, (m, k, n) in per_gpu.items() if m > gpus[u].memory_mib or k > 100 or n > SPLIT]
    return {
        "containers": len(held),
        "double": sum(1 for n in replicas.values() if n > 1),
        "wrong": wrong,
        "over": len(over),
    }


def report(fault: str, node: PluginNode, pods: list[PlacedPod], recovered_s: float) -> None:
    stats = invariants(node, pods)
    once = [node.served_lines(p) for p in pods]
    print(
        f"\nCHAOS {fault}: {len(pods)} pods served, {stats['containers']} containers held, replicas handed out "
        f"twice {stats['double']}, over-commits {stats['over']}, served more than once {sum(n > 1 for n in once)}, "
        f"recovered in {recovered_s:.2f} s"
    )
    assert stats["double"] == 0 and stats["wrong"] == 0 and stats["over"] == 0, stats
    assert once == [len([c for c in p.assignment.containers if c.devices]) for p in pods], once
    assert stats["containers"] == sum(len(p.assignment.containers) for p in pods), stats


def assert_refused_again(node: PluginNode, p: PlacedPod) -> None:
    """An Allocate repeating a served container's request is refused: it was served, and holds its slice."""
    assert node.kubelet.stub is not None
    c = p.assignment.containers[0]
    ids = node.kubelet.state.allocated[(node.key(p), c.name)]
    with pytest.raises(grpc.RpcError) as info:
        node.kubelet.stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value


@pytest.fixture
def node(control_plane: ControlPlane, namespace: str) -> Iterator[PluginNode]:
    n = PluginNode(control_plane, namespace)
    try:
        n.start_plugin()
        yield n
    finally:
        n.close()


def one_container(node: PluginNode, n: int, seed: int) -> list[PlacedPod]:
    return placed_pods(node.gpus, n, seed, node=node.name, max_containers=1)


def test_plugin_killed_mid_allocate_serves_the_pod_exactly_once(node: PluginNode) -> None:
    pods = one_container(node, 6, seed=16)
    a, b, victim, patched, d, e = pods
    for i, p in enumerate(pods[:4]):  # d and e are bound later, so that no other pod waits for its Allocate
        node.bind(p, i)
    node.admit(a)
    node.admit(b)
    node.wait_allocated([a.name, b.name])

    # 1. The kubelet asks for the victim's preferred devices, then calls Allocate; the plugin's pod LIST inside
    #    that Allocate is held by the proxy, and the plugin is SIGKILLed while the kubelet waits for the answer.
    stub = node.kubelet.stub
    assert stub is not None
    c = victim.assignment.containers[0]
    with node.kubelet.state.cond:
        node.kubelet.state.known.append(node.key(victim))
        available = node.kubelet.available()
    pref = stub.GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=len(c.devices))
            ]
        ),
        timeout=10,
    )
    chosen = list(pref.container_responses[0].deviceIDs)
    assert sorted(i.split("::")[0] for i in chosen) == sorted(d.uuid for d in c.devices)
    held_before = node.proxy.count("delayed GET")
    node.proxy.delay("GET", HELD_S, "/pods")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            stub.Allocate,
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]),
            timeout=HELD_S,
        )
        deadline = time.monotonic() + 30
        while node.proxy.count("delayed GET") == held_before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert node.proxy.count("delayed GET") > held_before, "the Allocate never read the pods"
        assert not call.done(), "the Allocate answered before the kill"
        node.kill_plugin()
        killed = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            call.result()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    node.proxy.heal()
    # A real kubelet (v1.34 devicemanager/manager.go allocateContainerResources) restores its allocatedDevices
    # on an Allocate error and fails the admission; the pod's controller makes a new pod, scheduled anew. Here
    # the same pod is admitted again once the new process has registered: the stricter case for the plugin,
    # which must neither hold it served nor refuse it.
    node.start_plugin()
    registered = time.monotonic() - killed
    node.admit(victim)
    recovered = time.monotonic() - killed
    node.wait_allocated([victim.name])

    # 2. An answered Allocate whose bind-phase PATCH is held when the plugin is SIGKILLed: the kubelet holds the
    #    devices; the new process finds them in PodResources and marks the pod allocated at start.
    held_before = node.proxy.count("delayed PATCH")
    node.proxy.delay("PATCH", HELD_S, "/pods/")
    node.admit(patched)
    deadline = time.monotonic() + 30
    while node.proxy.count("delayed PATCH") == held_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert node.proxy.count("delayed PATCH") > held_before, "the bind-phase PATCH never left"
    node.kill_plugin()
    killed = time.monotonic()
    node.proxy.heal()
    node.start_plugin()
    node.wait_allocated([patched.name])
    recovered_patch = time.monotonic() - killed
    assert_refused_again(node, patched)
    assert_refused_again(node, victim)

    # New pods after both restarts get their own slices, never the ones held before.
    node.bind(d, 4)
    node.bind(e, 5)
    node.admit(d)
    node.admit(e)
    node.wait_allocated([p.name for p in pods])
    report("device plugin SIGKILLed inside an Allocate's pod LIST", node, pods, recovered)
    print(
        f"CHAOS the new plugin process registered {registered:.2f} s after the kill, the pod served {recovered:.2f} s"
    )
    print(f"CHAOS device plugin SIGKILLed with a bind-phase PATCH in flight: allocated {recovered_patch:.2f} s later")


def test_kubelet_restart_reregisters_and_keeps_served_slices(node: PluginNode) -> None:
    pods = one_container(node, 8, seed=61)
    for i, p in enumerate(pods):
        node.bind(p, i)
    for p in pods[:4]:
        node.admit(p)
    node.wait_allocated([p.name for p in pods[:4]])
    held = dict(node.kubelet.state.allocated)
    registrations, updates = len(node.kubelet.state.registrations), node.kubelet.state.device_updates
    t0 = time.monotonic()
    node.kubelet.restart()
    assert node.kubelet.wait(lambda: len(node.kubelet.state.registrations) > registrations, timeout=90)
    registered = time.monotonic() - t0
    assert node.kubelet.wait(lambda: node.kubelet.state.device_updates > updates, timeout=90)
    listed = time.monotonic() - t0
    assert len(node.kubelet.state.devices) == 8 * SPLIT
    assert node.proc.alive(), "the plugin exited on the kubelet restart"
    for p in pods[4:]:
        node.admit(p)
    node.wait_allocated([p.name for p in pods])
    assert {k: v for k, v in node.kubelet.state.allocated.items() if k in held} == held
    assert_refused_again(node, pods[0])
    report("kubelet restarted (sockets removed, kubelet.sock recreated)", node, pods, registered)
    print(f"CHAOS kubelet restart: re-registered {registered:.2f} s, ListAndWatch resumed {listed:.2f} s after it")
