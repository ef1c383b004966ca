"""Smoke test of the real control plane: the default kube-scheduler binds what fits and reports what does not."""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e


def _pod(name: str, cpu: str, selector: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "containers": [{"name": "main", "image": "registry.invalid/pause:1",
                            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
        },
    }


def test_default_scheduler_binds_and_reports(control_plane: ControlPlane, namespace: str) -> None:
    from kubernetes import client

    cp = control_plane
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:6]
    selector = {"kube-vgpu.e2e/smoke": tag}  # keeps nodes other tests add out of this test
    nodes = [f"smoke-{tag}-{i}" for i in range(2)]
    for n in nodes:
        node = cp.add_node(n, {"cpu": "4", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "8"}, labels=selector)
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
    cp.start_scheduler()

    t0 = time.monotonic()
    core.create_namespaced_pod(namespace, _pod("fits", "500m", selector))
    bound = cp.wait_for_pod("fits", namespace, timeout=30)
    print(f"pod fits bound to {bound.spec.node_name} in {time.monotonic() - t0:.2f}s")
    assert bound.spec.node_name in nodes

    core.create_namespaced_pod(namespace, _pod("too-big", "64", selector))

    def failed_scheduling() -> list:
        return [e for e in cp.pod_events("too-big", namespace) if e.reason == "FailedScheduling"]

    deadline = time.monotonic() + 30
    while not failed_scheduling() and time.monotonic() < deadline:
        time.sleep(0.2)
    events = failed_scheduling()
    assert events, "no FailedScheduling event for pod too-big"
    print(f"FailedScheduling: {events[-1].message}")
    assert "Insufficient cpu" in events[-1].message
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending" and not pod.spec.node_name

    for name in ("fits", "too-big"):
        cp.delete_pod(name, namespace)
    for n in nodes:
        core.delete_node(n)
    cp.stop_scheduler()


def test_teardown_leaves_no_process(control_plane: ControlPlane) -> None:
    """A second, independent control plane comes up next to the session one and is stopped completely."""
    with ControlPlane(bin_dir=control_plane.bin_dir, etcd_bin=control_plane.etcd_bin,
                      keep_workdir=False) as cp:
        cp.start_scheduler()
        pids = [p.pid for p in cp.processes]
        workdir = cp.workdir
        assert cp.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    for pid in pids:
        assert subprocess.run(["pgrep", "-g", str(pid)], capture_output=True).returncode == 1, pid
    left = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True).stdout
    assert left == "", f"processes left behind: {left}"
    assert not workdir.exists()
