"""Self-contained kubeconfig files: server, CA and client certificate embedded, nothing to resolve on disk."""

from __future__ import annotations

import base64

import yaml

from webhook.certs import KeyPair

CLUSTER = "kube-vgpu-e2e"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig_text(server: str, ca_pem: bytes, client: KeyPair, user: str) -> str:
    """A kubeconfig for *server* (trusting *ca_pem*) that authenticates as *user* with *client*'s certificate."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": _b64(client.cert_pem), "client-key-data": _b64(client.key_pem)},
            }
        ],
        "contexts": [{"name": CLUSTER, "context": {"cluster": CLUSTER, "user": user}}],
        "current-context": CLUSTER,
    }
    return yaml.safe_dump(doc, sort_keys=False)
