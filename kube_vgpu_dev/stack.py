"""Our scheduling stack on a ControlPlane: the extender process, the shipped scheduler profile, GPU nodes.

Shared by the extender e2e tests (through tests/e2e/vgpu_stack.py) and `python -m kube_vgpu_dev up --with-vgpu`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import yaml
from kubernetes import client

from kube_vgpu_dev.binaries import REPO_ROOT
from kube_vgpu_dev.controlplane import ControlPlane
from kube_vgpu_dev.pki import CertificateAuthority
from kube_vgpu_dev.processes import ManagedProcess, free_port
from vgpu import annotations as ann
from vgpu.devices import GpuDevice

ROOT = REPO_ROOT
GPU_MEM = 81920
SPLIT = 10
SCHEDULER = "vgpu-scheduler"
BIND_GRACE_S = 8.0


def inventory(node: str, gpus: int) -> str:
    return ann.encode_inventory(
        [
            GpuDevice(uuid=f"GPU-{node}-{i}", index=i, model="H100-80GB", memory_mib=GPU_MEM, split_count=SPLIT, numa=0)
            for i in range(gpus)
        ]
    )


def _created(call: Any, *args: Any) -> None:
    """Create an object; one left by an earlier test of the session is fine."""
    try:
        call(*args)
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def extender_rbac(cp: ControlPlane) -> None:
    """The extender's ClusterRole and its leader-election Role from deploy/manifests/extender.yaml, bound to the
    user `vgpu-extender` (the kubeconfig's client certificate)."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/extender.yaml").read_text()) if d]
    rbac_api = client.RbacAuthorizationV1Api(cp.api_client())
    user = [{"kind": "User", "name": "vgpu-extender", "apiGroup": "rbac.authorization.k8s.io"}]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
    _created(rbac_api.create_cluster_role, role)
    binding = {"metadata": {"name": "vgpu-extender-e2e"}, "roleRef": ref, "subjects": user}
    _created(rbac_api.create_cluster_role_binding, binding)
    lease_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].startswith("vgpu-extender"))
    ns = lease_role["metadata"]["namespace"]
    _created(rbac_api.create_namespaced_role, ns, lease_role)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": lease_role["metadata"]["name"]}
    binding = {"metadata": {"name": "vgpu-extender-e2e", "namespace": ns}, "roleRef": ref, "subjects": user}
    _created(rbac_api.create_namespaced_role_binding, ns, binding)


def lease_rbac(cp: ControlPlane, lease: str) -> None:
    """The shipped leader-election Role of deploy/manifests/extender.yaml for another Lease name (tests run each
    election on a fresh Lease): the same rules with resourceNames [lease], bound to the user `vgpu-extender`. The
    shipped Role names only the default Lease, vgpu-extender."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/extender.yaml").read_text()) if d]
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "vgpu-extender-leader-election")
    ns = role["metadata"]["namespace"]
    for rule in role["rules"]:
        if "resourceNames" in rule:
            rule["resourceNames"] = [lease]
    role["metadata"] = {"name": f"{lease}-leader-election", "namespace": ns}
    rbac_api = client.RbacAuthorizationV1Api(cp.api_client())
    _created(rbac_api.create_namespaced_role, ns, role)
    user = [{"kind": "User", "name": "vgpu-extender", "apiGroup": "rbac.authorization.k8s.io"}]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    binding = {"metadata": {"name": role["metadata"]["name"], "namespace": ns}, "roleRef": ref, "subjects": user}
    _created(rbac_api.create_namespaced_role_binding, ns, binding)


class Extender:
    """`vgpu-extender --source kube` as a managed process, restartable mid-test; `args` are added to its flags
    (e.g. --leader-elect), `name` tells replicas apart in the logs.

    It runs as shipped: mutual TLS with its own client CA (`client_ca`, not the cluster's, so no other cluster
    identity can call it), whose certificate `client_cert` is what kube-scheduler presents (scheduler_config);
    `get` presents it too. /state is on (--enable-state) for the tests' comparisons, behind the same mTLS.
    /healthz, /readyz and /metrics are on the plain `--health-port` (`health_url`), where kubelet probes go.
    Every file it writes is named after `name`, so replicas never overwrite each other's certificates."""

    def __init__(self, cp: ControlPlane, *, name: str = "vgpu-extender", args: tuple[str, ...] = ()) -> None:
        self.cp = cp
        self.name = name
        self.args = args
        extender_rbac(cp)
        self.kubeconfig = cp.write_kubeconfig("vgpu-extender", name=name)
        self.cert, self.key = cp.issue_server_cert(name)
        self.client_ca = CertificateAuthority(f"{name}-client-ca")
        self.client_ca_file, _ = self.client_ca.keypair.write(cp.pki_dir, f"{name}-client-ca")
        self.client_cert = self.client_ca.issue_client_cert("vgpu-scheduler").write(cp.pki_dir, f"{name}-client")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.health_port = free_port()
        self.health_url = f"http://127.0.0.1:{self.health_port}"
        self.ctx = ssl.create_default_context(cadata=cp.ca.cert_pem.decode())
        self.ctx.load_cert_chain(*self.client_cert)
        self.proc: ManagedProcess | None = None
        self.starts = 0

    def start(self, *, ready_timeout_s: float = 120.0) -> None:
        """Start the process and wait until /readyz says ok (its state synced from the apiserver). 120 s: late in a
        session the cluster holds every earlier module's nodes and pods for its first lists, on a loaded machine; it
        returns as soon as the extender is ready, and a process that exits fails at once."""
        self.starts += 1
        argv = [
            sys.executable,
            "-m",
            "scheduler_extender.main",
            "--source",
            "kube",
            "--kubeconfig",
            str(self.kubeconfig),
            "--address",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--client-ca-file",
            str(self.client_ca_file),
            "--health-port",
            str(self.health_port),
            "--enable-state",
            f"--bind-grace-seconds={BIND_GRACE_S}",
            "--log-format",
            "json",
            *self.args,
        ]
        self.proc = self.cp.spawn(f"{self.name}-{self.starts}", argv, env={"PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            try:
                if self.probe("/readyz") == b"ok":
                    return
            except OSError:
                pass
            if not self.proc.alive():
                break
            time.sleep(0.05)
        raise RuntimeError(f"extender not ready:\n{self.proc.tail()}")

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, exactly like a crashed or OOM-killed pod."""
        assert self.proc is not None
        self.proc.popen.send_signal(signal.SIGKILL)
        self.proc.popen.wait(10)

    def post(self, path: str, body: dict[str, Any], *, ctx: ssl.SSLContext | None = None) -> Any:
        """POST as kube-scheduler does (with its client certificate unless `ctx` says otherwise)."""
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, context=ctx or self.ctx, timeout=5) as r:
            return json.loads(r.read())

    def probe(self, path: str) -> bytes:
        """GET on the plain health port, as a kubelet probe or Prometheus does (no client certificate)."""
        with urllib.request.urlopen(self.health_url + path, timeout=30) as r:  # a slow answer is not a failed one
            body: bytes = r.read()
        return body

    def get(self, path: str, *, raw: bool = False) -> Any:
        with urllib.request.urlopen(self.url + path, context=self.ctx, timeout=30) as r:
            body = r.read()
        return body if raw else json.loads(body)


def scheduler_config(cp: ControlPlane, ext: Extender) -> str:
    """deploy/scheduler/kube-scheduler-config.yaml with the extender's URL, its serving CA and the paths of the client
    certificate kube-scheduler presents (the shipped certFile/keyFile point into a mounted Secret), short backoffs."""
    config = yaml.safe_load((ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    config.pop("leaderElection", None)
    config["podInitialBackoffSeconds"] = 1
    config["podMaxBackoffSeconds"] = 2
    for e in config["extenders"]:
        e["urlPrefix"] = ext.url
        e["tlsConfig"]["caData"] = base64.b64encode(cp.ca.cert_pem).decode()
        assert {"certFile", "keyFile"} <= e["tlsConfig"].keys(), "the shipped config presents a client certificate"
        e["tlsConfig"]["certFile"], e["tlsConfig"]["keyFile"] = (str(p) for p in ext.client_cert)
    return yaml.safe_dump(config)


@contextlib.contextmanager
def extender_and_scheduler(cp: ControlPlane, *, name: str = "vgpu-extender") -> Iterator[Extender]:
    """An extender and kube-scheduler configured to call it, both stopped on exit: the stack most e2e modules share."""
    ext = Extender(cp, name=name)
    ext.start()
    cp.start_scheduler(scheduler_config(cp, ext))
    try:
        yield ext
    finally:
        cp.stop_scheduler()
        if ext.proc is not None:
            cp.stop_process(ext.proc)


def gpu_nodes(cp: ControlPlane, prefix: str, count: int, gpus: int) -> dict[str, str]:
    """Nodes carrying the device plugin's inventory annotation; returns the nodeSelector that picks them."""
    selector = {"kube-vgpu.e2e/group": prefix}
    for i in range(count):
        name = f"{prefix}-{i:02d}"
        cp.add_node(
            name,
            {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(gpus * SPLIT)},
            labels=selector,
            annotations={ann.NODE_INVENTORY: inventory(name, gpus)},
        )
    return selector
