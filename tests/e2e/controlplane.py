"""A real Kubernetes control plane on loopback for end-to-end tests: etcd, kube-apiserver, kube-scheduler.

There is no kubelet and no kube-controller-manager. Nodes are plain Node objects whose status (capacity,
allocatable, a Ready condition) is written through the ``/status`` subresource; pods are bound by the real
kube-scheduler (or by an extender's binder) and then simply stay bound. Consequences worth knowing:

* A pod bound to a node is only removed when deleted with ``grace_period_seconds=0`` (no kubelet ever
  confirms a graceful deletion); :meth:`ControlPlane.delete_pod` does that.
* Namespaces are not finalised on delete (no namespace controller); use fresh names instead of deleting.
* The ``ServiceAccount`` admission plugin is disabled by default, because no controller creates the
  ``default`` ServiceAccount of new namespaces; so is ``TaintNodesByCondition``, which would give every new
  Node a ``node.kubernetes.io/not-ready`` taint that only the node lifecycle controller removes.

The binaries come from ``hack/build-control-plane.sh`` (cached build of ``k8s.io/kubernetes``) and
``hack/install-etcd.sh``; ``KUBE_VGPU_BIN_DIR`` and ``KUBE_VGPU_ETCD`` override them.

Use it as a context manager::

    with ControlPlane() as cp:
        cp.add_node("n1", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"})
        cp.start_scheduler(config_yaml)
        core = kubernetes.client.CoreV1Api(cp.api_client())

or, for a person, ``python -m tests.e2e.controlplane up`` (also ``hack/local-cluster.sh``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime as _dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK = REPO_ROOT / "hack"

KWOK_NODE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}  # nodes with it are run by start_kwok()'s controller
DEFAULT_NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110"}
DEFAULT_SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
"""


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to build, start or become ready. The message has the log tails."""


# --------------------------------------------------------------------------------------------------------
# Certificates


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
        """Write ``<name>.crt`` and ``<name>.key`` (mode 0600) into *directory*; return both paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        crt, key = d / f"{name}.crt", d / f"{name}.key"
        crt.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return crt, key


def _new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    """A throwaway CA (RSA 2048, valid one year) that issues server and client certificates.

    ``ca.cert_pem`` is what goes into ``tlsConfig.caData`` (base64 of it in YAML) of a kube-scheduler
    extender, or into ``caBundle`` of a webhook configuration.
    """

    def __init__(self, common_name: str = "kube-vgpu-e2e-ca") -> None:
        self._key = _new_rsa_key()
        now = _dt.datetime.now(_dt.UTC)
        subject = _name(common_name)
        ski = x509.SubjectKeyIdentifier.from_public_key(self._key.public_key())
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(hours=1))
            .not_valid_after(now + _dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.keypair = KeyPair(self._cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key))

    @property
    def cert_pem(self) -> bytes:
        return self.keypair.cert_pem

    @property
    def cert_b64(self) -> str:
        """Base64 of the CA PEM, as ``caData``/``caBundle`` fields want it."""
        return base64.b64encode(self.cert_pem).decode()

    def _issue(
        self,
        common_name: str,
        organizations: Sequence[str],
        usage: x509.ObjectIdentifier | list,
        dns_names: Iterable[str] = (),
        ip_addresses: Iterable[str] = (),
    ) -> KeyPair:
        key = _new_rsa_key()
        now = _dt.datetime.now(_dt.UTC)
        usages = usage if isinstance(usage, list) else [usage]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(hours=1))
            .not_valid_after(now + _dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_encipherment=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    content_commitment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_server_cert(
        self,
        common_name: str,
        dns_names: Iterable[str] = ("localhost",),
        ip_addresses: Iterable[str] = ("127.0.0.1",),
    ) -> KeyPair:
        """A serving certificate (serverAuth) for the given DNS names and IPs."""
        return self._issue(common_name, (), ExtendedKeyUsageOID.SERVER_AUTH, dns_names, ip_addresses)

    def issue_client_cert(self, common_name: str, organizations: Sequence[str] = ()) -> KeyPair:
        """A client certificate (clientAuth): CN is the Kubernetes user name, O the groups."""
        return self._issue(common_name, organizations, ExtendedKeyUsageOID.CLIENT_AUTH)


def make_ca_and_server_cert(
    directory: str | os.PathLike[str],
    name: str = "server",
    dns_names: Iterable[str] = ("localhost",),
    ip_addresses: Iterable[str] = ("127.0.0.1",),
) -> tuple[CertificateAuthority, Path, Path, Path]:
    """Create a CA and a server cert signed by it in *directory*. Returns (ca, ca.crt, <name>.crt, <name>.key)."""
    ca = CertificateAuthority()
    ca_crt, _ = ca.keypair.write(directory, "ca")
    crt, key = ca.issue_server_cert(name, dns_names, ip_addresses).write(directory, name)
    return ca, ca_crt, crt, key


def kubeconfig_text(server: str, ca_pem: bytes, client: KeyPair, user: str) -> str:
    """A self-contained kubeconfig (all data embedded) for *server* authenticating with *client*."""
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "kube-vgpu-e2e", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem)},
            }
        ],
        "contexts": [{"name": "kube-vgpu-e2e", "context": {"cluster": "kube-vgpu-e2e", "user": user}}],
        "current-context": "kube-vgpu-e2e",
    }
    return yaml.safe_dump(doc, sort_keys=False)


# --------------------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):  # pragma: no cover
    _prctl = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # SIGKILL the child when the thread that started it exits, so a killed test run leaves nothing behind.
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ManagedProcess:
    """A child process in its own process group, logging stdout+stderr to *log_path*."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group_alive(self) -> bool:
        """Whether any process of this process group (the child or anything it started) still exists."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, wait up to *timeout* s, then SIGKILL it. Returns the exit code."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if not self.group_alive():
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if self.popen.poll() is not None and not self.group_alive():
                    break
                time.sleep(0.05)
        code = self.popen.poll()
        if code is None:
            code = self.popen.wait(timeout=5)
        self._log.close()
        return code

    def tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


_live: set[ControlPlane] = set()


@atexit.register
def _stop_all() -> None:
    for cp in list(_live):
        with contextlib.suppress(Exception):
            cp.stop()


# --------------------------------------------------------------------------------------------------------
# Binaries


def _run_hack(script: str, *args: str) -> str:
    """Run hack/<script>; return the last line of its stdout. Its stderr goes to ours.

    The script runs in its own process group, which is killed if we are interrupted (a test timeout, Ctrl-C),
    so an interrupted build leaves no ``go build`` behind."""
    proc = subprocess.Popen(
        ["bash", str(HACK / script), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    try:
        out, _ = proc.communicate()
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        raise
    if proc.returncode != 0:
        raise ControlPlaneError(f"hack/{script} {' '.join(args)} failed with exit code {proc.returncode}")
    lines = out.strip().splitlines()
    if not lines:
        raise ControlPlaneError(f"hack/{script} {' '.join(args)} printed no path")
    return lines[-1]


_binaries: tuple[Path, Path] | None = None


def ensure_binaries() -> tuple[Path, Path]:
    """(bin dir with kube-apiserver, kube-scheduler, kubectl; etcd path), building/installing if needed.

    ``KUBE_VGPU_BIN_DIR`` / ``KUBE_VGPU_ETCD`` override the scripts. The result is remembered per process."""
    global _binaries
    if _binaries is not None:
        return _binaries
    bin_dir = os.environ.get("KUBE_VGPU_BIN_DIR") or _run_hack("build-control-plane.sh", "--print-bin-dir")
    etcd = os.environ.get("KUBE_VGPU_ETCD") or _run_hack("install-etcd.sh")
    bd = Path(bin_dir)
    for b in ("kube-apiserver", "kube-scheduler"):
        if not os.access(bd / b, os.X_OK):
            raise ControlPlaneError(f"{bd / b} is missing or not executable")
    if not os.access(etcd, os.X_OK):
        raise ControlPlaneError(f"etcd binary {etcd} is missing or not executable")
    _binaries = (bd, Path(etcd))
    return _binaries


def ensure_kwok() -> Path:
    """The KWOK controller binary (``KUBE_VGPU_KWOK`` or ``hack/build-kwok.sh``, built on first use)."""
    return Path(os.environ.get("KUBE_VGPU_KWOK") or _run_hack("build-kwok.sh"))


def ensure_prometheus() -> Path:
    """The Prometheus server binary (``KUBE_VGPU_PROMETHEUS`` or ``hack/build-prometheus.sh``, built on first use)."""
    return Path(os.environ.get("KUBE_VGPU_PROMETHEUS") or _run_hack("build-prometheus.sh"))


def _etcd_version(etcd: Path) -> tuple[int, ...]:
    out = subprocess.run([str(etcd), "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


# --------------------------------------------------------------------------------------------------------
# The control plane


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand) on 127.0.0.1, torn down on exit.

    Attributes after :meth:`start`: ``workdir`` (temp dir with certs, kubeconfigs, ``logs/``), ``server``
    (``https://127.0.0.1:<port>``), ``ca`` (:class:`CertificateAuthority`), ``ca_file``,
    ``admin_kubeconfig``, ``scheduler_kubeconfig``, ``bin_dir``, ``etcd_url``, ``scheduler`` (the running
    :class:`ManagedProcess` or ``None``).
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
        self._clients: list[Any] = []
        self._admin: Any = None
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
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        self._admin = None
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
        self.ca = CertificateAuthority()
        self.ca_file, _ = self.ca.keypair.write(self.pki_dir, "ca")
        self.apiserver_cert, self.apiserver_key = self.ca.issue_server_cert(
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=("127.0.0.1",),
        ).write(self.pki_dir, "apiserver")
        sa_key = _new_rsa_key()
        self.sa_key = self.pki_dir / "sa.key"
        self.sa_key.write_bytes(_key_pem(sa_key))
        self.sa_pub = self.pki_dir / "sa.pub"
        self.sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # Front-proxy (request header) CA, as kubeadm sets it up; kube-scheduler's delegated authn reads it.
        self.front_proxy_ca = CertificateAuthority("kube-vgpu-e2e-front-proxy-ca")
        self.front_proxy_ca_file, _ = self.front_proxy_ca.keypair.write(self.pki_dir, "front-proxy-ca")
        self.front_proxy_cert, self.front_proxy_key = self.front_proxy_ca.issue_client_cert("front-proxy-client").write(
            self.pki_dir, "front-proxy-client"
        )
        self.admin_client = self.ca.issue_client_cert("kube-vgpu-admin", ["system:masters"])
        self.admin_cert, self.admin_key = self.admin_client.write(self.pki_dir, "admin")

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

    # ---- etcd and apiserver

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        argv = [
            str(self.etcd_bin),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--initial-cluster-state=new",
            "--log-level=warn",
        ]
        if _etcd_version(self.etcd_bin) >= (3, 5, 0):
            argv.append("--unsafe-no-fsync")  # test data only; much faster on slow disks
        proc = self.spawn("etcd", argv)
        self._wait("etcd", proc, lambda: self._http_ok(f"{self.etcd_url}/health", expect=b'"health":"true"'))

    def _start_apiserver(self) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={self.apiserver_cert}",
            f"--tls-private-key-file={self.apiserver_key}",
            f"--client-ca-file={self.ca_file}",
            "--authorization-mode=Node,RBAC",
            "--anonymous-auth=false",
            f"--requestheader-client-ca-file={self.front_proxy_ca_file}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_cert}",
            f"--proxy-client-key-file={self.front_proxy_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            # No Endpoints for the kubernetes Service: 127.0.0.1 is not a valid endpoint address.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--v={self.verbosity}",
        ]
        if self.disable_admission_plugins:
            argv.append("--disable-admission-plugins=" + ",".join(self.disable_admission_plugins))
        argv += self.extra_apiserver_args
        proc = self.spawn("kube-apiserver", argv)
        ctx = self._admin_ssl_context()
        self._wait("kube-apiserver", proc, lambda: self._http_ok(f"{self.server}/readyz", ctx=ctx))

    def _admin_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return ctx

    def _write_kubeconfigs(self) -> None:
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self.admin_kubeconfig.write_text(
            kubeconfig_text(self.server, self.ca.cert_pem, self.admin_client, "kube-vgpu-admin")
        )
        self.admin_kubeconfig.chmod(0o600)
        self.scheduler_kubeconfig = self.write_kubeconfig("system:kube-scheduler", name="scheduler")

    @staticmethod
    def _http_ok(url: str, ctx: ssl.SSLContext | None = None, expect: bytes | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                body = r.read()
                return r.status == 200 and (expect is None or expect in body.replace(b" ", b""))
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _wait(self, what: str, proc: ManagedProcess, ready: Any, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ControlPlaneError(
                    f"{what} exited with code {proc.popen.returncode} before it was ready:\n{proc.tail()}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"{what} not ready after {timeout or self.start_timeout}s:\n{proc.tail()}")

    # ---- scheduler

    def start_scheduler(
        self, config_yaml: str | None = None, extra_args: Sequence[str] = (), timeout: float | None = None
    ) -> ManagedProcess:
        """(Re)start kube-scheduler with a KubeSchedulerConfiguration (YAML text; default profile if None).

        ``clientConnection.kubeconfig`` is set to the scheduler kubeconfig (user ``system:kube-scheduler``,
        so RBAC applies as in a real cluster), and ``leaderElection.leaderElect`` is set to false unless the
        YAML sets it. A running scheduler is stopped first. Waits until ``/readyz`` answers 200.
        """
        doc = yaml.safe_load(config_yaml or DEFAULT_SCHEDULER_CONFIG) or {}
        doc.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        doc.setdefault("kind", "KubeSchedulerConfiguration")
        doc.setdefault("clientConnection", {})["kubeconfig"] = str(self.scheduler_kubeconfig)
        doc.setdefault("leaderElection", {}).setdefault("leaderElect", False)
        self._scheduler_configs += 1
        cfg = self.workdir / f"scheduler-config-{self._scheduler_configs}.yaml"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
        if self.scheduler is not None:
            self.stop_process(self.scheduler)
        port = free_port()
        argv = [
            str(self.bin_dir / "kube-scheduler"),
            f"--config={cfg}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            f"--v={self.verbosity}",
            *extra_args,
        ]
        proc = self.spawn(f"kube-scheduler-{self._scheduler_configs}", argv)
        self.scheduler = proc
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._wait(
            "kube-scheduler", proc, lambda: self._http_ok(f"https://127.0.0.1:{port}/readyz", ctx=insecure), timeout
        )
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
        ((key, value),) = KWOK_NODE_ANNOTATION.items()
        argv = [
            str(binary),
            f"--kubeconfig={self.admin_kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--cidr=10.0.0.0/16",
            "--node-ip=127.0.0.1",
            *[f"--config={s}" for s in stages],
        ]
        # HOME: no ~/.kwok/kwok.yaml lookup. WatchListClient off: etcd < 3.5.13 lacks watch progress requests.
        env = {"HOME": str(self.workdir), "KUBE_FEATURE_WatchListClient": "false"}
        self.kwok = self.spawn("kwok", argv, env=env)
        time.sleep(1.0)
        if not self.kwok.alive():
            raise ControlPlaneError(f"kwok exited with code {self.kwok.popen.returncode}:\n{self.kwok.tail()}")
        return self.kwok

    # ---- clients and objects

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` authenticated as cluster admin (closed on stop)."""
        from kubernetes import config

        client = config.new_client_from_config(config_file=str(self.admin_kubeconfig))
        self._clients.append(client)
        return client

    def _core(self) -> Any:
        """A CoreV1Api on one shared admin client, for the helpers below."""
        from kubernetes import client

        if self._admin is None:
            self._admin = self.api_client()
        return client.CoreV1Api(self._admin)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster as admin; returns the CompletedProcess (text)."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            input=input,
        )

    def add_node(
        self,
        name: str,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        kwok: bool = False,
    ) -> Any:
        """Create Node *name* and write status.capacity/allocatable (= capacity unless given) and Ready=True
        through ``/status``. ``pods: 110`` is added when capacity has no ``pods``; capacity None means
        ``DEFAULT_NODE_CAPACITY``. ``kwok=True`` adds ``KWOK_NODE_ANNOTATION`` so that the controller of
        :meth:`start_kwok` runs this node's pods. Returns the V1Node after the status patch."""
        cap = dict(DEFAULT_NODE_CAPACITY if capacity is None else capacity)
        cap.setdefault("pods", "110")
        alloc = dict(allocatable) if allocatable is not None else dict(cap)
        alloc.setdefault("pods", cap["pods"])
        api = self._core()
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {**(KWOK_NODE_ANNOTATION if kwok else {}), **(annotations or {})},
            },
            "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        }
        api.create_node(body)
        return self.set_node_status(name, cap, alloc)

    def set_node_status(
        self, name: str, capacity: Mapping[str, str], allocatable: Mapping[str, str] | None = None, ready: bool = True
    ) -> Any:
        """Patch status.capacity/allocatable and the Ready condition of an existing node via ``/status``."""
        now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            "capacity": dict(capacity),
            "allocatable": dict(allocatable if allocatable is not None else capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeVgpuE2E",
                    "message": "simulated node",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
        }
        api = self._core()
        return api.patch_node_status(name, {"status": status})

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete a pod at once (grace period 0): without a kubelet a bound pod never finishes graceful deletion."""
        api = self._core()
        api.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def wait_for_pod(self, name: str, namespace: str = "default", timeout: float = 30.0, condition: Any = None) -> Any:
        """Poll pod *name* until ``condition(pod)`` (default: ``spec.nodeName`` set) holds; return the pod.
        Raises TimeoutError with the pod's events otherwise."""
        api = self._core()
        cond = condition or (lambda p: bool(p.spec.node_name))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = api.read_namespaced_pod(name, namespace)
            if cond(pod):
                return pod
            time.sleep(0.2)
        events = [e.message for e in self.pod_events(name, namespace)]
        raise TimeoutError(f"pod {namespace}/{name} did not reach the condition in {timeout}s; events: {events}")

    def pod_events(self, name: str, namespace: str = "default") -> list[Any]:
        """Core/v1 Events whose involvedObject is pod *name*, oldest first."""
        api = self._core()
        evs = api.list_namespaced_event(
            namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
        ).items
        return sorted(evs, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)

    def env(self) -> dict[str, str]:
        """Environment for child processes that should talk to this cluster (KUBECONFIG)."""
        return {"KUBECONFIG": str(self.admin_kubeconfig)}


# --------------------------------------------------------------------------------------------------------
# CLI: python -m tests.e2e.controlplane up


def _main(argv: Sequence[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.e2e.controlplane", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, kube-apiserver and kube-scheduler until Ctrl-C")
    up.add_argument("--scheduler-config", help="KubeSchedulerConfiguration YAML file (default profile if unset)")
    up.add_argument("--no-scheduler", action="store_true", help="do not start kube-scheduler")
    up.add_argument("--nodes", type=int, default=2, help="plain Nodes to create (default 2)")
    up.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu capacity of each node (default 8)")
    up.add_argument("--kwok", action="store_true", help="run KWOK's controller for the nodes (pods become Running)")
    up.add_argument("--workdir", help="use this directory (kept) instead of a temp dir")
    up.add_argument(
        "--with-vgpu",
        action="store_true",
        help="also run kube-vgpu: the extender over HTTPS, the shipped vgpu-scheduler profile, and GPU nodes "
        "carrying a device-plugin inventory (H100-80GB, 10 slices per GPU)",
    )
    sub.add_parser("build", help="build/install the binaries (cached) and print where they are")
    args = ap.parse_args(argv)

    if args.cmd == "build":
        bd, etcd = ensure_binaries()
        print(f"bin dir: {bd}\netcd:    {etcd}")
        return 0

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: it may be ignored if started with &
        signal.signal(sig, lambda *_: stop.set())
    with ControlPlane(workdir=args.workdir, keep_workdir=bool(args.workdir)) as cp:
        extender_url = ""
        if args.with_vgpu:
            from tests.e2e import vgpu_stack

            vgpu_stack.gpu_nodes(cp, "gpu-node", args.nodes, args.gpus)
            ext = vgpu_stack.Extender(cp)
            ext.start()
            cp.start_scheduler(vgpu_stack.scheduler_config(cp, ext))
            extender_url = ext.url
        else:
            for i in range(args.nodes):
                cp.add_node(f"node-{i}", {**DEFAULT_NODE_CAPACITY, "nvidia.com/gpu": str(args.gpus)}, kwok=args.kwok)
        if args.kwok:
            cp.start_kwok()
        if not args.no_scheduler and not args.with_vgpu:
            text = Path(args.scheduler_config).read_text() if args.scheduler_config else None
            cp.start_scheduler(text)
        print(
            json.dumps(
                {"server": cp.server, "kubeconfig": str(cp.admin_kubeconfig), "workdir": str(cp.workdir)}, indent=2
            )
        )
        print(
            f"\nexport KUBECONFIG={cp.admin_kubeconfig}\nexport PATH={cp.bin_dir}:$PATH   # kubectl\n"
            f"logs: {cp.logs_dir}\nCtrl-C stops everything.",
            flush=True,
        )
        if extender_url:
            ca = cp.workdir / "vgpu-ca.pem"
            ca.write_bytes(cp.ca.cert_pem)
            print(
                f"\nkube-vgpu extender: {extender_url}  (CA: {ca})\n"
                f"  kubectl apply -f deploy/examples/llm-d-pd-pods.yaml && kubectl get pods -o wide\n"
                f"  curl -s --cacert {ca} {extender_url}/state > /tmp/vgpu-state.json && "
                f"vgpu show --cluster /tmp/vgpu-state.json",
                flush=True,
            )
        while not stop.wait(1.0):
            dead = [p.name for p in cp.processes if not p.alive()]
            if dead:
                print(f"process exited: {dead}\n{cp.dump_logs()}", file=sys.stderr)
                return 1
        print("stopping...", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
