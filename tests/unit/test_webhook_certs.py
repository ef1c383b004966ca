"""webhook.certs: the one certificate module (the webhook's dev certs and the development control plane's PKI)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook import certs


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_client_certificate_names_the_user_and_groups_and_is_signed_by_the_ca() -> None:
    ca = certs.generate_ca("test-ca")
    pair = certs.issue_client_cert(ca, "kube-vgpu-admin", ("system:masters", "team-a"))
    cert = pair.certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-vgpu-admin"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters",
        "team-a",
    ]
    assert _eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_server_certificate_common_name_and_sans() -> None:
    ca = certs.generate_ca()
    cert = certs.issue_server_cert(ca, ("localhost", "127.0.0.1"), common_name="kube-apiserver").certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-apiserver"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert _eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # without common_name the first host is the CN, as before
    first = certs.issue_server_cert(ca, ("vgpu-webhook", "localhost")).certificate
    assert first.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "vgpu-webhook"


def test_server_certificate_without_hosts_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        certs.issue_server_cert(certs.generate_ca(), ())


def test_keypair_write_names_the_files_and_keeps_the_key_private(tmp_path: Path) -> None:
    pair = certs.issue_client_cert(certs.generate_ca(), "someone")
    crt, key = pair.write(tmp_path / "new", "someone")
    assert (crt.name, key.name) == ("someone.crt", "someone.key")
    assert crt.read_bytes() == pair.cert_pem and key.read_bytes() == pair.key_pem
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
