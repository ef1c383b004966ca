"""The HTTP surface: kube-scheduler's POST verbs plus health, readiness and metrics.

Handlers only convert: bytes -> wire model -> service -> JSON. Malformed bodies get a 400 naming the
problem; the service keeps serving. Who may call is decided below HTTP: with --client-ca-file the TLS
handshake already refused every client without a certificate our CA signed (scheduler_extender.main).
`create_health_app` is the plain-HTTP side for kubelet probes and Prometheus, which present no client
certificate: it carries nothing that changes or reveals allocations beyond the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from scheduler_extender import schema
from scheduler_extender.service import BadRequest, ExtenderService
from vgpu.clusterfile import dump_cluster

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024 * 1024


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _bad(verb: str, service: ExtenderService, message: str) -> Response:
    service.metrics.bad_requests.labels(verb).inc()
    log.warning("bad request", extra={"verb": verb, "error": message})
    return _json({"Error": message}, status=400)


async def _read(request: Request, verb: str, model: type[BaseModel]) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY:
        raise BadRequest(f"{verb}: body of {len(body)} bytes exceeds {MAX_BODY}")
    if not body:
        raise BadRequest(f"{verb}: empty body; expected a JSON {model.__name__}")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in exc.errors()[:5])
        raise BadRequest(f"{verb}: invalid {model.__name__}: {problems}") from None


def create_app(service: ExtenderService, *, state: bool = False, probes: bool = True) -> Starlette:
    """The verbs; `/state` only with `state` (--enable-state); health, readiness and metrics with `probes`
    (off when --health-port serves them on their own port)."""

    def verb_route(verb: str, model: type[BaseModel], call: Callable[[Any], Any], *, threaded: bool = False) -> Route:
        hist = service.metrics.latency.labels(verb)

        async def handler(request: Request) -> Response:
            if not service.leading.is_set():
                service.metrics.standby_refusals.labels(verb).inc()
                leader = service.leader or "unknown"
                return _json({"Error": f"{verb}: this extender replica stands by; the leader is {leader}"}, status=503)
            started = time.perf_counter()
            try:
                args = await _read(request, verb, model)
                result = await run_in_threadpool(call, args) if threaded else call(args)
            except BadRequest as exc:
                return _bad(verb, service, str(exc))
            if verb != "bind":
                hist.observe(time.perf_counter() - started)
            return _json(result)

        return Route(f"/{verb}", handler, methods=["POST"])

    async def state_view(request: Request) -> Response:
        """Who holds which slice, in the cluster-file format (`vgpu show` reads it)."""
        with service.lock:
            nodes = [n.inventory for n in service.state.nodes.values()]
            doc = dump_cluster(nodes, sorted(service.state.assignments.items()))
        return _json(doc)

    async def state_off(request: Request) -> Response:
        return PlainTextResponse(
            "/state is off: start the extender with --enable-state to list allocations (behind the same mTLS)",
            status_code=404,
        )

    routes = [
        verb_route("filter", schema.ExtenderArgs, service.filter),
        verb_route("prioritize", schema.ExtenderArgs, service.prioritize),
        verb_route("bind", schema.ExtenderBindingArgs, service.bind, threaded=True),
        Route("/state", state_view if state else state_off),
    ]
    if probes:
        routes += _probe_routes(service)
    return Starlette(routes=routes)


def create_health_app(service: ExtenderService) -> Starlette:
    """Only /healthz, /readyz and /metrics, for --health-port (plain HTTP)."""
    return Starlette(routes=_probe_routes(service))


def _probe_routes(service: ExtenderService) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        """Synced, leader or not: a synced standby is ready to take over (and a rolling update can proceed);
        the Service routes to the leader by its label."""
        if service.ready.is_set():
            return PlainTextResponse("ok")
        return PlainTextResponse("state not synced yet", status_code=503)

    async def metrics(request: Request) -> Response:
        with service.lock:
            body = generate_latest(service.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
