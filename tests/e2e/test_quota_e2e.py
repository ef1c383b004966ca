"""vGPU quotas on the real kube-apiserver (docs/priority.md, Quotas): what ResourceQuota counts for our extended
resources and what it cannot, and the webhook's quota counting the same namespace's pods from the apiserver."""

from __future__ import annotations

import json
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
    core.create_namespaced_pod(namespace, _pod("a", gpu="1", gpumem="30000"))
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
