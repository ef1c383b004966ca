"""Per-namespace vGPU quotas (vgpu.quota, webhook.quota): the policy's errors, what a pod counts, and denials through
the webhook's Reviewer naming namespace, resource, used, asked and limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from vgpu.devices import GpuDevice
from vgpu.quota import QuotaPolicyError, Usage, parse_policy, pod_usage, violation
from vgpu.requests import parse_pod_request
from webhook.admission import Settings
from webhook.capacity import InventorySummary
from webhook.metrics import WebhookMetrics
from webhook.quota import QuotaGuard
from webhook.server import Reviewer
from webhook.testing import make_review

CARD = 81920


class _Inventory:
    expected = True

    def summary(self) -> InventorySummary:
        return InventorySummary.from_nodes([[GpuDevice(f"g{i}", i, "H100", CARD) for i in range(2)]])

    def ready(self) -> bool:
        return True


def _pod(name: str, ns: str = "team-a", **limits: str) -> dict[str, Any]:
    full = {f"nvidia.com/{k.replace('_', '-')}": v for k, v in limits.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": full}}]},
    }


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("namespaces: [a]", "namespaces: expected a mapping"),
        ("limits: {}", "unknown key(s) ['limits']; allowed: namespaces"),
        ("namespaces: {a: {memory: 1}}", "namespaces.a.memory: unknown resource; allowed: memoryMiB, cores"),
        ("namespaces: {a: {cores: -1}}", "namespaces.a.cores: -1; expected an integer >= 0"),
        ("namespaces: {a: {cores: '5'}}", "namespaces.a.cores: '5'; expected an integer >= 0"),
        ("{", "not YAML/JSON"),
    ],
)
def test_policy_errors_name_the_key_and_what_is_allowed(text: str, fragment: str) -> None:
    with pytest.raises(QuotaPolicyError, match=None) as err:
        parse_policy(text, "cm")
    assert fragment in str(err.value) and str(err.value).startswith("cm: ")


def test_usage_counts_percentages_on_the_card_and_default_cores_proportionally() -> None:
    r = parse_pod_request(_pod("p", gpu="2", gpumem_percentage="25"))
    assert pod_usage(r, CARD) == Usage(2 * CARD // 4, 2 * 25)
    r = parse_pod_request(_pod("p", gpu="1", gpumem="10000", gpucores="30"))
    assert pod_usage(r, CARD) == Usage(10000, 30)
    msg = violation("team-a", {"memoryMiB": 50000}, Usage(45000, 0), Usage(10000, 30), "cm")
    assert msg == (
        "namespace team-a: vGPU memory (MiB) quota exceeded: used 45000 + asked 10000 = 55000 > limit 50000 "
        "(cm, namespaces.team-a.memoryMiB)"
    )
    assert violation("team-a", {"memoryMiB": 55000}, Usage(45000, 0), Usage(10000, 30), "cm") is None


def _reviewer(tmp_path: Path, policy: str, pods: dict[str, list[dict[str, Any]]]) -> tuple[Reviewer, list[str]]:
    path = tmp_path / "quotas.yaml"
    path.write_text(policy)
    asked: list[str] = []

    def list_pods(ns: str) -> list[dict[str, Any]]:
        asked.append(ns)
        return pods.get(ns, [])

    guard = QuotaGuard(path, list_pods)  # type: ignore[arg-type]
    return Reviewer(Settings(), _Inventory(), WebhookMetrics(CollectorRegistry()), guard), asked


def _review(reviewer: Reviewer, pod: dict[str, Any]) -> dict[str, Any]:
    status, body = reviewer.handle(json.dumps(make_review(pod)).encode(), mutating=False)
    assert status == 200
    resp: dict[str, Any] = json.loads(body)["response"]
    return resp


def test_the_webhook_denies_a_pod_past_its_namespace_quota(tmp_path: Path) -> None:
    running = [_pod("a", gpu="1", gpumem_percentage="50"), _pod("b", gpu="1", gpumem="20000", gpucores="10")]
    done = _pod("old", gpu="1", gpumem="80000")
    done["status"] = {"phase": "Succeeded"}  # finished pods hold nothing
    reviewer, asked = _reviewer(
        tmp_path, "namespaces: {team-a: {memoryMiB: 81920, cores: 100}}", {"team-a": [*running, done]}
    )
    # used: 40960 + 20000 = 60960 MiB, 50 + 10 = 60 cores.
    ok = _review(reviewer, _pod("fits", gpu="1", gpumem="20000", gpucores="40"))
    assert ok["allowed"] is True
    over = _review(reviewer, _pod("big", gpu="1", gpumem="30000", gpucores="10"))
    assert over["allowed"] is False and over["status"]["code"] == 403
    assert over["status"]["message"] == (
        "namespace team-a: vGPU memory (MiB) quota exceeded: used 60960 + asked 30000 = 90960 > limit 81920 "
        "(ConfigMap vgpu-quotas, namespaces.team-a.memoryMiB)"
    )
    cores = _review(reviewer, _pod("sm", gpu="1", gpumem="1000", gpucores="50"))
    assert (
        "vGPU cores (% of one GPU) quota exceeded: used 60 + asked 50 = 110 > limit 100" in cores["status"]["message"]
    )
    # Other namespaces and pods without vGPUs are never listed.
    assert _review(reviewer, _pod("free", ns="team-b", gpu="1", gpumem="80000"))["allowed"] is True
    no_gpu = _pod("cpu")
    no_gpu["spec"]["containers"][0]["resources"] = {}
    assert _review(reviewer, no_gpu)["allowed"] is True
    assert asked == ["team-a", "team-a", "team-a"]


def test_an_edited_policy_applies_and_an_invalid_one_denies_with_its_error(tmp_path: Path) -> None:
    reviewer, _ = _reviewer(tmp_path, "namespaces: {team-a: {memoryMiB: 1000}}", {})
    assert _review(reviewer, _pod("p", gpu="1", gpumem="2000"))["allowed"] is False
    path = tmp_path / "quotas.yaml"
    path.write_text("namespaces: {team-a: {memoryMiB: 100000}}  # raised\n")
    assert _review(reviewer, _pod("p", gpu="1", gpumem="2000"))["allowed"] is True
    path.write_text("namespaces: {team-a: {gpus: 1}}\n")
    denied = _review(reviewer, _pod("p", gpu="1", gpumem="2000"))
    assert denied["allowed"] is False
    assert "namespaces.team-a.gpus: unknown resource; allowed: memoryMiB, cores" in denied["status"]["message"]
    path.unlink()  # no policy at all: no quota
    assert _review(reviewer, _pod("p", gpu="1", gpumem="2000"))["allowed"] is True
