"""`vgpu-webhook`: wiring only. Subcommands: `serve` (default), `gen-certs`, `install-certs`, `print-config`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from vgpu import logs
from vgpu.prerequisites import missing_path, no_kube_api
from webhook import certs, config_load
from webhook.admission import Settings
from webhook.config import ConfigError, WebhookConfig
from webhook.eviction import PodLookup
from webhook.inventory import InventorySource, NodeAnnotationInventory, NoInventory, StaticInventory
from webhook.kube import find_pod, list_namespace_pods
from webhook.metrics import StateCollector, WebhookMetrics
from webhook.quota import QUOTA_FILE, QuotaGuard
from webhook.runner import TlsServer
from webhook.server import Reviewer, create_app
from webhook.tls import ReloadingTls

log = logging.getLogger("webhook")
PROG = "vgpu-webhook"


class MissingPrerequisite(Exception):
    """The webhook cannot start here (no certificate, no apiserver); the message says what to pass."""


def _api_client(kubeconfig: str, *, env: str = "", alternative: str = "") -> object:
    """A Kubernetes ApiClient from `kubeconfig`, or in-cluster; MissingPrerequisite when neither loads."""
    from kubernetes import client
    from kubernetes import config as kube_config

    try:
        if kubeconfig:
            return kube_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        configuration = client.Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    except kube_config.ConfigException as exc:
        raise MissingPrerequisite(
            no_kube_api(
                PROG, kubeconfig=kubeconfig, reason=str(exc), flag="--kubeconfig", env=env, alternative=alternative
            )
        ) from exc


def make_inventory(cfg: WebhookConfig) -> InventorySource:
    if cfg.inventory_source == "none":
        return NoInventory()
    if cfg.inventory_source == "static":
        return StaticInventory(max_gpu_memory_mib=cfg.max_gpu_memory_mib, max_gpus_per_node=cfg.max_gpus_per_node)
    from kubernetes import client

    api_client = _api_client(
        cfg.kubeconfig,
        env=config_load.ENV_PREFIX + "KUBECONFIG",
        alternative="--inventory-source static or none (no apiserver needed)",
    )
    source = NodeAnnotationInventory(api=client.CoreV1Api(api_client))
    source.start()
    return source


def make_quota(cfg: WebhookConfig) -> QuotaGuard | None:
    """Quotas when ConfigMap vgpu-quotas is mounted (its directory exists; deploy/webhook/deployment.yaml mounts it
    optionally): usage is read from the apiserver, so this needs the kubeconfig or in-cluster credentials."""
    if not QUOTA_FILE.parent.is_dir():
        return None
    from kubernetes import client

    api_client = _api_client(cfg.kubeconfig, env=config_load.ENV_PREFIX + "KUBECONFIG", alternative="no quota mount")
    core = client.CoreV1Api(api_client)
    return QuotaGuard(
        QUOTA_FILE,
        lambda ns: list_namespace_pods(core, ns),  # type: ignore[arg-type,return-value]
        names=cfg.resource_names(),
        defaults=cfg.request_defaults(),
    )


def make_pod_lookup(cfg: WebhookConfig) -> PodLookup | None:
    """The eviction guard's pod reads; None (every eviction sent to it refused, saying why) where no kubeconfig or
    in-cluster credentials load: the webhook itself may still run, on a static inventory."""
    from kubernetes import client

    try:
        api_client = _api_client(cfg.kubeconfig, env=config_load.ENV_PREFIX + "KUBECONFIG")
    except MissingPrerequisite as exc:
        log.warning("no apiserver access: evictions sent to /validate-eviction will be refused: %s", exc)
        return None
    core = client.CoreV1Api(api_client)
    return lambda namespace, name: find_pod(core, namespace, name)


def build_server(
    cfg: WebhookConfig,
    inventory: InventorySource,
    registry: CollectorRegistry,
    quota: QuotaGuard | None = None,
    pods: PodLookup | None = None,
) -> TlsServer:
    metrics = WebhookMetrics(registry)
    tls = ReloadingTls(
        cfg.cert_file,
        cfg.key_file,
        on_reload=lambda ok: metrics.cert_reloads.labels("ok" if ok else "failed").inc(),
    )
    StateCollector(cert_not_after=lambda: tls.not_after, inventory=inventory.summary, registry=registry)
    reviewer = Reviewer(Settings.from_config(cfg), inventory, metrics, quota, pods)
    tls.start(cfg.cert_reload_interval)
    return TlsServer(
        create_app(reviewer, max_body=cfg.max_body_bytes, max_values=cfg.max_json_values),
        tls,
        host=cfg.host,
        port=cfg.port,
        read_timeout_s=cfg.request_read_timeout_seconds,
        max_connections=cfg.max_connections,
    )


def _missing_certificate(cfg: WebhookConfig) -> str | None:
    for what, path in (("TLS certificate", cfg.cert_file), ("TLS key", cfg.key_file)):
        if not os.path.isfile(path):
            flag = "--cert-file" if what == "TLS certificate" else "--key-file"
            env = config_load.ENV_PREFIX + flag[2:].replace("-", "_").upper()
            hint = "the apiserver calls webhooks over HTTPS only; for development: vgpu-webhook gen-certs --dir DIR"
            return missing_path(PROG, what=what, path=path, flag=flag, env=env, hint=hint)
    return None


def serve(cfg: WebhookConfig) -> int:
    logs.configure(cfg.log_level, cfg.log_format)
    missing = _missing_certificate(cfg)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    try:
        inventory = make_inventory(cfg)
    except MissingPrerequisite as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        quota = make_quota(cfg)
    except MissingPrerequisite as exc:
        print(exc, file=sys.stderr)
        return 2
    server = build_server(cfg, inventory, CollectorRegistry(), quota, make_pod_lookup(cfg))
    log.info("serving AdmissionReviews on https://%s:%d (scheduler %s)", cfg.host, server.port, cfg.scheduler_name)
    try:
        server.run()
    finally:
        server.tls.stop()
        if isinstance(inventory, NodeAnnotationInventory):
            inventory.stop()
    return 0


def gen_certs(args: argparse.Namespace) -> int:
    paths = certs.write_dev_certs(Path(args.dir), tuple(args.host) or certs.DEFAULT_HOSTS)
    print(f"wrote {paths.ca_cert} {paths.cert} {paths.key}")
    return 0


def install_certs(args: argparse.Namespace) -> int:
    from kubernetes import client

    from webhook import cert_job

    logs.configure()
    try:
        api_client = _api_client(args.kubeconfig)
    except MissingPrerequisite as exc:
        print(exc, file=sys.stderr)
        return 2
    issued = cert_job.install(
        core=client.CoreV1Api(api_client),
        admission=client.AdmissionregistrationV1Api(api_client),
        namespace=args.namespace,
        secret=args.secret,
        hosts=tuple(args.host) or certs.DEFAULT_HOSTS,
        mutating=args.mutating,
        validating=args.validating,
        min_days=args.min_days,
    )
    log.info("secret %s/%s %s; caBundle set", args.namespace, args.secret, "issued" if issued else "kept")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="vgpu-webhook", description="kube-vgpu mutating admission webhook")
    sub = top.add_subparsers(dest="command")
    precedence = (
        "Every option is also an environment variable (VGPU_WEBHOOK_<OPTION>) and a key of the --config file "
        "(docs/webhook.md). Precedence: flags > environment > file > defaults."
    )
    serve_p = sub.add_parser(
        "serve",
        help="serve /mutate, /validate, /healthz, /readyz, /metrics over HTTPS",
        description="Serve /mutate, /validate, /healthz, /readyz and /metrics over HTTPS.",
        epilog=precedence,
    )
    config_load.add_flags(serve_p)
    show = sub.add_parser(
        "print-config",
        help="print the effective configuration (flags > env > file)",
        description="Print the effective configuration as YAML.",
        epilog=precedence,
    )
    config_load.add_flags(show)
    gen = sub.add_parser("gen-certs", help="write a self-signed CA and serving certificate (development)")
    gen.add_argument("--dir", required=True, help="output folder: ca.crt, tls.crt, tls.key")
    gen.add_argument("--host", action="append", default=[], help="DNS name or IP for the SAN (repeatable)")
    inst = sub.add_parser("install-certs", help="cert Job: ensure the TLS Secret and the webhooks' caBundle")
    inst.add_argument("--namespace", default="kube-system")
    inst.add_argument("--secret", default="vgpu-webhook-tls")
    inst.add_argument("--host", action="append", default=[], help="DNS name for the SAN (repeatable)")
    inst.add_argument("--mutating", action="append", default=[], help="MutatingWebhookConfiguration name")
    inst.add_argument("--validating", action="append", default=[], help="ValidatingWebhookConfiguration name")
    inst.add_argument("--min-days", type=int, default=30, help="reissue when fewer days are left")
    inst.add_argument("--kubeconfig", default="", help="default: in-cluster service account")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in ("serve", "print-config", "gen-certs", "install-certs", "-h", "--help"):
        args_list.insert(0, "serve")
    args = parser().parse_args(args_list)
    if args.command == "gen-certs":
        return gen_certs(args)
    if args.command == "install-certs":
        return install_certs(args)
    try:
        cfg = config_load.load(args=args, environ=os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "print-config":
        print(yaml.safe_dump(cfg.model_dump(), sort_keys=False), end="")
        return 0
    return serve(cfg)


if __name__ == "__main__":
    sys.exit(main())
