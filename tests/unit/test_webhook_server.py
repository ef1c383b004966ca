"""The Starlette app in-process (httpx transport, no sockets): routes, status codes, metrics."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from webhook.admission import Settings
from webhook.capacity import InventorySummary
from webhook.metrics import StateCollector, WebhookMetrics
from webhook.server import Reviewer, create_app
from webhook.testing import make_review, patch_ops

with warnings.catch_warnings():  # starlette 1.x nudges towards httpx2; httpx is what we ship
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

GPU_POD = {
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


class _Inv:
    expected = True

    def __init__(self, ready: bool = True) -> None:
        self.is_ready = ready

    def summary(self) -> InventorySummary | None:
        return InventorySummary.static(max_gpu_memory_mib=1000, max_gpus_per_node=2) if self.is_ready else None

    def ready(self) -> bool:
        return self.is_ready


def _client(inv: _Inv | None = None) -> tuple[TestClient, CollectorRegistry]:
    registry = CollectorRegistry()
    inventory = inv or _Inv()
    reviewer = Reviewer(Settings(), inventory, WebhookMetrics(registry))
    StateCollector(cert_not_after=lambda: 1.5e9, inventory=inventory.summary, registry=registry)
    return TestClient(create_app(reviewer)), registry


def test_mutate_and_validate() -> None:
    client, registry = _client()
    r = client.post("/mutate?timeout=10s", json=make_review(GPU_POD, uid="a"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    assert body["response"]["uid"] == "a" and patch_ops(body)
    v = client.post("/validate", json=make_review(GPU_POD, uid="b")).json()
    assert v["response"] == {"uid": "b", "allowed": True}
    assert registry.get_sample_value("vgpu_webhook_reviews_total", {"endpoint": "mutate", "outcome": "mutated"}) == 1
    assert registry.get_sample_value("vgpu_webhook_reviews_total", {"endpoint": "validate", "outcome": "admitted"}) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
    ],
)
def test_non_reviews_are_400(body: bytes) -> None:
    client, registry = _client()
    assert client.post("/mutate", content=body).status_code == 400
    assert registry.get_sample_value("vgpu_webhook_bad_requests_total") == 1


def test_internal_errors_are_denials_not_5xx(monkeypatch: pytest.MonkeyPatch) -> None:
    import webhook.server

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("kaput")

    monkeypatch.setattr(webhook.server, "decide", boom)
    client, registry = _client()
    r = client.post("/mutate", json=make_review(GPU_POD, uid="z"))
    assert r.status_code == 200
    assert r.json()["response"] == {
        "uid": "z",
        "allowed": False,
        "status": {"code": 500, "message": "vgpu-webhook internal error: RuntimeError: kaput"},
    }
    assert registry.get_sample_value("vgpu_webhook_reviews_total", {"endpoint": "mutate", "outcome": "error"}) == 1


def test_health_ready_and_metrics() -> None:
    inv = _Inv(ready=False)
    client, _ = _client(inv)
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 503
    text = client.get("/metrics").text
    assert "vgpu_webhook_inventory_known 0.0" in text
    inv.is_ready = True
    assert client.get("/readyz").status_code == 200
    text = client.get("/metrics").text
    assert "vgpu_webhook_inventory_max_gpus_per_node 2.0" in text
    assert "vgpu_webhook_certificate_expiry_timestamp_seconds 1.5e+09" in text
    assert client.get("/mutate").status_code == 405
