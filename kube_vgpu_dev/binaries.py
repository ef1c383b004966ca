"""The binaries the harness runs, from the cached builds of ``hack/`` (built on first use).

``KUBE_VGPU_BIN_DIR``, ``KUBE_VGPU_ETCD``, ``KUBE_VGPU_KWOK`` and ``KUBE_VGPU_PROMETHEUS`` override the scripts.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

from kube_vgpu_dev.processes import ControlPlaneError, die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[1]
HACK = REPO_ROOT / "hack"


def run_hack(script: str, *args: str) -> str:
    """Run hack/<script>; return the last line of its stdout. Its stderr goes to ours.

    The script runs in its own process group, which is killed if we are interrupted (a test timeout, Ctrl-C),
    so an interrupted build leaves no ``go build`` behind."""
    proc = subprocess.Popen(
        ["bash", str(HACK / script), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent,
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
    bin_dir = os.environ.get("KUBE_VGPU_BIN_DIR") or run_hack("build-control-plane.sh", "--print-bin-dir")
    etcd = os.environ.get("KUBE_VGPU_ETCD") or run_hack("install-etcd.sh")
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
    return Path(os.environ.get("KUBE_VGPU_KWOK") or run_hack("build-kwok.sh"))


def ensure_prometheus() -> Path:
    """The Prometheus server binary (``KUBE_VGPU_PROMETHEUS`` or ``hack/build-prometheus.sh``, built on first use)."""
    return Path(os.environ.get("KUBE_VGPU_PROMETHEUS") or run_hack("build-prometheus.sh"))


def etcd_version(etcd: Path) -> tuple[int, ...]:
    """etcd's version from ``--version``; (0, 0, 0) if it does not say."""
    out = subprocess.run([str(etcd), "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)
