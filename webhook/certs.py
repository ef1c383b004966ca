"""Self-signed certificates for development and tests: a CA and the server and client certificates it signs.

Installs use cert-manager or the cert Job in deploy/webhook/; this is what `vgpu-webhook gen-certs`, the tests
and the development control plane (kube_vgpu_dev.pki: the apiserver's, the extender's and every kubeconfig's
certificates) use. The CA's PEM is what goes into the webhook configuration's `caBundle`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("vgpu-webhook", "vgpu-webhook.kube-system", "vgpu-webhook.kube-system.svc", "localhost", "127.0.0.1")


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def write(self, directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
        """`<name>.crt` and `<name>.key` (mode 0600) in `directory`, key first (as write_server_pair)."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        cert, key = folder / f"{name}.crt", folder / f"{name}.key"
        write_server_pair(self, cert, key)
        return cert, key


@dataclass(frozen=True, slots=True)
class CertPaths:
    ca_cert: Path
    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def generate_ca(common_name: str = "vgpu-webhook-ca", *, days: int = 365) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server_cert(
    ca: KeyPair, hosts: tuple[str, ...] = DEFAULT_HOSTS, *, days: int = 90, common_name: str | None = None
) -> KeyPair:
    """A serving certificate for `hosts` (DNS names and IP addresses go into the SAN, as Go requires); its CN is
    `common_name`, else the first host."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host (DNS name or IP address) for its SAN")
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name or hosts[0])])
    return _issue(ca, subject, ExtendedKeyUsageOID.SERVER_AUTH, days, x509.SubjectAlternativeName(sans))


def issue_client_cert(ca: KeyPair, common_name: str, organizations: tuple[str, ...] = (), *, days: int = 90) -> KeyPair:
    """A client certificate (clientAuth). Kubernetes reads the CN as the user name and each O as a group."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject = x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return _issue(ca, subject, ExtendedKeyUsageOID.CLIENT_AUTH, days, None)


def _issue(
    ca: KeyPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    days: int,
    sans: x509.SubjectAlternativeName | None,
) -> KeyPair:
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write via a temp file and rename, so a reader never sees half a PEM."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_server_pair(pair: KeyPair, cert: Path, key: Path) -> None:
    """Key first, then cert: the reloader keys on the cert's mtime and retries a mismatched pair."""
    write_atomic(key, pair.key_pem, 0o600)
    write_atomic(cert, pair.cert_pem)


def write_dev_certs(directory: Path, hosts: tuple[str, ...] = DEFAULT_HOSTS, *, ca: KeyPair | None = None) -> CertPaths:
    """Write ca.crt, tls.crt and tls.key (the cert-manager Secret layout) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = ca or generate_ca()
    paths = CertPaths(ca_cert=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key")
    write_atomic(paths.ca_cert, ca.cert_pem)
    write_server_pair(issue_server_cert(ca, hosts), paths.cert, paths.key)
    return paths
