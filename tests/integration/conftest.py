"""Fixtures for the integration tests that need a built tool.

``helm`` (session): the helm binary from hack/build-helm.sh (tests/integration/helm_chart.py).
``kubelet_topology_check`` (session): hack/kubelet-topology-check, the kubelet's own Topology Manager and
device manager, from hack/build-kubelet-topology-check.sh.

Like the e2e control plane each is built once, before any test runs (so a cold build, minutes, is not counted
against a test's timeout), and only when a selected test uses it. A failed build errors every test that needs
it loudly; ``KUBE_VGPU_SKIP_HELM=1`` skips the helm tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.prebuild import build_before_tests, uses_fixture

from .helm_chart import HelmError, helm_binary

_build_error: BaseException | None = None
_check_error: BaseException | None = None
_CHECK_BUILD = Path(__file__).resolve().parents[2] / "hack" / "build-kubelet-topology-check.sh"


def _build_topology_check() -> str:
    out = subprocess.run([str(_CHECK_BUILD)], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{_CHECK_BUILD.name} exited {out.returncode}: {out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def _skipped() -> bool:
    return os.environ.get("KUBE_VGPU_SKIP_HELM") == "1"


def pytest_collection_finish(session: pytest.Session) -> None:
    global _build_error, _check_error
    if session.config.option.collectonly:
        return
    if not _skipped() and uses_fixture(session, "helm"):
        _build_error = build_before_tests(session, "helm", "the helm binary", helm_binary)
    if shutil.which("go") is not None and uses_fixture(session, "kubelet_topology_check"):
        _check_error = build_before_tests(
            session, "kubelet", "the kubelet's Topology Manager check", _build_topology_check
        )


@pytest.fixture(scope="session")
def helm() -> str:
    if _skipped():
        pytest.skip("KUBE_VGPU_SKIP_HELM=1: the Helm chart tests are skipped")
    if _build_error is not None:
        raise HelmError(f"building helm failed: {_build_error}") from _build_error
    return helm_binary()


@pytest.fixture(scope="session")
def kubelet_topology_check() -> str:
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: cannot build the kubelet's Topology Manager check")
    if _check_error is not None:
        raise RuntimeError(f"building the kubelet's Topology Manager check failed: {_check_error}") from _check_error
    return _build_topology_check()  # cached by now: prints the binary's path at once
