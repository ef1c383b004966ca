"""The extender's apiserver requests go out in one write, head and body together (scheduler_extender.kube
`one_write_pools`), against a real HTTP/1.1 keep-alive server: the Binding arrives whole, a GET (no body) and a
PATCH (a text body) still work, and the connection is still reused."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from scheduler_extender import kube
from scheduler_extender.kube import KubeBinder, one_write_pools
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice

_ONE = Assignment("a", (ContainerAssignment("c", (DeviceSlice("GPU-a-0", 0, 1024, 50),)),))


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: list[int] = []
    seen: list[tuple[str, str, bytes]] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, body))
        pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "9"}}
        data = json.dumps(pod).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_PATCH = do_GET = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def host() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"connections": [], "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every `send` that reaches the socket (http.client.HTTPConnection.send, below urllib3 and _OneWrite)."""
    out: list[bytes] = []
    real = http.client.HTTPConnection.send

    def record(self: http.client.HTTPConnection, data: Any) -> None:
        out.append(bytes(data))
        real(self, data)

    monkeypatch.setattr(http.client.HTTPConnection, "send", record)
    return out


def _api(url: str, *, one_write: bool) -> client.CoreV1Api:
    api = client.ApiClient(client.Configuration(host=url))
    if one_write:
        one_write_pools(api)
    return client.CoreV1Api(api)


def test_a_binding_goes_out_in_one_write_and_arrives_whole(
    host: tuple[str, type[_Recorder]], sends: list[bytes]
) -> None:
    url, handler = host
    binder = KubeBinder(_api(url, one_write=True))
    for n in range(3):
        binder.bind(namespace="ns", name=f"p{n}", uid=f"u{n}", version="7", node="a", assignment=_ONE)
    assert len(sends) == 3, [s[:40] for s in sends]  # one a Binding: head and body together
    for n, data in enumerate(sends):
        head, body = data.split(b"\r\n\r\n", 1)
        assert head.startswith(f"POST /api/v1/namespaces/ns/pods/p{n}/binding HTTP/1.1".encode())
        assert json.loads(body)["metadata"]["uid"] == f"u{n}"
    assert [(c, p) for c, p, _ in handler.seen] == [
        ("POST", f"/api/v1/namespaces/ns/pods/p{n}/binding") for n in range(3)
    ]
    assert [json.loads(b)["target"]["name"] for _, _, b in handler.seen] == ["a"] * 3
    assert len(handler.connections) == 1  # still one keep-alive connection


def test_without_it_urllib3_writes_head_and_body_apart(host: tuple[str, type[_Recorder]], sends: list[bytes]) -> None:
    """What one_write_pools changes: the client's own pools send a Binding in two writes."""
    url, _ = host
    KubeBinder(_api(url, one_write=False)).bind(
        namespace="ns", name="p", uid="u", version="7", node="a", assignment=_ONE
    )
    assert len(sends) == 2 and sends[0].endswith(b"\r\n\r\n") and json.loads(sends[1])["kind"] == "Binding"


def test_a_get_and_a_patch_still_work(host: tuple[str, type[_Recorder]], sends: list[bytes]) -> None:
    url, handler = host
    api = _api(url, one_write=True)
    assert kube.get_pod(api, namespace="ns", name="p") is not None
    version = kube.patch_pod_annotations(api, namespace="ns", name="p", uid="u", annotations={"k": "v"})
    assert version == "9"
    assert [c for c, _, _ in handler.seen] == ["GET", "PATCH"]
    assert json.loads(handler.seen[1][2])["metadata"]["annotations"] == {"k": "v"}
    assert sends[0].startswith(b"GET /api/v1/namespaces/ns/pods/p ") and sends[0].endswith(b"\r\n\r\n")


def test_core_api_makes_one_write_pools() -> None:
    manager = kube.core_api().api_client.rest_client.pool_manager
    assert manager.pool_classes_by_scheme["https"].ConnectionCls is kube._OneWriteHTTPSConnection
    assert manager.pool_classes_by_scheme["http"].ConnectionCls is kube._OneWriteHTTPConnection
