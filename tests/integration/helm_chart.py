"""Run the real `helm` (hack/build-helm.sh, cached outside the repository) on deploy/helm/kube-vgpu.

``helm_binary()`` is ``KUBE_VGPU_HELM`` when set, else the path hack/build-helm.sh prints (building helm on
first use, ~2.5 min cold on 2 cores). A failed build raises :class:`HelmError`, so in CI a missing helm fails the
chart tests loudly; ``KUBE_VGPU_SKIP_HELM=1`` is the only way to skip them (the fixtures check it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kube-vgpu"
NAMESPACE = "kube-system"
RELEASE = "kube-vgpu"


class HelmError(RuntimeError):
    """helm could not be built, or a helm command failed (the message has its stderr)."""


_binary: str | None = None


def helm_binary() -> str:
    """The helm binary's path; built by hack/build-helm.sh when not cached. Remembered per process."""
    global _binary
    if _binary is not None:
        return _binary
    path = os.environ.get("KUBE_VGPU_HELM")
    if not path:
        proc = subprocess.run(
            ["bash", str(ROOT / "hack" / "build-helm.sh")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise HelmError(f"hack/build-helm.sh failed with exit code {proc.returncode} (its log is above)")
        path = lines[-1]
    if not os.access(path, os.X_OK):
        raise HelmError(f"helm binary {path} is missing or not executable")
    _binary = path
    return path


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, check=False, timeout=120)
    if check and proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def _value_args(values: Mapping[str, Any] | None, sets: Sequence[str]) -> list[str]:
    out: list[str] = []
    for key, value in (values or {}).items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    for s in sets:
        out += ["--set", s]
    return out


def template_text(helm: str, values: Mapping[str, Any] | None = None, *sets: str) -> str:
    """`helm template` of the chart (release kube-vgpu in kube-system) with dotted-key JSON values and --set."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *_value_args(values, sets)]
    return run_helm(helm, *args).stdout


def template(helm: str, values: Mapping[str, Any] | None = None, *sets: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template_text(helm, values, *sets)) if d]


def template_error(helm: str, values: Mapping[str, Any] | None = None, *sets: str) -> str:
    """The error output of a `helm template` that must fail (fails the test if it does not)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *_value_args(values, sets)]
    proc = run_helm(helm, *args, check=False)
    if proc.returncode == 0:
        raise AssertionError(f"helm template {' '.join(args)} succeeded; expected a failure")
    return proc.stderr


def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name); names are unique per kind in both the chart and the manifests."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        assert key not in out, f"duplicate {key}"
        out[key] = d
    return out
