"""Fixtures for the integration tests that need helm (tests/integration/helm_chart.py).

``helm`` (session): the helm binary from hack/build-helm.sh. Like the e2e control plane it is built once,
before any test runs (so a cold build, minutes, is not counted against a test's timeout), and only when a
selected test uses it. A failed build errors every helm test loudly; ``KUBE_VGPU_SKIP_HELM=1`` skips them.
"""

from __future__ import annotations

import os

import pytest

from tests.prebuild import build_before_tests, uses_fixture

from .helm_chart import HelmError, helm_binary

_build_error: BaseException | None = None


def _skipped() -> bool:
    return os.environ.get("KUBE_VGPU_SKIP_HELM") == "1"


def pytest_collection_finish(session: pytest.Session) -> None:
    global _build_error
    if _skipped() or session.config.option.collectonly or not uses_fixture(session, "helm"):
        return
    _build_error = build_before_tests(session, "helm", "the helm binary", helm_binary)


@pytest.fixture(scope="session")
def helm() -> str:
    if _skipped():
        pytest.skip("KUBE_VGPU_SKIP_HELM=1: the Helm chart tests are skipped")
    if _build_error is not None:
        raise HelmError(f"building helm failed: {_build_error}") from _build_error
    return helm_binary()
