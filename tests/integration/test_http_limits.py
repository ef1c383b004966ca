"""Each bound of the extender's and the webhook's HTTP servers, through a real server on loopback.

Bodies refused with 413 while they stream in (the client could still be sending), wrong field types answered 400
with their path, node-name lists capped, unknown names answered at once, a 12,001-character quantity refused in
milliseconds, and a client sending its headers byte by byte cut after the read deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.integration.extender_server import HTTP_TIMEOUT_S, running_extender
from tests.integration.http_fuzz import SLOW_BODY, SLOW_HEADERS, gpu_pod, slow_client_closed_after
from tests.integration.test_extender_http import CLUSTER, NODES
from webhook import certs
from webhook.config import WebhookConfig
from webhook.inventory import StaticInventory
from webhook.main import build_server
from webhook.runner import TlsServer
from webhook.testing import make_review

CAP = 1_000_000
# Every request in this module must arrive whole within it, a 1 MB body and a TLS handshake included, while the
# machine is loaded: 1 s left a stalled client cut before the answer it asserts (413, 400) could be made.
READ_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("limits") / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    args = ["--source", "file", "--cluster-file", str(path), "--enable-state", "--max-body-bytes", str(CAP)]
    args += ["--max-node-names", "1000", "--request-read-timeout-seconds", str(READ_TIMEOUT_S)]
    with running_extender(*args) as url:
        yield url


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    pki = certs.write_dev_certs(tmp_path_factory.mktemp("pki"), ("localhost", "127.0.0.1"))
    cfg = WebhookConfig(
        host="127.0.0.1",
        port=0,
        cert_file=str(pki.cert),
        key_file=str(pki.key),
        inventory_source="static",
        max_gpu_memory_mib=81920,
        max_gpus_per_node=8,
        max_body_bytes=CAP,
        request_read_timeout_seconds=READ_TIMEOUT_S,
    )
    srv = build_server(cfg, StaticInventory(max_gpu_memory_mib=81920, max_gpus_per_node=8), CollectorRegistry())
    srv.start(timeout=60)  # the in-process server on a loaded 2-core machine: 10 s by default
    yield srv
    srv.tls.stop()
    srv.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _raw_post(port: int, path: str, *, declared: int | None, send: int) -> tuple[int, int]:
    """POST `send` bytes of a JSON array, chunked unless `declared` gives a Content-Length, stopping when the server
    answers: (HTTP status, bytes the client had sent by then)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {declared}\r\n" if declared is not None else "Transfer-Encoding: chunked\r\n"
    sock.sendall((head + "\r\n").encode())
    sent, chunk = 0, b"[" + b"{}," * 21_845 + b"{}]"
    try:
        while sent < send:
            sock.settimeout(0.001)
            try:
                answer = sock.recv(64)
                if answer:
                    return int(answer.split(b" ", 2)[1]), sent
            except TimeoutError:
                pass
            sock.settimeout(10)
            data = chunk if declared is not None else f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            sock.sendall(data)
            sent += len(chunk)
        sock.settimeout(10)
        return int(sock.recv(64).split(b" ", 2)[1]), sent
    except (BrokenPipeError, ConnectionResetError):  # closed while we sent: the answer may still be buffered
        try:
            sock.settimeout(1)
            answer = sock.recv(64)
        except OSError:
            answer = b""
        return (int(answer.split(b" ", 2)[1]) if answer else 0), sent
    finally:
        sock.close()


@pytest.mark.parametrize("declared", [None, 50_000_000])
def test_a_body_over_the_cap_is_refused_while_it_streams_in(extender: str, declared: int | None) -> None:
    status, sent = _raw_post(_port(extender), "/filter", declared=declared, send=50_000_000)
    assert status == 413
    assert sent < 10 * CAP  # refused long before the 50 MB were sent
    assert httpx.get(f"{extender}/healthz", timeout=HTTP_TIMEOUT_S).status_code == 200


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda p: p["spec"].update(containers={}), "Pod.spec.containers"),
        (lambda p: p.update(metadata=[]), "Pod.metadata"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits=[1]), "Pod.spec.containers[0].resources"),
        (lambda p: p["metadata"]["labels"].update(a=1), "Pod.metadata.labels['a']"),
        (lambda p: p["spec"]["containers"][0].update(args=[None]), "Pod.spec.containers[0].args[0]"),
        (lambda p: p["metadata"].update(annotations={"vgpu.io/node-policy": {}}), "Pod.metadata.annotations"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_field_of_the_wrong_type_is_a_400_naming_its_path(extender: str, verb: str, mutate: Any, path: str) -> None:
    pod = gpu_pod()
    mutate(pod)
    r = httpx.post(f"{extender}/{verb}", json={"Pod": pod, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 400 and path in r.json()["Error"], r.text


def test_node_names_are_capped_and_unknown_ones_answered_without_the_planner(extender: str) -> None:
    too_many = httpx.post(
        f"{extender}/filter",
        json={"Pod": gpu_pod(), "NodeNames": [f"n{i}" for i in range(1001)]},
        timeout=HTTP_TIMEOUT_S,
    )
    assert too_many.status_code == 400 and "at most 1000" in too_many.json()["Error"]
    unknown = [f"ghost-{i:04d}-" + "x" * 200 for i in range(999)]
    started = time.perf_counter()
    r = httpx.post(
        f"{extender}/filter", json={"Pod": gpu_pod(), "NodeNames": [*unknown, "h100-a"]}, timeout=HTTP_TIMEOUT_S
    )
    # "at once" as against a planner walk per name; the bound only tells the two apart (a second on a loaded
    # 2-core machine is a stall, not a regression); how fast is for benchmarks/
    assert r.status_code == 200 and time.perf_counter() - started < 10
    body = r.json()
    assert body["NodeNames"] == ["h100-a"] and set(body["FailedNodes"]) == set(unknown)
    assert len(r.content) < 400 * len(unknown)


def test_a_12001_character_quantity_is_refused_in_milliseconds(extender: str) -> None:
    pod = gpu_pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1" * 12_001})
    started = time.perf_counter()
    r = httpx.post(f"{extender}/filter", json={"Pod": pod, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    assert r.status_code == 200 and r.json()["NodeNames"] == []
    assert "longer than 64 characters" in next(iter(r.json()["FailedAndUnresolvableNodes"].values()))
    # the old regex took 14-20 s (more on a loaded machine); the HTTP round trip included, loose for a loaded machine
    # (the parse itself is microseconds: tests/unit/test_quantity)
    assert elapsed < 10.0


@pytest.mark.parametrize("request_bytes", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_a_slow_client_is_cut_after_the_read_deadline_while_probes_answer(extender: str, request_bytes: bytes) -> None:
    # a byte every 0.2 s: a per-read timeout would never cut it, so give_up_s (None) is the broken behaviour
    closed = slow_client_closed_after("127.0.0.1", _port(extender), tls=False, give_up_s=30, request=request_bytes)
    assert closed is not None and READ_TIMEOUT_S - 0.05 <= closed < READ_TIMEOUT_S + 10
    started = time.perf_counter()
    assert httpx.get(f"{extender}/healthz", timeout=30).status_code == 200
    # The probe answers after the cut (not wedged); the 100 ms p99 target under attack is measured by
    # benchmarks/http_robustness.py, not here: a loaded 2-core CI machine makes any sub-second bound a coin toss.
    assert time.perf_counter() - started < 10


# -- the webhook ----------------------------------------------------------------------------------------------------


def _review(port: int, body: bytes) -> httpx.Response:
    return httpx.post(f"https://127.0.0.1:{port}/mutate", content=body, verify=False, timeout=HTTP_TIMEOUT_S)


def test_webhook_refuses_a_review_over_the_cap(webhook: TlsServer) -> None:
    big = make_review(gpu_pod() | {"metadata": {"name": "x", "annotations": {"pad": "y" * CAP}}})
    r = _review(webhook.port, orjson.dumps(big))
    assert r.status_code == 413 and "max_body_bytes" in r.text


@pytest.mark.parametrize(
    ("pod", "path"),
    [
        ({"spec": {"containers": [{"resources": {"limits": []}}]}}, "object.spec.containers[0].resources.limits"),
        ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "\u0661"}}}]}}, "nvidia.com/gpu"),
        ({"metadata": {"labels": {"a": 1}}, "spec": {}}, "object.metadata.labels['a']"),
    ],
)
def test_webhook_denies_a_pod_of_wrong_types_naming_the_field(
    webhook: TlsServer, pod: dict[str, Any], path: str
) -> None:
    r = _review(webhook.port, orjson.dumps(make_review(pod)))
    assert r.status_code == 200
    response = r.json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400 and path in response["status"]["message"]


def test_webhook_answers_a_non_review_with_400_naming_the_field(webhook: TlsServer) -> None:
    r = _review(
        webhook.port, orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": 3})
    )
    assert r.status_code == 400 and "request" in r.text


@pytest.mark.parametrize("request_bytes", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_webhook_cuts_a_slow_client(webhook: TlsServer, request_bytes: bytes) -> None:
    closed = slow_client_closed_after("127.0.0.1", webhook.port, tls=True, give_up_s=30, request=request_bytes)
    assert closed is not None and READ_TIMEOUT_S - 0.05 <= closed < READ_TIMEOUT_S + 10
