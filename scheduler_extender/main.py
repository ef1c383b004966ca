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
from typing import TYPE_CHECKING

import uvicorn

from scheduler_extender.app import create_app, create_health_app
from scheduler_extender.service import ExtenderService, ServiceOptions
from scheduler_extender.settings import ENV_PREFIX, ExtenderSettings, SettingsError, load
from vgpu.errors import VgpuError
from vgpu.logs import configure
from vgpu.placement import registry
from vgpu.prerequisites import missing_path, no_kube_api
from vgpu.state import ClusterState

if TYPE_CHECKING:
    from scheduler_extender.leadership import Election

log = logging.getLogger("scheduler_extender")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vgpu-extender",
        description="kube-scheduler extender for fractional, role-aware GPU placement (filter, prioritize, bind).",
        epilog="Precedence: flags > VGPU_EXTENDER_* env > --config file > defaults. See docs/extender.md.",
    )
    p.add_argument("--config", type=Path, help="YAML settings file (version: v1)")
    p.add_argument("--address", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="listen port (default 8888)")
    p.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this PEM certificate")
    p.add_argument("--tls-key-file", type=Path, help="PEM private key for --tls-cert-file")
    sec = p.add_argument_group("client authentication", "who may call the verbs (docs/extender.md, Security)")
    sec.add_argument(
        "--client-ca-file", type=Path, metavar="PEM", help="require client certificates signed by this CA (mTLS)"
    )
    sec.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="kube source without client certificates: anyone reaching the port can bind (development only)",
    )
    sec.add_argument(
        "--health-port", type=int, metavar="PORT", help="plain-HTTP port with only /healthz, /readyz and /metrics"
    )
    sec.add_argument(
        "--enable-state", action="store_true", default=None, help="serve GET /state on --port (off by default)"
    )
    p.add_argument(
        "--source", choices=["kube", "file"], help="cluster state from the apiserver or a file (default kube)"
    )
    p.add_argument("--cluster-file", type=Path, help="cluster file for --source file")
    p.add_argument("--persist", action="store_true", default=None, help="write binds back to --cluster-file")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig path (default: in-cluster config)")
    p.add_argument(
        "--node-policy",
        help=f"node placement policy, one of {', '.join(registry.production_names())} (default 'default')",
    )
    p.add_argument("--gpu-policy", choices=["binpack", "spread"], help="GPU order inside the node")
    p.add_argument("--bind-grace-seconds", type=float, help="reservation lifetime of a bind without Binding (30)")
    p.add_argument(
        "--relearn-interval-seconds", type=float, help="how often a learning policy takes in arriving pods (60)"
    )
    p.add_argument(
        "--requeue-max-pods",
        type=int,
        help="when capacity frees, nudge at most this many rejected pods so kube-scheduler retries them (50; 0 = off)",
    )
    p.add_argument(
        "--requeue-interval-seconds",
        type=float,
        help="nudge one pending pod at most once per this many seconds; releases in between coalesce (2)",
    )
    le = p.add_argument_group(
        "leader election", "several replicas, one serving; the others stand by with a synced view (docs/extender.md)"
    )
    le.add_argument("--leader-elect", action="store_true", default=None, help="take part in leader election")
    le.add_argument("--leader-elect-resource-name", metavar="NAME", help="name of the Lease (default vgpu-extender)")
    le.add_argument(
        "--leader-elect-resource-namespace", metavar="NAMESPACE", help="namespace of the Lease (default kube-system)"
    )
    le.add_argument(
        "--leader-elect-lease-duration-seconds",
        type=float,
        metavar="S",
        help="a standby takes over an unrenewed lease after (15)",
    )
    le.add_argument(
        "--leader-elect-renew-deadline-seconds",
        type=float,
        metavar="S",
        help="a leader that cannot renew stops after (10)",
    )
    le.add_argument("--leader-elect-retry-period-seconds", type=float, metavar="S", help="acquire and renew every (2)")
    le.add_argument("--pod-name", metavar="NAME", help="this replica's pod (downward API), labelled while it leads")
    le.add_argument("--pod-namespace", metavar="NAMESPACE", help="namespace of --pod-name")
    p.add_argument("--priority-mapping", choices=["rank", "minmax"], help="fine score to 0..10 (default rank)")
    p.add_argument("--narrow-filter", action="store_true", default=None, help="return only the best-scored tier")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["text", "json"])
    return p


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


def _start_health_server(s: ExtenderSettings, service: ExtenderService) -> uvicorn.Server | None:
    """--health-port: /healthz, /readyz and /metrics over plain HTTP in a thread. A kubelet HTTPS probe presents no
    client certificate (kubernetes pkg/probe/http/http.go, New(): a tls.Config with InsecureSkipVerify and no
    Certificates), so probes cannot go through the mTLS port."""
    if s.health_port is None:
        return None
    config = uvicorn.Config(
        create_health_app(service), host=s.address, port=s.health_port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)  # off the main thread uvicorn installs no signal handlers
    threading.Thread(target=server.run, name="health-server", daemon=True).start()
    return server


def build_service(s: ExtenderSettings) -> tuple[ExtenderService, object | None, Election | None]:
    """The service plus, for the kube source, the running source (so callers can stop it) and, with
    --leader-elect, the election (so main can release the lease on shutdown)."""
    state = ClusterState(s.placement())
    options = ServiceOptions(
        names=s.resource_names(),
        narrow_filter=s.narrow_filter,
        bind_grace_s=s.bind_grace_seconds,
        relearn_interval_s=s.relearn_interval_seconds,
    )
    lock = threading.RLock()
    if s.source == "file":
        from scheduler_extender.sources.file import FileBinder, load_cluster_file

        assert s.cluster_file is not None
        nodes = load_cluster_file(s.cluster_file, state)
        binder = FileBinder(state, nodes, state_lock=lock, persist_to=s.cluster_file if s.persist else None)
        options = dataclasses.replace(options, pods_from_filter=True)  # no apiserver to read pods from
        service = ExtenderService(state, binder, options=options, lock=lock)
        service.ready.set()
        return service, None, None
    import functools

    from kubernetes import client, config

    from scheduler_extender.kube import KubeBinder, nudge_pod
    from scheduler_extender.leadership import start_leader_election
    from scheduler_extender.metrics import ExtenderMetrics
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
    api = client.CoreV1Api()
    metrics = ExtenderMetrics(state)
    requeuer = Requeuer(
        functools.partial(nudge_pod, api),
        max_pods=s.requeue_max_pods,
        interval_s=s.requeue_interval_seconds,
        metrics=metrics,
    )
    service = ExtenderService(state, KubeBinder(api), options=options, lock=lock, metrics=metrics, requeuer=requeuer)
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
    flags = {k: v for k, v in vars(args).items() if k != "config"}
    try:
        settings = load(flags=flags, env=os.environ, config_file=args.config)
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
    try:
        service, _source, election = build_service(settings)
    except MissingPrerequisite as exc:
        print(exc, file=sys.stderr)
        return 2
    except (VgpuError, OSError) as exc:
        print(f"vgpu-extender: cannot load cluster state: {exc}", file=sys.stderr)
        return 2
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
    health = _start_health_server(settings, service)
    try:
        uvicorn.run(
            create_app(service, state=settings.enable_state, probes=health is None),
            host=settings.address,
            port=settings.port,
            log_level="warning",
            access_log=False,
            **_ssl_kwargs(settings),  # type: ignore[arg-type]
        )
    except Terminated:
        log.info("stopped by SIGTERM")
    finally:
        if health is not None:
            health.should_exit = True
        if election is not None:
            election.release()
    if election is not None and election.lost.is_set():
        log.error("exiting after losing the lease; a restart comes back as a standby")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
