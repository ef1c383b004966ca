from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography import x509

from webhook.main import main


def test_gen_certs_writes_a_ca_signed_pair(tmp_path: Path) -> None:
    assert main(["gen-certs", "--dir", str(tmp_path), "--host", "svc.example", "--host", "127.0.0.1"]) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["svc.example"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0


def test_print_config_applies_flags_and_refuses_bad_ones(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VGPU_WEBHOOK_LOG_FORMAT", "json")
    assert main(["print-config", "--scheduler-name", "my-sched"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["scheduler_name"] == "my-sched" and shown["log_format"] == "json"
    assert main(["print-config", "--port", "70000"]) == 2
    assert "port: 70000 is outside 1..65535" in capsys.readouterr().err
