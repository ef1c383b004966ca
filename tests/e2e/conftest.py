"""Fixtures for end-to-end tests against a real control plane (see docs/controlplane.md).

``control_plane`` (session): etcd + kube-apiserver started once per session from the cached build
(``hack/build-control-plane.sh``, built on first use). It is skipped only when ``KUBE_VGPU_SKIP_E2E=1``;
a failure to build or start is an error. ``namespace`` (function): a fresh namespace per test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .controlplane import ControlPlane

_E2E_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end test against a real kube-apiserver/kube-scheduler (tests/e2e)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    if os.environ.get("KUBE_VGPU_SKIP_E2E") == "1":
        pytest.skip("KUBE_VGPU_SKIP_E2E=1: end-to-end tests against a real control plane are skipped")
    cp = ControlPlane()
    cp.start()  # builds/installs the binaries on first use; any failure raises (loudly) here
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    """A new namespace for one test (namespaces are never finalised here, so they are not deleted)."""
    from kubernetes import client

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(control_plane.api_client()).create_namespace({"metadata": {"name": name}})
    return name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    cp = getattr(item, "funcargs", {}).get("control_plane")
    if rep.failed and isinstance(cp, ControlPlane) and cp.started:
        rep.sections.append(("control plane logs", cp.dump_logs()))
