"""Review of the extender's assignment memo and one-write pools: what a pod author's text may cost the memo, and
the one-write connections over TLS against a server that closes its kept-alive connections.

The `vgpu.io/assignment` annotation is written by our bind, but anyone who may create a pod may write any text
there, up to the apiserver's 256 KiB of annotations, padded with fields the decoder ignores or with thousands of
slices. The pod watch decodes it (and refuses it later, in the state); the memo must not keep such texts.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kube_vgpu_dev.pki import make_ca_and_server_cert
from scheduler_extender import assignment_memo, kube
from scheduler_extender.kube import KubeBinder, one_write_pools
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice


def _base() -> dict[str, object]:
    a = Assignment("n1", (ContainerAssignment("vllm", (DeviceSlice("GPU-1", 0, 1024, 20),)),))
    obj: dict[str, object] = json.loads(ann.encode_assignment(a))
    return obj


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    assignment_memo.forget_all()
    yield
    assignment_memo.forget_all()


def _held_chars() -> int:
    return sum(len(t) for t in assignment_memo._by_text)


def test_a_flood_of_padded_texts_is_decoded_but_not_held() -> None:
    """64 distinct 128 KiB texts (valid: the decoder ignores an unknown field) held 8 MiB; at the memo's 4,096
    texts of 256 KiB that is 1 GiB, the extender's memory limit (deploy/manifests/extender.yaml)."""
    for i in range(64):
        text = json.dumps({**_base(), "pad": "x" * (128 * 1024), "i": i})
        assert assignment_memo.decode(text) == ann.decode_assignment(text)
    assert _held_chars() <= 4 * 1024 * 1024, f"{_held_chars() / 2**20:.1f} MiB of pod authors' texts held"


def test_a_text_of_thousands_of_slices_is_not_held() -> None:
    """Such a text decodes to ~700 KiB of objects; 4,096 of them were ~2.8 GiB in the memo."""
    devices = [{"uuid": str(j), "index": 0, "memoryMiB": 0, "cores": 0} for j in range(4000)]
    text = json.dumps({**_base(), "containers": [{"name": "c", "devices": devices}]})
    assert len(assignment_memo.decode(text).containers[0].devices) == 4000
    assert _held_chars() == 0


def test_a_non_ascii_text_is_not_held_and_ours_still_is() -> None:
    """Ours are ASCII (json.dumps escapes the rest), so a text with a 4-byte character is a hand-written one."""
    text = json.dumps({**_base(), "model": "\U0001f600" * 1000}, ensure_ascii=False)
    assert assignment_memo.decode(text).model == "\U0001f600" * 1000
    assert _held_chars() == 0
    a = Assignment("n1", (ContainerAssignment("vllm", (DeviceSlice("GPU-1", 0, 1024, 20),)),), model="é")
    ours = assignment_memo.encode(a)
    assert assignment_memo.decode(ours) is a


# --- the one-write pools over TLS, with a server that closes its connections --------------------------------------


class _Tls(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    close_after = False
    connections: list[int] = []
    seen: list[tuple[str, str, int, str | None, str | None]] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(
            (self.command, self.path, len(body), self.headers.get("Host"), self.headers.get("Content-Length"))
        )
        data = json.dumps({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "9"}}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = self.close_after  # an idle close without saying so: the client finds it dropped

    do_POST = do_PATCH = do_GET = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def tls_host(tmp_path: Path) -> Iterator[tuple[str, Path, type[_Tls]]]:
    _, ca, crt, key = make_ca_and_server_cert(tmp_path)
    handler = type("Handler", (_Tls,), {"connections": [], "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", ca, handler
    httpd.shutdown()
    httpd.server_close()


def _run(url: str, ca: Path, handler: type[_Tls], *, one_write: bool) -> tuple[list[object], int, list[int]]:
    """Binds on a kept-alive connection, a 2 MiB body, then binds, a GET and a PATCH while the server closes every
    connection after its answer: what the server saw, how many connections, and each write's size."""
    handler.seen.clear()
    handler.connections.clear()
    handler.close_after = False
    sizes: list[int] = []
    real = http.client.HTTPConnection.send

    def record(self: http.client.HTTPConnection, data: Any) -> None:
        sizes.append(len(data))
        real(self, data)

    conf = client.Configuration(host=url)
    conf.ssl_ca_cert = str(ca)
    ac = client.ApiClient(conf)
    if one_write:
        one_write_pools(ac)
    api = client.CoreV1Api(ac)
    binder = KubeBinder(api)
    a = Assignment("a", (ContainerAssignment("c", (DeviceSlice("GPU-a-0", 0, 1024, 50),)),))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(http.client.HTTPConnection, "send", record)
        for n in range(2):
            binder.bind(namespace="ns", name=f"p{n}", uid="u", version="7", node="a", assignment=a)
        kube.post_json(api, "/big", {"x": "y" * (2 * 1024 * 1024)})
        handler.close_after = True
        for n in range(2):
            binder.bind(namespace="ns", name=f"q{n}", uid="u", version="7", node="a", assignment=a)
        assert kube.get_pod(api, namespace="ns", name="p") is not None
        assert kube.patch_pod_annotations(api, namespace="ns", name="p", uid="u", annotations={"k": "v"}) == "9"
    return list(handler.seen), len(handler.connections), sizes


def test_one_write_over_tls_sends_what_urllib3_sends_and_survives_closed_connections(
    tls_host: tuple[str, Path, type[_Tls]],
) -> None:
    url, ca, handler = tls_host
    plain_seen, plain_conns, plain_sizes = _run(url, ca, handler, one_write=False)
    seen, conns, sizes = _run(url, ca, handler, one_write=True)
    port = url.rsplit(":", 1)[1]
    assert seen == plain_seen and conns == plain_conns == 4, (seen, conns)
    assert [s[1] for s in seen] == [
        "/api/v1/namespaces/ns/pods/p0/binding",
        "/api/v1/namespaces/ns/pods/p1/binding",
        "/big",
        "/api/v1/namespaces/ns/pods/q0/binding",
        "/api/v1/namespaces/ns/pods/q1/binding",
        "/api/v1/namespaces/ns/pods/p",
        "/api/v1/namespaces/ns/pods/p",
    ]
    assert all(host == f"127.0.0.1:{port}" and (length or "0") == str(n) for _, _, n, host, length in seen)
    # each bytes body with its head: 5 POSTs; the GET and the PATCH (a text body) as urllib3 writes them
    assert len(sizes) == 5 + 3 and sum(sizes) == sum(plain_sizes) and len(plain_sizes) == 2 * 5 + 3
