"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler (and KWOK on demand).

There is no kubelet and no kube-controller-manager. Nodes are plain Node objects whose status (capacity,
allocatable, a Ready condition) is written through the ``/status`` subresource; pods are bound by the real
kube-scheduler (or by an extender's binder) and then simply stay bound. Consequences worth knowing:

* A pod bound to a node is only removed when deleted with ``grace_period_seconds=0`` (no kubelet ever
  confirms a graceful deletion); :meth:`ControlPlane.delete_pod` does that.
* Namespaces are not finalised on delete (no namespace controller); use fresh names instead of deleting.
* The ``ServiceAccount`` admission plugin is disabled by default, because no controller creates the
  ``default`` ServiceAccount of new namespaces; so is ``TaintNodesByCondition``, which would give every new
  Node a ``node.kubernetes.io/not-ready`` taint that only the node lifecycle controller removes.

Use it as a context manager::

    with ControlPlane() as cp:
        cp.add_node("n1", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"})
        cp.start_scheduler(config_yaml)
        core = kubernetes.client.CoreV1Api(cp.api_client())
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from kube_vgpu_dev import components
from kube_vgpu_dev.binaries import ensure_binaries, ensure_kwok, etcd_version
from kube_vgpu_dev.kubeconfig import kubeconfig_text
from kube_vgpu_dev.objects import ClusterObjects
from kube_vgpu_dev.pki import CertificateAuthority, ClusterPki, make_cluster_pki
from kube_vgpu_dev.processes import ControlPlaneError, ManagedProcess, free_port, http_ok, insecure_tls

_live: set[ControlPlane] = set()
SYSTEM_NAMESPACES = ("kube-system", "default")


@atexit.register
def _stop_all() -> None:
    for cp in list(_live):
        with contextlib.suppress(Exception):
            cp.stop()


class ControlPlane(ClusterObjects):
    """etcd + kube-apiserver (+ kube-scheduler on demand) on 127.0.0.1, torn down on exit.

    Attributes after :meth:`start`: ``workdir`` (temp dir with certs, kubeconfigs, ``logs/``), ``server``
    (``https://127.0.0.1:<port>``), ``ca`` (:class:`CertificateAuthority`), ``ca_file``,
    ``admin_kubeconfig``, ``scheduler_kubeconfig``, ``bin_dir``, ``etcd_url``, ``scheduler`` (the running
    :class:`ManagedProcess` or ``None``). The Node/Pod helpers and clients come from :class:`ClusterObjects`.
    """

    def __init__(
        self,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        etcd_bin: str | os.PathLike[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        keep_workdir: bool | None = None,
        verbosity: int = 2,
        disable_admission_plugins: Sequence[str] = ("ServiceAccount", "TaintNodesByCondition"),
        extra_apiserver_args: Sequence[str] = (),
        start_timeout: float = 90.0,
    ) -> None:
        super().__init__()
        self._bin_dir_arg = bin_dir
        self._etcd_arg = etcd_bin
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kube-vgpu-cp-"))
        if keep_workdir is None:
            keep_workdir = os.environ.get("KUBE_VGPU_KEEP_E2E_DIR") == "1"
        self.keep_workdir = keep_workdir
        self.verbosity = verbosity
        self.disable_admission_plugins = list(disable_admission_plugins)
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.start_timeout = start_timeout
        self.logs_dir = self.workdir / "logs"
        self.pki_dir = self.workdir / "pki"
        self.processes: list[ManagedProcess] = []
        self.scheduler: ManagedProcess | None = None
        self.kwok: ManagedProcess | None = None
        self._scheduler_configs = 0
        self._lock = threading.Lock()
        self.started = False

    # ---- lifecycle

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            print(self.dump_logs(), file=sys.stderr)
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd and kube-apiserver, wait for /readyz, write the kubeconfigs. Returns self."""
        _live.add(self)
        try:
            if self._bin_dir_arg and self._etcd_arg:
                self.bin_dir, self.etcd_bin = Path(self._bin_dir_arg), Path(self._etcd_arg)
            else:
                bd, etcd = ensure_binaries()
                self.bin_dir = Path(self._bin_dir_arg) if self._bin_dir_arg else bd
                self.etcd_bin = Path(self._etcd_arg) if self._etcd_arg else etcd
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            self._make_pki()
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfigs()
        except BaseException:
            print(self.dump_logs(), file=sys.stderr)
            self.stop()
            raise
        self.started = True
        return self

    def stop(self) -> None:
        """Stop every process (scheduler and spawned ones first, etcd last) and remove the workdir."""
        self.close_clients()
        for p in reversed(self.processes):
            p.stop()
        leftovers = [p for p in self.processes if p.group_alive()]
        self.processes.clear()
        self.scheduler = None
        self.kwok = None
        _live.discard(self)
        self.started = False
        if leftovers:
            raise ControlPlaneError(f"processes survived teardown: {[(p.name, p.pid) for p in leftovers]}")
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> ManagedProcess:
        """Start any process (e.g. the extender) with its log in ``logs/<name>.log`` and teardown on stop.

        The child gets SIGKILL when the *thread* that spawned it exits (``PR_SET_PDEATHSIG``), so spawn from
        the test's main thread, not from a short-lived worker thread."""
        p = ManagedProcess(name, argv, self.logs_dir / f"{name}.log", env=env, cwd=cwd)
        with self._lock:
            self.processes.append(p)
        return p

    def stop_process(self, proc: ManagedProcess, timeout: float = 10.0) -> int | None:
        """Stop one process started by :meth:`spawn` (or the scheduler) now; it is forgotten afterwards."""
        code = proc.stop(timeout)
        with self._lock:
            if proc in self.processes:
                self.processes.remove(proc)
        if proc is self.scheduler:
            self.scheduler = None
        if proc is self.kwok:
            self.kwok = None
        return code

    def dump_logs(self, lines: int = 60) -> str:
        """The last *lines* lines of every process log, for failure reports."""
        out = [f"==== control plane workdir: {self.workdir}"]
        for log in sorted(self.logs_dir.glob("*.log")) if self.logs_dir.exists() else []:
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"---- {log.name} (last {len(text)} lines)")
            out.extend(text)
        return "\n".join(out)

    # ---- certificates

    def _make_pki(self) -> None:
        self.pki: ClusterPki = make_cluster_pki(self.pki_dir)
        self.ca: CertificateAuthority = self.pki.ca
        self.ca_file = self.pki.ca_file
        self.admin_client = self.pki.admin_client
        self.admin_cert, self.admin_key = self.pki.admin_cert, self.pki.admin_key
        self.front_proxy_ca = self.pki.front_proxy_ca

    def issue_server_cert(
        self, name: str, dns_names: Iterable[str] = ("localhost",), ip_addresses: Iterable[str] = ("127.0.0.1",)
    ) -> tuple[Path, Path]:
        """A serving cert from this cluster's CA (e.g. for the extender or webhook); returns (crt, key) paths."""
        return self.ca.issue_server_cert(name, dns_names, ip_addresses).write(self.pki_dir, name)

    def write_kubeconfig(self, user: str, groups: Sequence[str] = (), name: str | None = None) -> Path:
        """A kubeconfig for user *user* in *groups* (client cert from the CA). Grant it RBAC yourself."""
        path = self.workdir / f"{name or re.sub(r'[^A-Za-z0-9_.-]', '_', user)}.kubeconfig"
        path.write_text(kubeconfig_text(self.server, self.ca.cert_pem, self.ca.issue_client_cert(user, groups), user))
        path.chmod(0o600)
        return path

    def _write_kubeconfigs(self) -> None:
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self.admin_kubeconfig.write_text(
            kubeconfig_text(self.server, self.ca.cert_pem, self.admin_client, "kube-vgpu-admin")
        )
        self.admin_kubeconfig.chmod(0o600)
        self.scheduler_kubeconfig = self.write_kubeconfig("system:kube-scheduler", name="scheduler")

    # ---- etcd and apiserver

    def _start_etcd(self) -> None:
        self.etcd_url = f"http://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        no_fsync = etcd_version(self.etcd_bin) >= (3, 5, 0)
        proc = self.spawn(
            "etcd", components.etcd_argv(self.etcd_bin, self.workdir / "etcd", self.etcd_url, peer, no_fsync=no_fsync)
        )
        proc.wait_ready(
            "etcd", lambda: http_ok(f"{self.etcd_url}/health", expect=b'"health":"true"'), self.start_timeout
        )

    def _start_apiserver(self) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        argv = components.apiserver_argv(
            self.bin_dir / "kube-apiserver",
            etcd_url=self.etcd_url,
            port=port,
            pki=self.pki,
            cert_dir=self.workdir / "apiserver-certs",
            verbosity=self.verbosity,
            disable_admission_plugins=self.disable_admission_plugins,
            extra=self.extra_apiserver_args,
        )
        proc = self.spawn("kube-apiserver", argv)
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        proc.wait_ready("kube-apiserver", lambda: http_ok(f"{self.server}/readyz", ctx=ctx), self.start_timeout)
        # /readyz passes once the start-system-namespaces-controller hook has *started* its controller, which creates
        # kube-system and default on a goroutine of its own (k8s.io/kubernetes v1.34.4 pkg/controlplane/apiserver/
        # server.go): the first module writes into kube-system at once, so wait for the namespaces themselves.
        for ns in SYSTEM_NAMESPACES:
            proc.wait_ready(
                f"kube-apiserver's namespace {ns}",
                functools.partial(http_ok, f"{self.server}/api/v1/namespaces/{ns}", ctx=ctx),
                self.start_timeout,
            )

    # ---- scheduler and KWOK

    def start_scheduler(
        self, config_yaml: str | None = None, extra_args: Sequence[str] = (), timeout: float | None = None
    ) -> ManagedProcess:
        """(Re)start kube-scheduler with a KubeSchedulerConfiguration (YAML text; default profile if None).

        ``clientConnection.kubeconfig`` is set to the scheduler kubeconfig (user ``system:kube-scheduler``,
        so RBAC applies as in a real cluster), and ``leaderElection.leaderElect`` is set to false unless the
        YAML sets it. A running scheduler is stopped first. Waits until ``/readyz`` answers 200.
        """
        self._scheduler_configs += 1
        cfg = self.workdir / f"scheduler-config-{self._scheduler_configs}.yaml"
        cfg.write_text(components.scheduler_config(config_yaml, self.scheduler_kubeconfig))
        if self.scheduler is not None:
            self.stop_process(self.scheduler)
        port = free_port()
        argv = components.scheduler_argv(
            self.bin_dir / "kube-scheduler",
            config=cfg,
            port=port,
            kubeconfig=self.scheduler_kubeconfig,
            cert_dir=self.workdir / "scheduler-certs",
            verbosity=self.verbosity,
            extra=extra_args,
        )
        proc = self.spawn(f"kube-scheduler-{self._scheduler_configs}", argv)
        self.scheduler = proc
        insecure = insecure_tls()
        ready_url = f"https://127.0.0.1:{port}/readyz"
        proc.wait_ready("kube-scheduler", lambda: http_ok(ready_url, ctx=insecure), timeout or self.start_timeout)
        return proc

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.stop_process(self.scheduler)

    def start_kwok(self, kwok_bin: str | os.PathLike[str] | None = None) -> ManagedProcess:
        """Optional: run KWOK's controller (``hack/build-kwok.sh``, built on first use) for the nodes that
        carry ``KWOK_NODE_ANNOTATION`` (``add_node(..., kwok=True)``): their pods become Running with a pod IP,
        and graceful deletes of their pods complete, as with a kubelet. Other nodes are left alone. KWOK
        serves no port here. Stopped on :meth:`stop` (or with :meth:`stop_process`)."""
        if self.kwok is not None and self.kwok.alive():
            return self.kwok
        binary = Path(kwok_bin) if kwok_bin else ensure_kwok()
        stages = sorted((binary.parent.parent / "stages").glob("*.yaml"))
        if not stages:
            raise ControlPlaneError(f"no KWOK stage configs next to {binary} (expected ../stages/*.yaml)")
        argv = components.kwok_argv(binary, stages, self.admin_kubeconfig)
        # HOME: no ~/.kwok/kwok.yaml lookup. WatchListClient off: etcd < 3.5.13 lacks watch progress requests.
        env = {"HOME": str(self.workdir), "KUBE_FEATURE_WatchListClient": "false"}
        self.kwok = self.spawn("kwok", argv, env=env)
        time.sleep(1.0)
        if not self.kwok.alive():
            raise ControlPlaneError(f"kwok exited with code {self.kwok.popen.returncode}:\n{self.kwok.tail()}")
        return self.kwok
