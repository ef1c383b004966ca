"""The Helm chart against the real kube-apiserver: the rendered objects pass the apiserver's own validation and
admission (`kubectl apply --dry-run=server`: OpenAPI with strict field validation, the webhooks' CEL
matchConditions compiled, RBAC role references, priority classes), and `helm install --dry-run=server` accepts
the chart on a real cluster version and prints NOTES.txt. Nothing is created."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from tests.integration.helm_chart import CHART, NAMESPACE, RELEASE, helm_binary, run_helm, template_text

from .controlplane import ControlPlane

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "overrides": {
        "resourceNames.memory": "example.com/vmem",
        "scheduler.name": "gpu-scheduler",
        "extender.nodePolicy": "spread",
        "webhook.validatingWebhook": False,
        "monitoring.grafanaDashboard.enabled": True,
    },
}


@pytest.fixture(scope="module")
def helm() -> str:
    if os.environ.get("KUBE_VGPU_SKIP_HELM") == "1":
        pytest.skip("KUBE_VGPU_SKIP_HELM=1: the Helm chart tests are skipped")
    return helm_binary()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_chart_passes_server_side_dry_run(control_plane: ControlPlane, helm: str, variant: str) -> None:
    text = template_text(helm, VARIANTS[variant])
    proc = control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=text, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines and all("(server dry run)" in line for line in lines), proc.stdout
    assert len(lines) == len([d for d in yaml.safe_load_all(text) if d])  # every object went through
    assert any(line.startswith("mutatingwebhookconfiguration.") for line in lines)


def test_helm_install_dry_run_prints_how_to_use_the_scheduler(control_plane: ControlPlane, helm: str) -> None:
    args = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server"]
    # The control plane is shared with the other e2e tests, which create the manifests' objects (the same
    # cluster-scoped names, e.g. ClusterRole vgpu-extender) without Helm's ownership labels.
    args += ["--take-ownership", "--kubeconfig", str(control_plane.admin_kubeconfig)]
    notes = run_helm(helm, *args).stdout.split("NOTES:", 1)[1]
    assert "schedulerName: vgpu-scheduler" in notes and "nvidia.com/gpumem: 10240" in notes
    assert "scheduler.extenderCAData is still the placeholder" in notes
    args += ["--set", "scheduler.extenderCAData=Q0E=", "--set", "scheduler.name=gpu-scheduler"]
    notes = run_helm(helm, *args).stdout.split("NOTES:", 1)[1]
    assert "schedulerName: gpu-scheduler" in notes and "placeholder" not in notes
