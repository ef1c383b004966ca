"""The real HTTPS server (uvicorn on a loopback socket): reviews, probes, metrics and certificate rotation."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry

from webhook import certs
from webhook.config import WebhookConfig
from webhook.inventory import StaticInventory
from webhook.main import build_server
from webhook.runner import TlsServer
from webhook.testing import make_review, patch_ops

GPU_POD = {
    "metadata": {"generateName": "vllm-", "labels": {"llm-d.ai/role": "decode"}},
    "spec": {"containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpumem": "20000"}}}]},
}


@pytest.fixture
def pki(tmp_path: Path) -> certs.CertPaths:
    return certs.write_dev_certs(tmp_path, ("localhost", "127.0.0.1"))


@pytest.fixture
def server(pki: certs.CertPaths) -> Iterator[TlsServer]:
    cfg = WebhookConfig(
        host="127.0.0.1",
        port=0,
        cert_file=str(pki.cert),
        key_file=str(pki.key),
        cert_reload_interval=0.05,
        inventory_source="static",
        max_gpu_memory_mib=81920,
        max_gpus_per_node=8,
    )
    inventory = StaticInventory(max_gpu_memory_mib=81920, max_gpus_per_node=8)
    srv = build_server(cfg, inventory, CollectorRegistry()).start(timeout=60)  # 10 s by default: a loaded box
    yield srv
    srv.tls.stop()
    srv.stop()


def _context(*ca_files: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    for ca in ca_files:
        ctx.load_verify_locations(str(ca))
    return ctx


def _call(port: int, ctx: ssl.SSLContext, method: str, path: str, body: Any = None) -> tuple[int, bytes, int]:
    """One request on a fresh connection: (status, body, serial of the certificate the server presented)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)  # slow on a loaded box, not wrong
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert conn.sock is not None
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return resp.status, data, x509.load_der_x509_certificate(der).serial_number
    finally:
        conn.close()


def test_mutate_over_https_verified_by_the_ca(server: TlsServer, pki: certs.CertPaths) -> None:
    status, body, _ = _call(server.port, _context(pki.ca_cert), "POST", "/mutate?timeout=10s", make_review(GPU_POD))
    assert status == 200
    review = json.loads(body)
    assert review["response"]["allowed"] is True
    paths = {op["path"] for op in patch_ops(review)}
    assert {"/metadata/labels/vgpu.io~1role", "/spec/schedulerName"} <= paths
    big = json.loads(json.dumps(GPU_POD))
    big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "90000"
    _, body, _ = _call(server.port, _context(pki.ca_cert), "POST", "/mutate", make_review(big))
    denied = json.loads(body)["response"]
    assert denied["allowed"] is False and "1..81920 MiB" in denied["status"]["message"]
    for path in ("/healthz", "/readyz"):
        assert _call(server.port, _context(pki.ca_cert), "GET", path)[0] == 200
    _, metrics, _ = _call(server.port, _context(pki.ca_cert), "GET", "/metrics")
    assert b'vgpu_webhook_reviews_total{endpoint="mutate",outcome="mutated"} 1.0' in metrics
    assert b"vgpu_webhook_certificate_expiry_timestamp_seconds" in metrics


def test_model_server_flag_over_https(server: TlsServer, pki: certs.CertPaths) -> None:
    """A vLLM pod on 20000 MiB of the static inventory's 81920 MiB cards: the patch on the wire appends the flag to
    its args, a second vLLM with its own 0.9 keeps it and the response carries a warning (kubectl prints those)."""
    pod = {
        "metadata": {"generateName": "vllm-"},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": ["--model=Qwen/Qwen2.5-7B-Instruct"],
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}},
                },
                {
                    "name": "own",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": ["--model=m", "--gpu-memory-utilization=0.9"],
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}},
                },
            ]
        },
    }
    status, body, _ = _call(server.port, _context(pki.ca_cert), "POST", "/mutate", make_review(pod))
    assert status == 200
    review = json.loads(body)
    flag = "--gpu-memory-utilization=0.2316"  # (20000 - 1024 margin) / 81920, rounded down
    assert {"op": "add", "path": "/spec/containers/0/args/-", "value": flag} in patch_ops(review)
    assert not [op for op in patch_ops(review) if op["path"].startswith("/spec/containers/1/args")]
    assert any(
        "container 'own': --gpu-memory-utilization=0.9 (kept as set)" in w for w in review["response"]["warnings"]
    )


def test_untrusted_clients_fail_the_handshake(server: TlsServer) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _call(server.port, ssl.create_default_context(), "GET", "/healthz")


def test_certificate_rotation_under_live_traffic(server: TlsServer, pki: certs.CertPaths, tmp_path: Path) -> None:
    """Requests keep flowing on fresh connections while the pair is rotated to a cert from a new CA."""
    new_ca = certs.generate_ca("rotated-ca")
    new_ca_file = tmp_path / "new-ca.crt"
    new_ca_file.write_bytes(new_ca.cert_pem)
    ctx = _context(pki.ca_cert, new_ca_file)  # the caBundle holds both CAs during a rotation
    old_serial = x509.load_pem_x509_certificate(pki.cert.read_bytes()).serial_number
    seen: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    # A keep-alive connection opened before the rotation must keep working after it.
    keepalive = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=30)
    keepalive.request("GET", "/healthz")
    assert keepalive.getresponse().read() == b"ok"

    def traffic() -> None:
        while not stop.is_set():
            try:
                status, _, serial = _call(server.port, ctx, "POST", "/mutate", make_review(GPU_POD))
                assert status == 200
                seen.append(serial)
            except BaseException as exc:
                failures.append(exc)
                return

    def until(done: Callable[[], bool], what: str) -> None:
        """Wait on a condition, not on a sleep a loaded machine overruns (the worker's pace varies 10x). The
        keep-alive connection is used every second meanwhile: the server closes one idle for 5 s."""
        give_up = time.monotonic() + 60
        used = time.monotonic()
        while not done():
            assert not failures, failures
            assert time.monotonic() < give_up, f"60 s without {what}"
            if time.monotonic() - used > 1:
                keepalive.request("GET", "/healthz")
                assert keepalive.getresponse().read() == b"ok"
                used = time.monotonic()
            time.sleep(0.02)

    rotated = certs.issue_server_cert(new_ca, ("localhost", "127.0.0.1"))
    new_serial = rotated.certificate.serial_number
    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        until(lambda: len(seen) >= 5, "5 answers before the rotation")
        # Half a rotation first: a new cert with the old key must not break anything.
        certs.write_atomic(pki.cert, rotated.cert_pem)
        time.sleep(0.3)
        assert server.tls.reloads == 0
        certs.write_atomic(pki.key, rotated.key_pem, 0o600)
        until(lambda: server.tls.reloads > 0, "a reload")
        until(lambda: seen.count(new_serial) >= 5, "5 answers with the new certificate")
    finally:
        stop.set()
        worker.join(timeout=10)
    assert not failures, failures
    assert server.tls.reloads == 1
    assert seen[0] == old_serial and seen[-1] == new_serial, (old_serial, new_serial, seen[:3], seen[-3:])
    switch = seen.index(new_serial)
    assert set(seen[:switch]) == {old_serial} and set(seen[switch:]) == {new_serial}
    assert len(seen) >= 10
    keepalive.request("GET", "/healthz")
    assert keepalive.getresponse().read() == b"ok"
    keepalive.close()
    # Clients that trust only the new CA now succeed.
    assert _call(server.port, _context(new_ca_file), "GET", "/healthz")[2] == new_serial
