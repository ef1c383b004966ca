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
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/pause:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
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
    # Stopped however the test ends: a default kube-scheduler left running binds the next modules' pods (those the
    # device plugin e2e creates before its own Binding) to whatever node fits.
    try:
        t0 = time.monotonic()
        core.create_namespaced_pod(namespace, _pod("fits", "500m", selector))
        bound = cp.wait_for_pod("fits", namespace, timeout=90)
        print(f"pod fits bound to {bound.spec.node_name} in {time.monotonic() - t0:.2f}s")
        assert bound.spec.node_name in nodes

        core.create_namespaced_pod(namespace, _pod("too-big", "64", selector))

        def failed_scheduling() -> list:
            return [e for e in cp.pod_events("too-big", namespace) if e.reason == "FailedScheduling"]

        deadline = time.monotonic() + 90
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
    finally:
        cp.stop_scheduler()


def test_teardown_leaves_no_process(control_plane: ControlPlane) -> None:
    """A second, independent control plane comes up next to the session one and is stopped completely."""
    with ControlPlane(bin_dir=control_plane.bin_dir, etcd_bin=control_plane.etcd_bin, keep_workdir=False) as cp:
        cp.start_scheduler()
        pids = [p.pid for p in cp.processes]
        workdir = cp.workdir
        assert cp.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    for pid in pids:
        assert subprocess.run(["pgrep", "-g", str(pid)], capture_output=True).returncode == 1, pid
    left = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True).stdout
    assert left == "", f"processes left behind: {left}"
    assert not workdir.exists()


class _Extender:
    """A minimal scheduler extender over HTTPS (stdlib): filter keeps every node, bind creates the Binding.

    It only proves the harness wiring (CA, serving cert, caData); the real extender lives elsewhere."""

    def __init__(self, cp: ControlPlane) -> None:
        import http.server
        import json
        import ssl
        import threading

        from kubernetes import client

        core = client.CoreV1Api(cp.api_client())
        calls: list[str] = []
        self.calls = calls

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                verb = self.path.rsplit("/", 1)[-1]
                calls.append(verb)
                if verb == "filter":
                    result = {"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""}
                else:  # bind
                    body = {
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {"name": args["PodName"], "namespace": args["PodNamespace"], "uid": args["PodUID"]},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
                    }
                    core.create_namespaced_binding(args["PodNamespace"], body, _preload_content=False)
                    result = {"Error": ""}
                data = json.dumps(result).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        crt, key = cp.issue_server_cert("smoke-extender")
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/extender"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_scheduler_calls_https_extender_with_cluster_ca(control_plane: ControlPlane, namespace: str) -> None:
    from kubernetes import client

    cp = control_plane
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:6]
    selector = {"kube-vgpu.e2e/ext": tag}
    node = f"ext-{tag}"
    cp.add_node(node, {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}, labels=selector)
    ext = _Extender(cp)
    try:
        cp.start_scheduler(f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
extenders:
- urlPrefix: {ext.url}
  filterVerb: filter
  bindVerb: bind
  nodeCacheCapable: true
  enableHTTPS: true
  tlsConfig:
    caData: {cp.ca.cert_b64}
  managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: false
""")
        pod = _pod("gpu", "100m", selector)
        pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
        core.create_namespaced_pod(namespace, pod)
        bound = cp.wait_for_pod("gpu", namespace, timeout=90)
        assert bound.spec.node_name == node
        assert ext.calls == ["filter", "bind"], ext.calls
        print(f"extender over HTTPS called: {ext.calls}")
    finally:
        cp.stop_scheduler()
        ext.close()
    cp.delete_pod("gpu", namespace)
    core.delete_node(node)


def test_kwok_runs_pods_and_completes_graceful_deletes(kwok: ControlPlane, namespace: str) -> None:
    from kubernetes import client

    cp = kwok
    core = client.CoreV1Api(cp.api_client())
    tag = uuid.uuid4().hex[:6]
    selector = {"kube-vgpu.e2e/kwok": tag}
    node = f"kwok-{tag}"
    cp.add_node(node, {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}, labels=selector, kwok=True)
    cp.start_scheduler()
    try:
        core.create_namespaced_pod(namespace, _pod("runs", "100m", selector))
        # KWOK has no readiness probe (start_kwok waits 1 s): on a loaded machine its first node list, then the pod's
        # stages, take a while; 90 s, as for anything controller-driven.
        pod = cp.wait_for_pod("runs", namespace, timeout=90, condition=lambda p: p.status.phase == "Running")
        assert pod.spec.node_name == node and pod.status.pod_ip
        t0 = time.monotonic()
        core.delete_namespaced_pod("runs", namespace)  # graceful: KWOK plays the kubelet's part
        while time.monotonic() - t0 < 90:
            if not core.list_namespaced_pod(namespace, field_selector="metadata.name=runs").items:
                break
            time.sleep(0.1)
        else:
            pytest.fail("graceful delete did not complete on a KWOK node")
        print(f"KWOK: pod Running on {node}; graceful delete completed in {time.monotonic() - t0:.2f}s")
    finally:
        cp.stop_scheduler()
    core.delete_node(node)
