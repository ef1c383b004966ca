"""The Helm chart against the real kube-apiserver: the rendered objects pass the apiserver's own validation and
admission (`kubectl apply --dry-run=server`: OpenAPI with strict field validation, the webhooks' CEL
matchConditions compiled, RBAC role references, priority classes), and `helm install --dry-run=server` accepts
the chart on a real cluster version and prints NOTES.txt. The generated extender certificates are rendered with
`lookup` against the apiserver (`helm template --dry-run=server`, as an upgrade renders): stored in a test
namespace, kept by the next rendering, renewed when near expiry or half lost. Nothing else is created."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.helm_chart import CHART, NAMESPACE, RELEASE, by_key, helm_binary, run_helm, template_text

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
    "device-plugin-mps-hami-core": {
        "devicePlugin.config.mps": True,
        "devicePlugin.config.mps_pipe_dir": "/run/nvidia-mps/pipe",
        "devicePlugin.config.hami_core_library": "/usr/local/vgpu/libvgpu.so",
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


@pytest.mark.parametrize("options", ["as shipped", "mps and hami-core on"])
def test_device_plugin_manifest_passes_server_side_dry_run(control_plane: ControlPlane, options: str) -> None:
    """deploy/device-plugin/daemonset.yaml as shipped, and with MPS on and its commented HAMi-core mount lines
    enabled as the header says: the apiserver accepts every object (strict field validation)."""
    text = (Path(__file__).resolve().parents[2] / "deploy" / "device-plugin" / "daemonset.yaml").read_text()
    if options != "as shipped":
        text = text.replace("    mps: false", "    mps: true")
        text = text.replace('hami_core_library: ""', "hami_core_library: /usr/local/vgpu/libvgpu.so")
        text = text.replace("# - {name: hami-core", "- {name: hami-core")
        assert text.count("- {name: hami-core") == 2
    proc = control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=text, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 5 and all("(server dry run)" in line for line in lines), proc.stdout


def test_helm_install_dry_run_prints_how_to_use_the_scheduler(control_plane: ControlPlane, helm: str) -> None:
    args = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server"]
    # The control plane is shared with the other e2e tests, which create the manifests' objects (the same
    # cluster-scoped names, e.g. ClusterRole vgpu-extender) without Helm's ownership labels.
    args += ["--take-ownership", "--kubeconfig", str(control_plane.admin_kubeconfig)]
    notes = run_helm(helm, *args).stdout.split("NOTES:", 1)[1]
    assert "schedulerName: vgpu-scheduler" in notes and "nvidia.com/gpumem: 10240" in notes
    assert "were made by the chart and are valid until" in notes
    args += ["--set", "extender.tls.mode=secret", "--set", "scheduler.name=gpu-scheduler"]
    notes = run_helm(helm, *args).stdout.split("NOTES:", 1)[1]
    assert "schedulerName: gpu-scheduler" in notes and "Both must exist for the pods to start" in notes


# --------------------------------------------------------------------------------------------------------------
# the generated extender certificates: `lookup` on the real apiserver keeps them, renews them near expiry

SECRETS = ("vgpu-extender-tls", "vgpu-extender-client")
NOT_AFTER = "kube-vgpu/certificates-not-after"


def _render_against(control_plane: ControlPlane, helm: str, namespace: str) -> dict[tuple[str, str], dict[str, Any]]:
    """`helm template --dry-run=server`: rendered like an install or upgrade, with `lookup` reading the cluster."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--dry-run=server"]
    text = run_helm(helm, *args, "--kubeconfig", str(control_plane.admin_kubeconfig)).stdout
    return by_key([d for d in yaml.safe_load_all(text) if d])


def _apply_secrets(control_plane: ControlPlane, chart: dict[tuple[str, str], dict[str, Any]]) -> None:
    docs = [chart[("Secret", name)] for name in SECRETS]
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs))


def _stored(control_plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name in SECRETS:
        proc = control_plane.kubectl("-n", namespace, "get", "secret", name, "-o", "json")
        out[name] = json.loads(proc.stdout)
    return out


def _checksum(chart: dict[tuple[str, str], dict[str, Any]], name: str) -> str:
    value: str = chart[("Deployment", name)]["spec"]["template"]["metadata"]["annotations"]["checksum/extender-tls"]
    return value


def test_generated_certificates_are_kept_by_upgrades_and_renewed_near_expiry(
    control_plane: ControlPlane, helm: str, namespace: str
) -> None:
    # First install: nothing to look up, so the chart issues a CA and both certificates; they go in as they are.
    first = _render_against(control_plane, helm, namespace)
    _apply_secrets(control_plane, first)
    stored = _stored(control_plane, namespace)
    for name in SECRETS:
        assert stored[name]["type"] == "kubernetes.io/tls"
        assert stored[name]["data"] == first[("Secret", name)]["data"]
    # An upgrade keeps them: same data, same expiry, and the pods' checksum does not change (no restart).
    again = _render_against(control_plane, helm, namespace)
    for name in SECRETS:
        assert again[("Secret", name)]["data"] == stored[name]["data"]
        assert again[("Secret", name)]["metadata"]["annotations"] == first[("Secret", name)]["metadata"]["annotations"]
    assert _checksum(again, "vgpu-extender") == _checksum(first, "vgpu-extender") == _checksum(again, "vgpu-scheduler")
    # Fewer than renewBeforeDays (30) left: the next upgrade issues a new CA and certificates, and rolls the pods.
    soon = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=29)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in SECRETS:
        control_plane.kubectl("-n", namespace, "annotate", "secret", name, f"{NOT_AFTER}={soon}", "--overwrite")
    renewed = _render_against(control_plane, helm, namespace)
    for name in SECRETS:
        assert renewed[("Secret", name)]["data"]["ca.crt"] != stored[name]["data"]["ca.crt"]
        assert renewed[("Secret", name)]["metadata"]["annotations"][NOT_AFTER] > soon
    assert _checksum(renewed, "vgpu-extender") != _checksum(first, "vgpu-extender")
    # 31 days left: kept.
    later = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=31)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in SECRETS:
        control_plane.kubectl("-n", namespace, "annotate", "secret", name, f"{NOT_AFTER}={later}", "--overwrite")
    kept = _render_against(control_plane, helm, namespace)
    assert all(kept[("Secret", n)]["data"] == stored[n]["data"] for n in SECRETS)
    # A half-made pair (one Secret lost) is not trusted: all three are issued anew, so the two never disagree.
    control_plane.kubectl("-n", namespace, "delete", "secret", "vgpu-extender-client")
    fresh = _render_against(control_plane, helm, namespace)
    assert fresh[("Secret", "vgpu-extender-tls")]["data"]["ca.crt"] != stored["vgpu-extender-tls"]["data"]["ca.crt"]
    ca = {fresh[("Secret", n)]["data"]["ca.crt"] for n in SECRETS}
    assert len(ca) == 1
