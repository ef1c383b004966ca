"""Self-signed certificates for development and tests: a CA and a server certificate it signs.

Installs use cert-manager or the cert Job in deploy/webhook/; this is what `vgpu-webhook gen-certs`
and the tests use. The CA's PEM is what goes into the webhook configuration's `caBundle`.
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


def issue_server_cert(ca: KeyPair, hosts: tuple[str, ...] = DEFAULT_HOSTS, *, days: int = 90) -> KeyPair:
    """A serving certificate for `hosts` (DNS names and IP addresses go into the SAN, as Go requires)."""
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
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
