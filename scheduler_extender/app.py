"""The HTTP surface: kube-scheduler's POST verbs plus health, readiness and metrics.

Handlers only convert: bytes -> wire model -> service -> JSON. Malformed bodies get a 400 naming the
problem (a field of the wrong type by its path, vgpu.podshape); the service keeps serving. A body is read while it
streams in and refused with 413 as soon as it passes `max_body` (--max-body-bytes), never read to its end; parsing
and the verbs run on worker threads, so /healthz, /readyz and /metrics answer while a large body is parsed. Who may call is decided below HTTP: with --client-ca-file the TLS
handshake already refused every client without a certificate our CA signed (scheduler_extender.main).
`create_health_app` is the plain-HTTP side for kubelet probes and Prometheus, which present no client
certificate: it carries nothing that changes or reveals allocations beyond the metrics.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from scheduler_extender import schema
from scheduler_extender.service import BadRequest, ExtenderService
from scheduler_extender.threadnames import name_os_thread
from vgpu.clusterfile import dump_cluster
from vgpu.podshape import PodShapeError, check_pod_shape
from vgpu_http.body import TooLarge, json_values, read_capped

log = logging.getLogger(__name__)
# A /filter body holds one pod (etcd stores at most 1.5 MiB of it) and, with nodeCacheCapable, the node names: 5,000
# names are ~0.1 MB. 16 MiB leaves room for the full-NodeList mode of a mid-sized cluster; parsed, such a body
# of tiny JSON values costs a few hundred MiB at worst, under the manifests' 1 GiB limit.
MAX_BODY = 16 * 1024 * 1024
# Parsing holds the GIL: 2.8 million tiny JSON values took 1.7 s and ~300 MiB whatever thread ran it. 200,000 parse
# in ~40 ms into ~15 MiB; a pod has a few hundred, 15,000 node names 15,000.
MAX_JSON_VALUES = 200_000
# Binds in flight at once; more wait for a thread (kube-scheduler's binding goroutines are not bounded). A bind
# takes a few hundred ms when the apiserver keeps up (15 in flight at 50 pods/s); when it does not, more concurrent
# writes only queue there and time out together.
BIND_THREADS = 32
# Threads for /filter, /prioritize and /preempt. kube-scheduler calls the first two one pod at a time (its scheduling
# cycle is serial) and they take the state lock, so more threads would only queue there. A pool of our own, not
# anyio's (starlette.concurrency.run_in_threadpool): its capacity limiter, cancel scope and context copy were ~10 % of
# the event loop thread's CPU in benchmarks/scale.py, paid twice a pod.
VERB_THREADS = 8


def _json(obj: Any, status: int = 200) -> Response:
    try:
        body = orjson.dumps(obj)
    except TypeError:  # an integer over 64 bits echoed from a node object: the standard library writes it
        body = json.dumps(obj, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


def _bad(verb: str, service: ExtenderService, message: str) -> Response:
    service.metrics.bad_requests.labels(verb).inc()
    log.warning("bad request", extra={"verb": verb, "error": message})
    return _json({"Error": message}, status=400)


def _problem(error: Any) -> str:
    """One validation error as `path: what is wrong`; a wire check's message names its whole path itself."""
    if error["type"] == schema.WHOLE_PATH:
        return str(error["msg"])
    return f"{'.'.join(str(p) for p in error['loc']) or '<body>'}: {error['msg']}"


def _parse(body: bytes, verb: str, model: type[BaseModel]) -> Any:
    """Bytes -> wire model, the pod's field types checked (on a worker thread: linear, but up to MAX_BODY)."""
    if not body:
        raise BadRequest(f"{verb}: empty body; expected a JSON {model.__name__}")
    try:
        args = model.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors()[:5])
        raise BadRequest(f"{verb}: invalid {model.__name__}: {problems}"[:2048]) from None
    pod = getattr(args, "Pod", None)
    if pod is not None:
        try:
            check_pod_shape(pod, "Pod")
        except PodShapeError as exc:
            raise BadRequest(f"{verb}: invalid {model.__name__}: {exc}"[:2048]) from None
    return args


def _serve(body: bytes, verb: str, model: type[BaseModel], call: Callable[[Any], Any]) -> Any:
    """Parse the body into the wire model and run the verb on it (on a worker thread)."""
    return call(_parse(body, verb, model))


def create_app(
    service: ExtenderService,
    *,
    state: bool = False,
    probes: bool = True,
    max_body: int = MAX_BODY,
    max_values: int = MAX_JSON_VALUES,
) -> Starlette:
    """The verbs; `/state` only with `state` (--enable-state); health, readiness and metrics with `probes`
    (off when --health-port serves them on their own port)."""

    # /bind waits on apiserver round trips (a second and more under load, benchmarks/scale.py): on threads of its
    # own it never takes the worker threads that /filter and /prioritize, kube-scheduler's serial scheduling cycle,
    # need.
    # Named for the kernel too (scheduler_extender.threadnames): benchmarks/scale.py splits the CPU by thread.
    bind_threads = concurrent.futures.ThreadPoolExecutor(
        BIND_THREADS, thread_name_prefix="bind", initializer=name_os_thread
    )
    verb_threads = concurrent.futures.ThreadPoolExecutor(
        VERB_THREADS, thread_name_prefix="verb", initializer=name_os_thread
    )

    def verb_route(verb: str, model: type[BaseModel], call: Callable[[Any], Any]) -> Route:
        hist = service.metrics.latency.labels(verb)

        async def handler(request: Request) -> Response:
            if not service.leading.is_set():
                service.metrics.standby_refusals.labels(verb).inc()
                leader = service.leader or "unknown"
                return _json({"Error": f"{verb}: this extender replica stands by; the leader is {leader}"}, status=503)
            started = time.perf_counter()
            try:
                body = await read_capped(request, max_body, what=f"{verb}: body", setting="--max-body-bytes")
                if (values := json_values(body)) > max_values:
                    raise TooLarge(f"{verb}: {values} JSON values; at most {max_values} allowed (--max-json-values)")
                # One worker-thread hop for parse and verb: each hop is a queue hand-over and a thread wake-up,
                # paid three times a pod (filter, prioritize, bind) on kube-scheduler's serial scheduling cycle.
                threads = bind_threads if verb == "bind" else verb_threads
                result = await asyncio.get_running_loop().run_in_executor(threads, _serve, body, verb, model, call)
                del body
            except ClientDisconnect:  # gone, or cut by the read deadline (vgpu_http.guard)
                return Response(status_code=400)
            except TooLarge as exc:
                service.metrics.bad_requests.labels(verb).inc()
                log.warning("body too large", extra={"verb": verb, "error": str(exc)})
                return _json({"Error": str(exc)}, status=413)
            except BadRequest as exc:
                return _bad(verb, service, str(exc))
            if verb != "bind":
                hist.observe(time.perf_counter() - started)
            return _json(result)

        return Route(f"/{verb}", handler, methods=["POST"])

    async def state_view(request: Request) -> Response:
        """Who holds which slice, in the cluster-file format (`vgpu show` reads it)."""

        def dump() -> dict[str, Any]:
            with service.lock:
                nodes = [n.inventory for n in service.state.nodes.values()]
                return dump_cluster(nodes, sorted(service.state.assignments.items()))

        return _json(await run_in_threadpool(dump))  # the lock may be held by a verb: wait off the event loop

    async def state_off(request: Request) -> Response:
        return PlainTextResponse(
            "/state is off: start the extender with --enable-state to list allocations (behind the same mTLS)",
            status_code=404,
        )

    routes = [
        verb_route("filter", schema.ExtenderArgs, service.filter),
        verb_route("prioritize", schema.ExtenderArgs, service.prioritize),
        verb_route("bind", schema.ExtenderBindingArgs, service.bind),
        verb_route("preempt", schema.ExtenderPreemptionArgs, service.preempt),
        Route("/state", state_view if state else state_off),
    ]
    if probes:
        routes += _probe_routes(service)
    app = Starlette(routes=routes)
    app.state.max_body, app.state.max_values = max_body, max_values
    return app


def create_health_app(service: ExtenderService, verbs_listening: Callable[[], bool]) -> Starlette:
    """Only /healthz, /readyz and /metrics, for --health-port (plain HTTP). The probes start before the verbs'
    server binds its port, so /readyz also asks `verbs_listening`: ready must mean kube-scheduler's calls connect."""
    return Starlette(routes=_probe_routes(service, verbs_listening))


def _probe_routes(service: ExtenderService, verbs_listening: Callable[[], bool] = lambda: True) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        """Synced, leader or not: a synced standby is ready to take over (and a rolling update can proceed);
        the Service routes to the leader by its label."""
        if not service.ready.is_set():
            return PlainTextResponse("state not synced yet", status_code=503)
        if not verbs_listening():
            return PlainTextResponse("the verbs' port is not listening yet", status_code=503)
        return PlainTextResponse("ok")

    async def metrics(request: Request) -> Response:

        def scrape() -> bytes:
            return service.metrics.exposition(service.lock)  # the state lock only for the allocation view

        return Response(await run_in_threadpool(scrape), media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
