"""Fixtures for the integration tests that need helm (tests/integration/helm_chart.py).

``helm`` (session): the helm binary from hack/build-helm.sh. Like the e2e control plane it is built once,
before any test runs (so a cold build, minutes, is not counted against a test's timeout), and only when a
selected test uses it. A failed build errors every helm test loudly; ``KUBE_VGPU_SKIP_HELM=1`` skips them.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from .helm_chart import HelmError, helm_binary

_build_error: BaseException | None = None


def _skipped() -> bool:
    return os.environ.get("KUBE_VGPU_SKIP_HELM") == "1"


def pytest_collection_finish(session: pytest.Session) -> None:
    global _build_error
    if _skipped() or session.config.option.collectonly:
        return
    if not any("helm" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("helm: building/locating the helm binary (cached) ...")
    capman = session.config.pluginmanager.get_plugin("capturemanager")
    try:  # show a cold build's progress instead of capturing it
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            path = helm_binary()
    except Exception as e:  # re-raised by the fixture
        _build_error = e
        return
    if reporter is not None:
        reporter.write_line(f"helm: {path}")


@pytest.fixture(scope="session")
def helm() -> str:
    if _skipped():
        pytest.skip("KUBE_VGPU_SKIP_HELM=1: the Helm chart tests are skipped")
    if _build_error is not None:
        raise HelmError(f"building helm failed: {_build_error}") from _build_error
    return helm_binary()
