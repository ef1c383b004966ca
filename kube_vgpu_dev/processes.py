"""Child processes for the harness: each in its own process group, logged to a file, gone with its parent."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to build, start or become ready. The message has the log tails."""


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 15000
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default low end


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server started next.

    Picked below the kernel's ephemeral range, not by bind(("127.0.0.1", 0)): a port from that range, freed again
    here, can be taken as the source port of any outgoing connection on the machine (the apiserver's to etcd, a
    test's requests) before the server binds it, and the server then fails "address already in use". Ports below
    the range are never handed out that way; each is handed out once per process."""
    high = _ephemeral_low()
    with _handed_out_lock:
        if high - _LOWEST_PORT >= 1000:
            for _ in range(200):
                port = random.randrange(_LOWEST_PORT, high)
                if port not in _handed_out and _bindable(port):
                    _handed_out.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range: the kernel's pick
            s.bind(("127.0.0.1", 0))
            picked: int = s.getsockname()[1]
        _handed_out.add(picked)
        return picked


_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):  # pragma: no cover
    _prctl = None


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """SIGKILL the child when the thread that started it exits, so a killed test run leaves nothing behind."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def http_ok(url: str, ctx: ssl.SSLContext | None = None, expect: bytes | None = None) -> bool:
    """Whether GET *url* answers 200 (with *expect* in the body, spaces ignored, when given)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            body: bytes = r.read()
            return r.status == 200 and (expect is None or expect in body.replace(b" ", b""))
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def insecure_tls() -> ssl.SSLContext:
    """A TLS context that checks nothing: for probing a component's self-signed /readyz."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


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
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
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
            preexec_fn=die_with_parent,
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

    def wait_ready(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        """Poll *ready* until it holds; ControlPlaneError with the log tail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ControlPlaneError(
                    f"{what} exited with code {self.popen.returncode} before it was ready:\n{self.tail()}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"{what} not ready after {timeout}s:\n{self.tail()}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (proc(5): fields 14 and 15 of /proc/<pid>/stat, in clock ticks)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB, from /proc/<pid>/status."""
    got = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M))
    return int(got["VmRSS"]) / 1024, int(got["VmHWM"]) / 1024
