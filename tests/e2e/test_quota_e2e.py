"""vGPU quotas on the real kube-apiserver (docs/priority.md, Quotas): what ResourceQuota counts for our extended
resources and what it cannot, and the webhook's quota counting the same namespace's pods from the apiserver."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from tests.e2e.controlplane import ControlPlane
from vgpu.devices import GpuDevice
from webhook.admission import Settings
from webhook.capacity import InventorySummary
from webhook.kube import list_namespace_pods
from webhook.metrics import WebhookMetrics
from webhook.quota import QuotaGuard
from webhook.server import Reviewer
from webhook.testing import make_review

CARD = 81920


def _pod(name: str, **limits: str) -> dict[str, Any]:
    full = {f"nvidia.com/{k.replace('_', '-')}": v for k, v in limits.items()}
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "nobody",  # stays Pending: only admission matters here
            "containers": [{"name": "c", "image": "vllm/vllm-openai:latest", "resources": {"limits": full}}],
        },
    }


class _Inventory:
    expected = True

    def summary(self) -> InventorySummary:
        return InventorySummary.from_nodes([[GpuDevice("g0", 0, "H100", CARD)]])

    def ready(self) -> bool:
        return True


def _quota_refuses(core: client.CoreV1Api, namespace: str, pod: dict[str, Any], timeout: float = 60) -> None:
    """Wait until a dry-run create of `pod` is refused by the quota (the admission plugin's informer has caught up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.create_namespaced_pod(namespace, pod, dry_run="All")
        except client.ApiException as exc:
            if exc.status == 403 and "exceeded quota" in exc.body:
                return
            if exc.status not in (403, 409):  # 409: the plugin's status write met a newer version; ask again
                raise
        assert time.monotonic() < deadline, f"the quota never refused {pod['metadata']['name']} within {timeout} s"
        time.sleep(0.2)


def test_resource_quota_counts_absolute_mib_and_misses_percentages_which_the_webhook_counts(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    hard = {"requests.nvidia.com/gpu": "4", "requests.nvidia.com/gpumem": "50000"}
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "vgpu"}, "spec": {"hard": hard}})
    # No kube-controller-manager here: write the first status its quota controller would (the admission plugin
    # refuses pods while a quota has no status, and keeps `used` current itself afterwards).
    used0 = dict.fromkeys(hard, "0")
    core.patch_namespaced_resource_quota_status("vgpu", namespace, {"status": {"hard": hard, "used": used0}})
    # The admission plugin reads quotas from the apiserver's own informer, which sees a write a moment later: a quota
    # without status.hard there limits nothing (k8s.io/apiserver v0.34 pkg/admission/plugin/resourcequota/
    # controller.go), and one with a stale status.used counts from it. Dry runs are checked against the same quotas,
    # so each create below follows a dry run that is refused (or admitted) the same way.
    _quota_refuses(core, namespace, _pod("probe", gpu="1", gpumem="60000"))
    core.create_namespaced_pod(namespace, _pod("a", gpu="1", gpumem="30000"))
    _quota_refuses(core, namespace, _pod("b", gpu="1", gpumem="30000"))
    with pytest.raises(client.ApiException) as denied:
        core.create_namespaced_pod(namespace, _pod("b", gpu="1", gpumem="30000"))
    assert denied.value.status == 403
    body = json.loads(denied.value.body)["message"]
    assert "exceeded quota: vgpu" in body and "requested: requests.nvidia.com/gpumem=30k" in body, body
    assert "used: requests.nvidia.com/gpumem=30k" in body and "limited: requests.nvidia.com/gpumem=50k" in body
    # 90 % of an 80 GiB card is 73728 MiB, but ResourceQuota only sees gpumem-percentage's number: admitted.
    core.create_namespaced_pod(namespace, _pod("c", gpu="1", gpumem_percentage="90"))
    quota = core.read_namespaced_resource_quota("vgpu", namespace)
    assert quota.status.used["requests.nvidia.com/gpumem"] == "30k"
    assert quota.status.used["requests.nvidia.com/gpu"] == "2"

    # The webhook's policy counts what the pods will hold, reading them from this apiserver.
    path = tmp_path / "quotas.yaml"
    path.write_text(f"namespaces: {{{namespace}: {{memoryMiB: 120000}}}}\n")
    guard = QuotaGuard(path, lambda ns: list_namespace_pods(core, ns))  # type: ignore[arg-type,return-value]
    reviewer = Reviewer(Settings(), _Inventory(), WebhookMetrics(CollectorRegistry()), guard)
    pod = _pod("d", gpu="1", gpumem="20000")
    pod["metadata"]["namespace"] = namespace
    status, raw = reviewer.handle(json.dumps(make_review(pod)).encode(), mutating=False)
    resp = json.loads(raw)["response"]
    assert status == 200 and resp["allowed"] is False and resp["status"]["code"] == 403
    assert resp["status"]["message"] == (
        f"namespace {namespace}: vGPU memory (MiB) quota exceeded: used 103728 + asked 20000 = 123728 > limit 120000 "
        f"(ConfigMap vgpu-quotas, namespaces.{namespace}.memoryMiB)"
    )
    small = _pod("e", gpu="1", gpumem="16000")
    small["metadata"]["namespace"] = namespace
    resp = json.loads(reviewer.handle(json.dumps(make_review(small)).encode(), mutating=False)[1])["response"]
    assert resp["allowed"] is True
