"""The Binding POST (`scheduler_extender.kube.post_json`) against a real HTTP/1.1 server standing in for the apiserver:
what it sends (path, JSON body, headers, the client's token) and what a refusal raises - the same ApiException
subclasses, status and body the generated client's call raised, which /bind reads (409: read the pod and retry,
404/422: the message passed on in its answer) - with the connection kept for the next call either way."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException, ConflictException, NotFoundException

from scheduler_extender import kube
from scheduler_extender.kube import KubeBinder
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice

_ONE = Assignment("a", (ContainerAssignment("c", (DeviceSlice("GPU-a-0", 0, 1024, 50),)),))


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Apiserver(BaseHTTPRequestHandler):
    """Answers each POST with the next (status, body) of `answers`; records what it got."""

    protocol_version = "HTTP/1.1"
    connections: list[int] = []
    got: list[tuple[str, str, dict[str, str], Any]] = []
    answers: list[tuple[int, dict[str, Any]]] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.got.append((self.command, self.path, dict(self.headers.items()), body))
        status, answer = self.answers.pop(0) if self.answers else (201, {"kind": "Status", "status": "Success"})
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[client.Configuration, type[_Apiserver]]]:
    handler = type("Handler", (_Apiserver,), {"connections": [], "got": [], "answers": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield client.Configuration(host=f"http://127.0.0.1:{httpd.server_address[1]}"), handler
    httpd.shutdown()
    httpd.server_close()


def _api(conf: client.Configuration) -> client.CoreV1Api:
    return client.CoreV1Api(client.ApiClient(conf))


def test_the_binding_sent_as_the_generated_client_sent_it(
    server: tuple[client.Configuration, type[_Apiserver]],
) -> None:
    conf, handler = server
    conf.api_key = {"authorization": "Bearer sekrit"}
    binder = KubeBinder(_api(conf), clock=lambda: 1234.5)
    binder.bind(namespace="ns", name="p-0", uid="u0", version="7", node="node-a", assignment=_ONE)
    [(method, path, headers, body)] = handler.got
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/pods/p-0/binding")
    assert headers["Content-Type"] == "application/json" and headers["Accept"] == "application/json"
    assert headers["authorization"] == "Bearer sekrit"
    assert headers["User-Agent"].startswith("OpenAPI-Generator/")
    assert body["kind"] == "Binding" and body["apiVersion"] == "v1"
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"], meta["resourceVersion"]) == ("p-0", "ns", "u0", "7")
    assert meta["annotations"]["vgpu.io/bind-phase"] == "allocating"
    assert meta["annotations"]["vgpu.io/bind-time"] == "1234.500"
    assert "GPU-a-0" in meta["annotations"]["vgpu.io/assignment"]


def test_no_assignment_no_version_no_uid_leave_the_keys_out(
    server: tuple[client.Configuration, type[_Apiserver]],
) -> None:
    conf, handler = server
    kube.create_binding(_api(conf), namespace="ns", name="p", uid="", node="n")
    assert handler.got[0][3]["metadata"] == {"name": "p", "namespace": "ns"}
    assert "authorization" not in handler.got[0][2]


@pytest.mark.parametrize(
    ("status", "reason", "kind"),
    [(409, "Conflict", ConflictException), (404, "NotFound", NotFoundException), (422, "Invalid", ApiException)],
)
def test_a_refusal_raises_with_its_status_and_message_and_keeps_the_connection(
    server: tuple[client.Configuration, type[_Apiserver]], status: int, reason: str, kind: type[ApiException]
) -> None:
    conf, handler = server
    message = f"Operation cannot be fulfilled on pods/binding p: refused with {status}"
    handler.answers = [(status, _status(status, reason, message))]
    binder = KubeBinder(_api(conf))
    with pytest.raises(kind) as caught:
        binder.bind(namespace="ns", name="p", uid="u", version="7", node="n", assignment=_ONE)
    assert caught.value.status == status
    assert message in str(caught.value.body) and message in str(caught.value)  # /bind's answer quotes str(exc)
    binder.bind(namespace="ns", name="p", uid="u", version="8", node="n", assignment=_ONE)  # then one that lands
    assert len(handler.got) == 2 and len(handler.connections) == 1


def test_a_server_error_is_a_service_exception_with_its_body(
    server: tuple[client.Configuration, type[_Apiserver]],
) -> None:
    conf, handler = server
    handler.answers = [(500, _status(500, "Timeout", "etcdserver: request timed out"))]
    with pytest.raises(ApiException) as caught:
        kube.create_binding(_api(conf), namespace="ns", name="p", uid="u", node="n")
    assert caught.value.status == 500 and "request timed out" in str(caught.value.body)


def test_no_server_is_not_an_http_answer() -> None:
    """Nothing listening: urllib3's error, with no status - /bind's "may still land" check reads it so."""
    conf = client.Configuration(host="http://127.0.0.1:9")
    conf.retries = False
    with pytest.raises(Exception) as caught:
        kube.create_binding(_api(conf), namespace="ns", name="p", uid="u", node="n")
    assert getattr(caught.value, "status", None) is None


def test_the_raw_binding_post_escapes_namespace_and_name_into_one_path_segment_each(
    server: tuple[client.Configuration, type[_Apiserver]],
) -> None:
    """/bind's PodNamespace and PodName come from its caller: a slash, '?', '#', '%' or space in them must not change
    which resource the POST names (each is percent-encoded, as the generated client's path parameters were)."""
    conf, handler = server
    binder = KubeBinder(client.CoreV1Api(client.ApiClient(conf)))
    binder.bind(namespace="n s%", name="a/b?x=1#y", uid="u", version="3", node="node-a", assignment=None)
    [(_, path, _, body)] = handler.got
    assert path == "/api/v1/namespaces/n%20s%25/pods/a%2Fb%3Fx%3D1%23y/binding"
    assert (body["metadata"]["namespace"], body["metadata"]["name"]) == ("n s%", "a/b?x=1#y")
