"""The extender's apiserver calls reuse their connections: an answer nothing reads is still read to its end.

A raw answer (`_preload_content=False`) holds its connection until its body is read; the Binding's was never read,
so every bind opened a new TLS connection (a handshake for the extender and for the apiserver: a fifth of the
extender's CPU in benchmarks/scale.py). Checked against a real HTTP/1.1 keep-alive server that counts the
connections it accepts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from scheduler_extender import kube
from scheduler_extender.kube import KubeBinder
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice

_ONE = Assignment("a", (ContainerAssignment("c", (DeviceSlice("GPU-a-0", 0, 1024, 50),)),))


class _KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1 with Content-Length: the connection stays open for the next request, as the apiserver's does."""

    protocol_version = "HTTP/1.1"
    connections: list[int] = []
    requests: list[str] = []
    status = 201

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.requests.append(f"{self.command} {self.path}")
        data = json.dumps({"kind": "Status", "status": "Success", "metadata": {"resourceVersion": "8"}}).encode()
        self.send_response(self.status if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_PATCH = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[client.CoreV1Api, type[_KeepAlive]]]:
    handler = type("Handler", (_KeepAlive,), {"connections": [], "requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{httpd.server_address[1]}")))
    yield api, handler
    httpd.shutdown()
    httpd.server_close()


def test_binds_one_after_another_share_one_connection(server: tuple[client.CoreV1Api, type[_KeepAlive]]) -> None:
    api, handler = server
    binder = KubeBinder(api)
    for n in range(6):
        binder.bind(namespace="ns", name=f"p{n}", uid=f"u{n}", version="7", node="a", assignment=_ONE)
    assert len(handler.requests) == 6 and all(r.endswith("/binding") for r in handler.requests)
    assert len(handler.connections) == 1  # one per bind before: each Binding's answer was left unread


def test_leader_label_writes_share_one_connection(server: tuple[client.CoreV1Api, type[_KeepAlive]]) -> None:
    api, handler = server
    for leading in (True, False, True):
        kube.mark_leader(api, namespace="ns", name="ext-0", leading=leading)
    assert handler.requests == ["PATCH /api/v1/namespaces/ns/pods/ext-0"] * 3
    assert len(handler.connections) == 1
