"""HTTP layer: `/mutate`, `/validate`, `/validate-eviction`, `/healthz`, `/readyz`, `/metrics` on Starlette.

Handlers only translate: bytes -> AdmissionReview -> `admission.decide` -> response bytes. Anything
that is an AdmissionReview gets HTTP 200 with a valid response — an unexpected exception becomes a
denial with status code 500, never an HTTP 5xx (which the apiserver would count as a webhook failure
and resolve by `failurePolicy` with a far less helpful message). Only bodies that are not an
AdmissionReview v1 get HTTP 400, and bodies over `max_body` (max_body_bytes) HTTP 413 as soon as they pass it
while streaming in, unread beyond that. Reviews run on worker threads, so /healthz, /readyz and /metrics answer
while a large review is parsed; a pod whose fields have the wrong JSON types is denied naming the field
(vgpu.podshape), never with an internal error.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from vgpu.requests import parse_pod_request
from vgpu_http.body import TooLarge, json_values, read_capped
from webhook.admission import Outcome, Settings, decide, deny, review_dict
from webhook.eviction import PodLookup, decide_eviction
from webhook.inventory import InventorySource
from webhook.metrics import WebhookMetrics
from webhook.quota import QuotaGuard
from webhook.review import AdmissionReview

log = logging.getLogger(__name__)
# The apiserver refuses request bodies over 3 MiB (k8s.io/apiserver pkg/server/config.go, NewConfig:
# MaxRequestBodyBytes: int64(3 * 1024 * 1024)), so a review carries at most two such pods (object, oldObject).
MAX_BODY = 8 * 1024 * 1024
# Parsing holds the GIL: 2.8 million tiny JSON values took 1.7 s and 354 MiB (over the 256 Mi limit). 200,000 parse in
# ~40 ms into ~15 MiB; a pod has a few hundred.
MAX_JSON_VALUES = 200_000


class Reviewer:
    """Bytes in, (HTTP status, bytes out); no HTTP framework types, so tests and benchmarks call it directly."""

    def __init__(
        self,
        settings: Settings,
        inventory: InventorySource,
        metrics: WebhookMetrics,
        quota: QuotaGuard | None = None,
        pods: PodLookup | None = None,
    ) -> None:
        self.settings = settings
        self.inventory = inventory
        self.metrics = metrics
        self.quota = quota  # per-namespace vGPU memory/cores (webhook.quota); None: no quotas
        self.pods = pods  # reads a pod for the eviction guard (webhook.kube.find_pod); None: no apiserver access

    def handle(self, body: bytes, *, mutating: bool) -> tuple[int, bytes]:
        return self._handle(body, "mutate" if mutating else "validate")

    def handle_eviction(self, body: bytes) -> tuple[int, bytes]:
        """An eviction of a pod (webhook.eviction): only those of the node's own pods pass."""
        return self._handle(body, "validate-eviction")

    def _handle(self, body: bytes, endpoint: str) -> tuple[int, bytes]:
        mutating = endpoint == "mutate"
        start = time.perf_counter()
        try:
            review = AdmissionReview.model_validate_json(body)
        except (ValidationError, TypeError, ValueError) as exc:
            self.metrics.bad_requests.inc()
            return 400, f"not an admission.k8s.io/v1 AdmissionReview: {_first_line(exc)}".encode()
        request = review.request
        if request is None:
            self.metrics.bad_requests.inc()
            return 400, b"AdmissionReview has no request"
        try:
            if endpoint == "validate-eviction":
                outcome = decide_eviction(request, self.pods)
            else:
                outcome = decide(
                    request,
                    self.settings,
                    self.inventory.summary(),
                    mutating=mutating,
                    inventory_expected=self.inventory.expected,
                )
                if outcome.allowed and outcome.kind != "skipped" and self.quota is not None:
                    outcome = self._quota(request, outcome)
        except Exception as exc:  # a bug must still answer the apiserver with a readable denial
            log.exception("internal error reviewing %s", _who(request.object, request.namespace))
            outcome = deny(f"vgpu-webhook internal error: {type(exc).__name__}: {exc}", code=500, kind="error")
        out = orjson.dumps(review_dict(request.uid, outcome))
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        self.metrics.reviews.labels(endpoint, outcome.kind).inc()
        if endpoint == "validate-eviction":
            _log_eviction(request.userInfo.username, request.namespace, request.name, outcome)
        else:
            _log(endpoint, request.object, request.namespace, outcome)
        return 200, out

    def _quota(self, request: Any, outcome: Outcome) -> Outcome:
        """Deny (403, as ResourceQuota does) a vGPU pod whose slices pass its namespace's quota."""
        assert self.quota is not None
        pod_request = parse_pod_request(request.object, self.settings.names, self.settings.defaults)
        summary = self.inventory.summary()
        card = summary.max_gpu_memory_mib if summary is not None else 0
        namespace = request.namespace or (request.object.get("metadata") or {}).get("namespace") or "default"
        why = self.quota.check(namespace, pod_request, card)
        return outcome if why is None else deny(why, code=403)


def _first_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):  # each problem with its field path, a few at most
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in exc.errors()[:3])[
            :2048
        ]
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


def _log_eviction(user: str, namespace: str, name: str, outcome: Outcome) -> None:
    """Every eviction the guard judged, at INFO: they are rare, and a refusal is what an admin looks for."""
    log.info(
        "validate-eviction %s/%s by %s: %s",
        namespace,
        name,
        user,
        "allowed" if outcome.allowed else "refused",
        extra={"pod": f"{namespace}/{name}", "user": user, "outcome": outcome.kind, "denial": outcome.message or None},
    )


def create_app(reviewer: Reviewer, *, max_body: int = MAX_BODY, max_values: int = MAX_JSON_VALUES) -> Starlette:
    async def review(request: Request, *, mutating: bool, eviction: bool = False) -> Response:
        try:
            body = await read_capped(request, max_body, what="AdmissionReview", setting="max_body_bytes")
            if (values := json_values(body)) > max_values:
                raise TooLarge(
                    f"AdmissionReview of {values} JSON values; at most {max_values} allowed (max_json_values)"
                )
        except TooLarge as exc:
            reviewer.metrics.bad_requests.inc()
            log.warning("%s", exc)
            return PlainTextResponse(str(exc), status_code=413)
        except ClientDisconnect:  # gone, or cut by the read deadline (vgpu_http.guard)
            return Response(status_code=400)
        if eviction:  # the pod is read from the apiserver: off the event loop, as every review runs
            status, out = await run_in_threadpool(reviewer.handle_eviction, body)
        else:
            status, out = await run_in_threadpool(reviewer.handle, body, mutating=mutating)
        return Response(out, status, media_type="application/json" if status == 200 else "text/plain")

    async def mutate(request: Request) -> Response:
        return await review(request, mutating=True)

    async def validate(request: Request) -> Response:
        return await review(request, mutating=False)

    async def validate_eviction(request: Request) -> Response:
        return await review(request, mutating=False, eviction=True)

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if reviewer.inventory.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("waiting for the node inventory", status_code=503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(reviewer.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/mutate", mutate, methods=["POST"]),
            Route("/validate", validate, methods=["POST"]),
            Route("/validate-eviction", validate_eviction, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
    app.state.max_body, app.state.max_values = max_body, max_values
    return app
