"""`vgpu-extender`: wires settings, state source, service and HTTP server together."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import signal
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette

from scheduler_extender import gcpause
from scheduler_extender.app import create_app, create_health_app
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.service import ExtenderService, ServiceOptions
from scheduler_extender.settings import ENV_PREFIX, SCHEMA, ExtenderSettings, SettingsError, read_text
from vgpu.errors import VgpuError
from vgpu.logs import configure
from vgpu.prerequisites import missing_path, no_kube_api
from vgpu.state import ClusterState
from vgpu_http.serving import server_options

if TYPE_CHECKING:
    from scheduler_extender.leadership import Election

log = logging.getLogger("scheduler_extender")


def build_parser() -> argparse.ArgumentParser:
    """Every flag, with its description, default, env variable and file key, generated from ExtenderSettings."""
    return SCHEMA.parser()


def _ssl_kwargs(s: ExtenderSettings) -> dict[str, object]:
    """HTTPS, and with --client-ca-file mutual TLS: CERT_REQUIRED makes the handshake itself fail for a client
    without a certificate our CA signed, so no request of it ever reaches a handler."""
    if s.tls_cert_file is None:
        return {}
    out: dict[str, object] = {
        "ssl_certfile": str(s.tls_cert_file),
        "ssl_keyfile": str(s.tls_key_file),
        "ssl_version": ssl.PROTOCOL_TLS_SERVER,
    }
    if s.client_ca_file is not None:
        out |= {"ssl_ca_certs": str(s.client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return out


def _connection_limits(s: ExtenderSettings, *, in_thread: bool = False) -> dict[str, object]:
    """What bounds a connection and what serves it (vgpu_http.serving): a deadline on reading each request and a 16 KiB
    head cap (the guarded httptools protocol, h11 where httptools is missing), uvicorn's keep-alive timeout between
    requests and its connection cap, on uvloop where installed."""
    return server_options(
        read_timeout_s=s.request_read_timeout_seconds, max_connections=s.max_connections, in_thread=in_thread
    )


def verbs_server(app: Starlette, **options: Any) -> uvicorn.Server:
    """The verbs' server, built rather than `uvicorn.run`: /readyz on the health port reads its `started`."""
    return uvicorn.Server(uvicorn.Config(app, **options))


def _start_health_server(
    s: ExtenderSettings, service: ExtenderService, verbs: uvicorn.Server
) -> tuple[uvicorn.Server, threading.Thread] | None:
    """--health-port: /healthz, /readyz and /metrics over plain HTTP in a thread. A kubelet HTTPS probe presents no
    client certificate (kubernetes pkg/probe/http/http.go, New(): a tls.Config with InsecureSkipVerify and no
    Certificates), so probes cannot go through the mTLS port. Returns the server and its thread, which main joins
    before exiting: no server loop is still shutting down on a daemon thread while the interpreter finalises (with
    uvloop that crashed the process by SIGSEGV instead of its exit code; this thread runs asyncio's loop now)."""
    if s.health_port is None:
        return None
    config = uvicorn.Config(
        create_health_app(service, lambda: verbs.started),
        host=s.address,
        port=s.health_port,
        log_level="warning",
        access_log=False,
        **_connection_limits(s, in_thread=True),  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)  # off the main thread uvicorn installs no signal handlers
    thread = threading.Thread(target=server.run, name="health-server", daemon=True)
    thread.start()
    return server, thread


def _metrics(s: ExtenderSettings, state: ClusterState) -> ExtenderMetrics:
    return ExtenderMetrics(state, per_gpu=s.allocation_metrics == "per-gpu")


def build_service(s: ExtenderSettings) -> tuple[ExtenderService, object | None, Election | None]:
    """The service plus, for the kube source, the running source (so callers can stop it) and, with
    --leader-elect, the election (so main can release the lease on shutdown)."""
    state = ClusterState(s.placement())
    options = ServiceOptions(
        names=s.resource_names(),
        narrow_filter=s.narrow_filter,
        filter_answers_one=s.filter_answers_one,
        bind_grace_s=s.bind_grace_seconds,
        relearn_interval_s=s.relearn_interval_seconds,
        max_node_names=s.max_node_names,
        bind_timeout_s=s.bind_timeout_seconds,
    )
    lock = threading.RLock()
    if s.source == "file":
        from scheduler_extender.sources.file import FileBinder, load_cluster_file

        assert s.cluster_file is not None
        with gcpause.paused_gc():  # a list like the kube source's: frozen after it in the extender's process
            nodes = load_cluster_file(s.cluster_file, state)
            state.classify()  # what the first pass would work out, frozen with the state
        binder = FileBinder(state, nodes, state_lock=lock, persist_to=s.cluster_file if s.persist else None)
        options = dataclasses.replace(options, pods_from_filter=True)  # no apiserver to read pods from
        service = ExtenderService(state, binder, options=options, lock=lock, metrics=_metrics(s, state))
        service.ready.set()
        return service, None, None
    import functools

    from kubernetes import config

    from scheduler_extender.kube import CallTimeouts, KubeBinder, configure_timeouts, core_api, list_pdbs, nudge_pod
    from scheduler_extender.leadership import start_leader_election
    from scheduler_extender.requeue import Requeuer
    from scheduler_extender.sources.kube import KubeSource

    try:
        if s.kubeconfig is not None:
            config.load_kube_config(config_file=str(s.kubeconfig))
        else:
            config.load_incluster_config()
    except config.ConfigException as exc:
        raise MissingPrerequisite(
            no_kube_api(
                "vgpu-extender",
                kubeconfig=str(s.kubeconfig or ""),
                reason=str(exc),
                flag="--kubeconfig",
                env=ENV_PREFIX + "KUBECONFIG",
                alternative="run with --source file --cluster-file PATH",
            )
        ) from exc
    configure_timeouts(
        CallTimeouts(
            call_s=s.apiserver_call_timeout_seconds,
            connect_s=s.apiserver_connect_timeout_seconds,
            list_s=s.apiserver_list_timeout_seconds,
            watch_read_slack_s=s.watch_read_slack_seconds,
        )
    )
    api = core_api()  # its connection pool sized for the verbs' worker threads (kube.POOL_SIZE)
    metrics = _metrics(s, state)
    requeuer = Requeuer(
        functools.partial(nudge_pod, api),
        max_pods=s.requeue_max_pods,
        interval_s=s.requeue_interval_seconds,
        metrics=metrics,
    )
    service = ExtenderService(
        state, KubeBinder(api), options=options, lock=lock, metrics=metrics, requeuer=requeuer, list_pdbs=list_pdbs
    )
    requeuer.start()
    election = start_leader_election(s, service, api) if s.leader_elect else None
    source = KubeSource(api, service, watch_timeout_s=s.watch_timeout_seconds)
    source.start()
    reaper = threading.Thread(target=_reap, args=(service, s.bind_grace_seconds / 4), name="reaper", daemon=True)
    reaper.start()
    return service, source, election


class MissingPrerequisite(Exception):
    """The extender cannot start here (no apiserver, a missing file); the message says what to pass."""


def _missing_file(s: ExtenderSettings) -> str | None:
    """The first file setting (TLS certificate, key, CA, cluster file) that names no existing file."""
    for name in type(s).model_fields:
        value = getattr(s, name)
        if name.endswith("_file") and isinstance(value, Path) and not value.is_file():
            flag = "--" + name.replace("_", "-")
            return missing_path(
                "vgpu-extender", what=name.replace("_", " "), path=str(value), flag=flag, env=ENV_PREFIX + name.upper()
            )
    return None


class Terminated(Exception):
    """SIGTERM arrived: a clean shutdown."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _reap(service: ExtenderService, interval: float) -> None:
    """Expire reservations of binds that never completed, also while no pod is being scheduled."""
    while True:
        time.sleep(interval)
        service.expire_unbound()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = SCHEMA.load_args(args, os.environ, read_text)
    except SettingsError as exc:
        print(f"vgpu-extender: {exc}", file=sys.stderr)
        return 2
    problem = settings.serving_problem()
    if problem is not None:
        print(f"vgpu-extender: {problem}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1` dumps every thread's stack
    missing = _missing_file(settings)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    gcpause.freeze_after_lists()  # this process's state lives as long as it does (scheduler_extender.gcpause)
    gcpause.time_collections()  # vgpu_extender_gc_seconds_total
    try:
        service, _source, election = build_service(settings)
    except MissingPrerequisite as exc:
        print(exc, file=sys.stderr)
        return 2
    except (VgpuError, OSError) as exc:
        print(f"vgpu-extender: cannot load cluster state: {exc}", file=sys.stderr)
        return 2
    service.planner.after_pass = gcpause.settle  # what each pass over the nodes keeps is frozen too (gcpause)
    log.info(
        "serving",
        extra={
            "address": settings.address,
            "port": settings.port,
            "tls": settings.tls_cert_file is not None,
            "client_auth": settings.client_ca_file is not None,
            "health_port": settings.health_port,
            "source": settings.source,
            "policy": settings.node_policy,
        },
    )
    # uvicorn shuts down gracefully on SIGTERM and then raises the signal again for the handler it found: this one,
    # so the lease is released below instead of the process dying on the default action.
    signal.signal(signal.SIGTERM, _terminated)
    if settings.source == "kube" and settings.client_ca_file is None:
        log.warning("serving the verbs WITHOUT client authentication (--allow-unauthenticated): anyone can bind")
    verbs = verbs_server(
        create_app(
            service,
            state=settings.enable_state,
            probes=settings.health_port is None,
            max_body=settings.max_body_bytes,
            max_values=settings.max_json_values,
        ),
        host=settings.address,
        port=settings.port,
        log_level="warning",
        access_log=False,
        **_ssl_kwargs(settings),
        **_connection_limits(settings),
    )
    health = _start_health_server(settings, service, verbs)
    terminated = False
    try:
        verbs.run()  # what uvicorn.run does for one worker without reload (uvicorn 0.54 main.py), minus its exit
    except Terminated:
        terminated = True
        log.info("stopped by SIGTERM")
    finally:
        if health is not None:
            health[0].should_exit = True
        if election is not None:
            election.release()
        if health is not None:  # after the release: a standby takes over without waiting for this
            health[1].join(timeout=5)
    if not verbs.started and not terminated:
        # uvicorn's Server exits 3 itself when it cannot bind (server.py, uvicorn 0.54); any other way out of run()
        # without having started ends the same way, never with 0.
        print(f"vgpu-extender: the verbs' server did not start on {settings.address}:{settings.port}", file=sys.stderr)
        return 3
    if election is not None and election.lost.is_set():
        log.error("exiting after losing the lease; a restart comes back as a standby")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
