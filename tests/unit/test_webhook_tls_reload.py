"""The certificate reloader against files that change while it reads them (no server, no sleeps)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from webhook import certs, tls
from webhook.tls import ReloadingTls


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def test_key_replaced_during_a_reload_counts_one_reload_not_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cert is rotated, then its key lands while the reloader is loading the pair: the reloader must not
    record the stamp it read before the key moved, or the next check reloads the same pair a second time."""
    pki = certs.write_dev_certs(tmp_path, ("localhost",))
    reloader = ReloadingTls(pki.cert, pki.key)
    rotated = certs.issue_server_cert(certs.generate_ca("rotated"), ("localhost",))
    certs.write_atomic(pki.cert, rotated.cert_pem)
    assert not reloader.check()  # new cert, old key: refused, old pair kept
    assert reloader.reloads == 0

    real = tls.server_context

    def key_lands_mid_load(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
        certs.write_atomic(pki.key, rotated.key_pem, 0o600)
        monkeypatch.setattr(tls, "server_context", real)
        return real(cert_file, key_file)

    monkeypatch.setattr(tls, "server_context", key_lands_mid_load)
    assert not reloader.check()  # the files moved under it: nothing installed yet
    assert reloader.reloads == 0
    assert reloader.check()  # settled: the rotated pair, once
    assert not reloader.check()
    assert reloader.reloads == 1
    assert reloader.not_after == x509.load_pem_x509_certificate(rotated.cert_pem).not_valid_after_utc.timestamp()


def test_a_settled_rotation_reloads_once(tmp_path: Path) -> None:
    pki = certs.write_dev_certs(tmp_path, ("localhost",))
    reloader = ReloadingTls(pki.cert, pki.key)
    assert not reloader.check()
    rotated = certs.issue_server_cert(certs.generate_ca("rotated"), ("localhost",))
    certs.write_server_pair(rotated, pki.cert, pki.key)
    assert reloader.check()
    assert not reloader.check()
    assert reloader.reloads == 1
    assert _serial(pki.cert.read_bytes()) == rotated.certificate.serial_number
