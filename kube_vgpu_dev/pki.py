"""The control plane's certificates: a CA object over webhook.certs, and the files kube-apiserver needs.

All keys are ECDSA P-256 (webhook.certs). kube-apiserver signs ServiceAccount tokens with an ECDSA key as ES256
(``signerFromECDSAPrivateKey``, ``pkg/serviceaccount/jwt.go``, Kubernetes v1.34), so sa.key is one too.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from webhook import certs
from webhook.certs import KeyPair

APISERVER_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
DAYS = 365


class CertificateAuthority:
    """A throwaway CA (valid one year) that issues server and client certificates.

    ``ca.cert_pem`` is what goes into ``tlsConfig.caData`` (base64 of it in YAML) of a kube-scheduler
    extender, or into ``caBundle`` of a webhook configuration.
    """

    def __init__(self, common_name: str = "kube-vgpu-e2e-ca") -> None:
        self.keypair = certs.generate_ca(common_name, days=DAYS)

    @property
    def cert_pem(self) -> bytes:
        return self.keypair.cert_pem

    @property
    def cert_b64(self) -> str:
        """Base64 of the CA PEM, as ``caData``/``caBundle`` fields want it."""
        return base64.b64encode(self.cert_pem).decode()

    def issue_server_cert(
        self,
        common_name: str,
        dns_names: Iterable[str] = ("localhost",),
        ip_addresses: Iterable[str] = ("127.0.0.1",),
    ) -> KeyPair:
        """A serving certificate (serverAuth) for the given DNS names and IPs."""
        hosts = (*dns_names, *ip_addresses)
        return certs.issue_server_cert(self.keypair, hosts, days=DAYS, common_name=common_name)

    def issue_client_cert(self, common_name: str, organizations: Sequence[str] = ()) -> KeyPair:
        """A client certificate (clientAuth): CN is the Kubernetes user name, O the groups."""
        return certs.issue_client_cert(self.keypair, common_name, tuple(organizations), days=DAYS)


@dataclass(frozen=True)
class ClusterPki:
    """What ``pki/`` holds: kube-apiserver's CA and serving pair, the ServiceAccount keys, the front proxy's CA and
    client, the admin's client certificate."""

    ca: CertificateAuthority
    ca_file: Path
    apiserver_cert: Path
    apiserver_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca: CertificateAuthority
    front_proxy_ca_file: Path
    front_proxy_cert: Path
    front_proxy_key: Path
    admin_client: KeyPair
    admin_cert: Path
    admin_key: Path


def make_cluster_pki(directory: Path) -> ClusterPki:
    """A CA, the apiserver's serving certificate, the ServiceAccount signing key, a front-proxy (request header)
    CA and client as kubeadm sets them up (kube-scheduler's delegated authentication reads it), and the admin's
    client certificate (group system:masters)."""
    ca = CertificateAuthority()
    ca_file, _ = ca.keypair.write(directory, "ca")
    apiserver_cert, apiserver_key = ca.issue_server_cert("kube-apiserver", APISERVER_DNS_NAMES).write(
        directory, "apiserver"
    )
    sa = ec.generate_private_key(ec.SECP256R1())
    sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
    sa_private = sa.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    certs.write_atomic(sa_key, sa_private, 0o600)
    public = sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    certs.write_atomic(sa_pub, public)
    front_proxy_ca = CertificateAuthority("kube-vgpu-e2e-front-proxy-ca")
    front_proxy_ca_file, _ = front_proxy_ca.keypair.write(directory, "front-proxy-ca")
    front_proxy = front_proxy_ca.issue_client_cert("front-proxy-client")
    front_proxy_cert, front_proxy_key = front_proxy.write(directory, "front-proxy-client")
    admin_client = ca.issue_client_cert("kube-vgpu-admin", ["system:masters"])
    admin_cert, admin_key = admin_client.write(directory, "admin")
    return ClusterPki(
        ca=ca,
        ca_file=ca_file,
        apiserver_cert=apiserver_cert,
        apiserver_key=apiserver_key,
        sa_key=sa_key,
        sa_pub=sa_pub,
        front_proxy_ca=front_proxy_ca,
        front_proxy_ca_file=front_proxy_ca_file,
        front_proxy_cert=front_proxy_cert,
        front_proxy_key=front_proxy_key,
        admin_client=admin_client,
        admin_cert=admin_cert,
        admin_key=admin_key,
    )


def make_ca_and_server_cert(
    directory: str | os.PathLike[str],
    name: str = "server",
    dns_names: Iterable[str] = ("localhost",),
    ip_addresses: Iterable[str] = ("127.0.0.1",),
) -> tuple[CertificateAuthority, Path, Path, Path]:
    """Create a CA and a server cert signed by it in *directory*. Returns (ca, ca.crt, <name>.crt, <name>.key)."""
    ca = CertificateAuthority()
    ca_crt, _ = ca.keypair.write(directory, "ca")
    crt, key = ca.issue_server_cert(name, dns_names, ip_addresses).write(directory, name)
    return ca, ca_crt, crt, key
