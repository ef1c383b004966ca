"""`vgpu-webhook install-certs`: the cert Job for clusters without cert-manager.

Creates (or keeps) the TLS Secret and writes the CA into every webhook of the named webhook
configurations' `caBundle`. Idempotent: a Secret whose certificate still has `min_days` left and covers
the hosts is reused, so re-running the Job (e.g. on each `helm upgrade`) does not rotate needlessly;
the running webhook picks up a rotated Secret through its certificate hot reload.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Sequence
from typing import Any

from cryptography import x509

from webhook import certs
from webhook.kube import read_secret


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _still_good(secret: Any, hosts: Sequence[str], min_days: int) -> bytes | None:
    """The CA PEM of an existing Secret worth keeping, else None."""
    data = getattr(secret, "data", None) or {}
    if not {"tls.crt", "tls.key", "ca.crt"} <= data.keys():
        return None
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    try:
        sans = set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        return None
    if left < datetime.timedelta(days=min_days) or not {h for h in hosts if not h[0].isdigit()} <= sans:
        return None
    return base64.b64decode(data["ca.crt"])


def install(
    *,
    core: Any,
    admission: Any,
    namespace: str,
    secret: str,
    hosts: Sequence[str],
    mutating: Sequence[str] = (),
    validating: Sequence[str] = (),
    min_days: int = 30,
) -> bool:
    """Ensure the Secret and the caBundles; True when a new certificate was issued.

    `core` is a kubernetes CoreV1Api, `admission` an AdmissionregistrationV1Api (injected, so tests and
    the e2e suite pass their own clients).
    """
    existing = read_secret(core, namespace=namespace, name=secret)
    ca_pem = _still_good(existing, hosts, min_days) if existing is not None else None
    issued = ca_pem is None
    if ca_pem is None:
        ca = certs.generate_ca()
        pair = certs.issue_server_cert(ca, tuple(hosts))
        ca_pem = ca.cert_pem
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace, "labels": {"app.kubernetes.io/name": "vgpu-webhook"}},
            "data": {"tls.crt": _b64(pair.cert_pem), "tls.key": _b64(pair.key_pem), "ca.crt": _b64(ca.cert_pem)},
        }
        if existing is None:
            core.create_namespaced_secret(namespace, body)
        else:
            core.replace_namespaced_secret(secret, namespace, body)
    bundle = _b64(ca_pem)
    for name in mutating:
        cfg = admission.read_mutating_webhook_configuration(name)
        admission.patch_mutating_webhook_configuration(name, _bundle_ops(cfg, bundle))
    for name in validating:
        cfg = admission.read_validating_webhook_configuration(name)
        admission.patch_validating_webhook_configuration(name, _bundle_ops(cfg, bundle))
    return issued


def _bundle_ops(cfg: Any, bundle: str) -> list[dict[str, str]]:
    """A JSON Patch (the client's default patch type) setting every webhook's caBundle."""
    return [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
        for i in range(len(cfg.webhooks or []))
    ]
