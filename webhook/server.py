"""HTTP layer: `/mutate`, `/validate`, `/healthz`, `/readyz`, `/metrics` on Starlette.

Handlers only translate: bytes -> AdmissionReview -> `admission.decide` -> response bytes. Anything
that is an AdmissionReview gets HTTP 200 with a valid response — an unexpected exception becomes a
denial with status code 500, never an HTTP 5xx (which the apiserver would count as a webhook failure
and resolve by `failurePolicy` with a far less helpful message). Only bodies that are not an
AdmissionReview v1 get HTTP 400.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from webhook.admission import Outcome, Settings, decide, deny, review_dict
from webhook.inventory import InventorySource
from webhook.metrics import WebhookMetrics
from webhook.review import AdmissionReview

log = logging.getLogger(__name__)


class Reviewer:
    """Bytes in, (HTTP status, bytes out); no HTTP framework types, so tests and benchmarks call it directly."""

    def __init__(self, settings: Settings, inventory: InventorySource, metrics: WebhookMetrics) -> None:
        self.settings = settings
        self.inventory = inventory
        self.metrics = metrics

    def handle(self, body: bytes, *, mutating: bool) -> tuple[int, bytes]:
        endpoint = "mutate" if mutating else "validate"
        start = time.perf_counter()
        try:
            review = AdmissionReview.model_validate(orjson.loads(body))
        except (orjson.JSONDecodeError, ValidationError, TypeError) as exc:
            self.metrics.bad_requests.inc()
            return 400, f"not an admission.k8s.io/v1 AdmissionReview: {_first_line(exc)}".encode()
        request = review.request
        if request is None:
            self.metrics.bad_requests.inc()
            return 400, b"AdmissionReview has no request"
        try:
            outcome = decide(
                request,
                self.settings,
                self.inventory.summary(),
                mutating=mutating,
                inventory_expected=self.inventory.expected,
            )
        except Exception as exc:  # a bug must still answer the apiserver with a readable denial
            log.exception("internal error reviewing %s", _who(request.object, request.namespace))
            outcome = deny(f"vgpu-webhook internal error: {type(exc).__name__}: {exc}", code=500, kind="error")
        out = orjson.dumps(review_dict(request.uid, outcome))
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        self.metrics.reviews.labels(endpoint, outcome.kind).inc()
        _log(endpoint, request.object, request.namespace, outcome)
        return 200, out


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _who(pod: Any, namespace: str) -> str:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name") or (str(meta.get("generateName") or "") + "*")
    return f"{namespace or meta.get('namespace') or 'default'}/{name}"


def _log(endpoint: str, pod: Any, namespace: str, outcome: Outcome) -> None:
    level = logging.INFO if outcome.kind in ("mutated", "denied", "error") else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    log.log(
        level,
        "%s %s: %s",
        endpoint,
        _who(pod, namespace),
        outcome.kind,
        extra={
            "pod": _who(pod, namespace),
            "outcome": outcome.kind,
            "patchOps": len(outcome.ops),
            "warnings": list(outcome.warnings),
            "denial": outcome.message or None,
            **outcome.details,
        },
    )


def create_app(reviewer: Reviewer) -> Starlette:
    async def mutate(request: Request) -> Response:
        status, body = reviewer.handle(await request.body(), mutating=True)
        return Response(body, status, media_type="application/json" if status == 200 else "text/plain")

    async def validate(request: Request) -> Response:
        status, body = reviewer.handle(await request.body(), mutating=False)
        return Response(body, status, media_type="application/json" if status == 200 else "text/plain")

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if reviewer.inventory.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("waiting for the node inventory", status_code=503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(reviewer.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/mutate", mutate, methods=["POST"]),
            Route("/validate", validate, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
