"""Fixtures for end-to-end tests against a real control plane (see docs/controlplane.md).

``control_plane`` (session): etcd + kube-apiserver started once per session from the cached build
(``hack/build-control-plane.sh``, built on first use). It is skipped only when ``KUBE_VGPU_SKIP_E2E=1``;
a failure to build or start is an error. ``namespace`` (function): a fresh namespace per test.
``kwok``: the same control plane with KWOK's controller running (``hack/build-kwok.sh``).
``prometheus_bin`` (session): the Prometheus server binary (``hack/build-prometheus.sh``); helm
(``hack/build-helm.sh``) for the chart's e2e test.

Every tool a selected test needs is built in ``pytest_collection_finish``, before the first test starts, so a
cold build (tens of minutes on 2 cores) never counts against a test's timeout.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helm_chart import helm_binary
from tests.prebuild import build_before_tests, uses_fixture

from .controlplane import ControlPlane, ControlPlaneError, ensure_binaries, ensure_kwok, ensure_prometheus

_E2E_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end test against a real kube-apiserver/kube-scheduler (tests/e2e)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


_build_error: BaseException | None = None
_prometheus_error: BaseException | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build/install the binaries once, before any test runs, so a cold build (minutes) is not counted
    against the per-test timeout. Only the tools that a selected test uses; errors are raised again by
    the fixtures (``control_plane``, ``prometheus_bin``), i.e. every test that needs the tool errors loudly."""
    global _build_error, _prometheus_error
    if os.environ.get("KUBE_VGPU_SKIP_E2E") == "1" or session.config.option.collectonly:
        return
    if uses_fixture(session, "control_plane"):
        with_kwok = uses_fixture(session, "kwok")

        def build() -> str:
            bin_dir, etcd = ensure_binaries()
            if with_kwok:
                ensure_kwok()
            return f"binaries in {bin_dir}, etcd {etcd}" + (", kwok" if with_kwok else "")

        what = "kube-apiserver, kube-scheduler, kubectl, etcd" + (", kwok" if with_kwok else "")
        _build_error = build_before_tests(session, "e2e", what, build)
    if uses_fixture(session, "helm") and os.environ.get("KUBE_VGPU_SKIP_HELM") != "1":
        # test_helm_chart_e2e's module fixture calls helm_binary() (remembered per process): built here first.
        # Its error is not kept: the fixture's own call fails the same way, loudly.
        build_before_tests(session, "e2e", "the helm binary", helm_binary)
    if uses_fixture(session, "prometheus_bin"):
        _prometheus_error = build_before_tests(
            session, "e2e", "the Prometheus server", lambda: str(ensure_prometheus())
        )


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """The Prometheus server binary, built before the tests started (see pytest_collection_finish)."""
    if os.environ.get("KUBE_VGPU_SKIP_E2E") == "1":
        pytest.skip("KUBE_VGPU_SKIP_E2E=1: end-to-end tests are skipped")
    if _prometheus_error is not None:
        raise ControlPlaneError(f"building Prometheus failed: {_prometheus_error}") from _prometheus_error
    return str(ensure_prometheus())


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    if os.environ.get("KUBE_VGPU_SKIP_E2E") == "1":
        pytest.skip("KUBE_VGPU_SKIP_E2E=1: end-to-end tests against a real control plane are skipped")
    if _build_error is not None:
        raise ControlPlaneError(f"building the control plane failed: {_build_error}") from _build_error
    cp = ControlPlane()
    cp.start()  # builds/installs the binaries on first use; any failure raises (loudly) here
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def kwok(control_plane: ControlPlane) -> ControlPlane:
    """The session control plane with KWOK's controller running (started once, kept for the session): pods
    on nodes added with ``add_node(..., kwok=True)`` become Running and their graceful deletes complete."""
    control_plane.start_kwok()
    return control_plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A new namespace for one test (namespaces are never finalised here, so they are not deleted).

    At the end its pods that are still unscheduled are deleted, with those of the namespaces named after it
    (`<name>-off`): a pod left pending under the vgpu scheduler's name is placed by the next module that starts a
    vgpu kube-scheduler, on that module's nodes, taking GPUs its test counts on (the webhook e2e's pods, pending
    without a scheduler, took GPUs of the topology e2e's nodes and its "NVLink peers" reason never came)."""
    from kubernetes import client

    core = client.CoreV1Api(control_plane.api_client())
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    _delete_unscheduled_pods(core, name)


def _delete_unscheduled_pods(core: Any, namespace: str | None) -> None:
    """Those of `namespace` and `<namespace>-*`; with None, those of every namespace but kube-system."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        pending = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=").items
        for pod in pending:
            ns = pod.metadata.namespace
            if (ns != "kube-system") if namespace is None else (ns == namespace or ns.startswith(namespace + "-")):
                with contextlib.suppress(ApiException):  # gone already (404)
                    core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    except (ApiException, HTTPError, OSError) as exc:  # the control plane is down: the test's own failure says why
        warnings.warn(f"could not delete the unscheduled pods of {namespace or 'the cluster'}: {exc}", stacklevel=1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """When a module is done (its module-scoped fixtures torn down), no pod it left unscheduled survives into the
    next one, whatever namespace it made it in: the `namespace` fixture covers its own, a module with a namespace
    of its own (the admission-policy e2e's) may not, and the next module's kube-scheduler places such a pod on that
    module's fresh nodes."""
    cp = getattr(item, "funcargs", {}).get("control_plane")
    yield
    leaving = nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None)
    if leaving and isinstance(cp, ControlPlane) and cp.started:
        from kubernetes import client

        _delete_unscheduled_pods(client.CoreV1Api(cp.api_client()), None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    cp = getattr(item, "funcargs", {}).get("control_plane")
    if rep.failed and isinstance(cp, ControlPlane) and cp.started:
        rep.sections.append(("control plane logs", cp.dump_logs()))
