"""Prometheus metrics of the webhook, registered on a registry the caller passes in (tests use a fresh one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook.capacity import InventorySummary

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reviews = Counter(
            "vgpu_webhook_reviews",
            "AdmissionReviews answered, by endpoint and outcome (skipped|admitted|mutated|denied|error).",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "vgpu_webhook_review_seconds",
            "Time to decide and encode one AdmissionReview (excluding TLS and HTTP).",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.bad_requests = Counter(
            "vgpu_webhook_bad_requests", "Bodies that were not an AdmissionReview v1 (HTTP 400).", registry=registry
        )
        self.cert_reloads = Counter(
            "vgpu_webhook_certificate_reloads", "Certificate reload attempts, by result.", ["result"], registry=registry
        )


class StateCollector(Collector):
    """Certificate expiry and inventory size, read from their sources at scrape time."""

    def __init__(
        self,
        *,
        cert_not_after: Callable[[], float | None],
        inventory: Callable[[], InventorySummary | None],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._cert_not_after = cert_not_after
        self._inventory = inventory
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        not_after = self._cert_not_after()
        if not_after is not None:
            yield GaugeMetricFamily(
                "vgpu_webhook_certificate_expiry_timestamp_seconds",
                "notAfter of the serving certificate in use (Unix time).",
                value=not_after,
            )
        summary = self._inventory()
        known = GaugeMetricFamily(
            "vgpu_webhook_inventory_known", "1 when capacity checks have a cluster inventory to use.", value=0
        )
        if summary is None:
            yield known
            return
        known = GaugeMetricFamily(known.name, known.documentation, value=1)
        yield known
        yield GaugeMetricFamily(
            "vgpu_webhook_inventory_node_shapes", "Distinct node GPU shapes known.", value=len(summary.nodes)
        )
        yield GaugeMetricFamily(
            "vgpu_webhook_inventory_max_gpu_memory_mib",
            "Largest GPU memory in the cluster (MiB).",
            value=summary.max_gpu_memory_mib,
        )
        yield GaugeMetricFamily(
            "vgpu_webhook_inventory_max_gpus_per_node",
            "Most GPUs on one node.",
            value=summary.max_gpus_per_node,
        )
