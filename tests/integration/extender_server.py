"""Start `vgpu-extender` as a real process on a free loopback port, for integration tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from kube_vgpu_dev.processes import free_port

# A client's timeout for one call to the extender. httpx's default (5 s) is not the behaviour under test: the
# extender is another process on a loaded 2-core machine, and a /bind with --persist fsyncs the cluster file while
# other binds wait their turn (24 concurrent binds took 2.2 s each on a lightly loaded machine). A hang still fails.
HTTP_TIMEOUT_S = 30.0


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def running_extender(
    *args: str,
    cert: tuple[Path, Path] | None = None,
    ca: Path | None = None,
    client: tuple[Path, Path] | None = None,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    startup_timeout: float = 120,  # importing the extender took 17 s at load 10 on 2 cores
) -> Iterator[str]:
    """Yield the base URL of a running extender; the process is terminated (then killed) on exit. `client` is the
    certificate and key the readiness poll presents when the extender requires one (--client-ca-file)."""
    port = free_port()
    cmd = [
        *(prefix or []),
        sys.executable,
        "-m",
        "scheduler_extender.main",
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    scheme = "http"
    if cert is not None:
        cmd += ["--tls-cert-file", str(cert[0]), "--tls-key-file", str(cert[1])]
        scheme = "https"
    # A file, not a pipe: nobody reads the server's logs while it runs, and a full pipe would block it.
    log = tempfile.NamedTemporaryFile(prefix="vgpu-extender-", suffix=".log", delete=False)  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[2],
    )
    url = f"{scheme}://127.0.0.1:{port}"
    verify: bool | ssl.SSLContext = ssl.create_default_context(cafile=str(ca)) if ca is not None else False
    if client is not None:
        if not isinstance(verify, ssl.SSLContext):
            verify = ssl.create_default_context()
            verify.check_hostname, verify.verify_mode = False, ssl.CERT_NONE
        verify.load_cert_chain(*client)
    # With --health-port the probes live on their own plain-HTTP port.
    probe = f"http://127.0.0.1:{args[args.index('--health-port') + 1]}" if "--health-port" in args else url
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"extender exited with {proc.returncode}:\n{Path(log.name).read_text()}")
            try:
                if httpx.get(f"{probe}/healthz", verify=verify, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"extender did not become healthy within {startup_timeout} s")
            time.sleep(0.1)
        # With --health-port the probes answer from a thread started before the verbs' server binds its port: a
        # first request right after /healthz passed met "connection refused" on a loaded machine. Wait for the port.
        while probe != url and not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"extender's port {port} not listening within {startup_timeout} s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        Path(log.name).unlink(missing_ok=True)
