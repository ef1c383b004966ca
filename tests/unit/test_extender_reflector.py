"""scheduler_extender.kube.Reflector against a real HTTP server: list, then a chunked watch stream read as raw JSON
lines (events split across chunks, bookmarks, a 410 that relists, the server's timeout that rewatches)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from scheduler_extender.kube import Reflector


def _pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


class _Pods(BaseHTTPRequestHandler):
    """GET /api/v1/pods: a list at rv 10; with watch=true, the next scripted stream (a list of raw byte chunks)."""

    protocol_version = "HTTP/1.1"
    streams: list[list[bytes]] = []
    asked: list[str] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        if "watch=true" not in self.path:
            body = json.dumps({"metadata": {"resourceVersion": "10"}, "items": [_pod("listed", "10")]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        chunks = self.streams.pop(0) if self.streams else []
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for c in chunks:
            self.wfile.write(f"{len(c):x}\r\n".encode() + c + b"\r\n")
            self.wfile.flush()
            time.sleep(0.01)
        if not chunks:
            time.sleep(0.5)  # nothing scripted: an idle watch until the test stops the reflector
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@pytest.fixture
def server() -> Iterator[tuple[client.CoreV1Api, type[_Pods]]]:
    handler = type("Handler", (_Pods,), {"streams": [], "asked": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    conf = client.Configuration(host=f"http://127.0.0.1:{srv.server_address[1]}")
    yield client.CoreV1Api(client.ApiClient(conf)), handler
    srv.shutdown()
    srv.server_close()


def test_events_split_across_chunks_bookmarks_and_410(server: tuple[client.CoreV1Api, type[_Pods]]) -> None:
    api, handler = server
    added = _line("ADDED", _pod("a", "11"))
    modified = _line("MODIFIED", _pod("a", "12"))
    handler.streams = [
        # One event cut in three, two in one chunk, a bookmark, then the watch ends (the server's timeout).
        [added[:7], added[7:20], added[20:] + modified, _line("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
        [_line("DELETED", _pod("a", "16")), _line("ERROR", {"code": 410, "message": "too old"})],
    ]
    seen: list[tuple[str, str, str]] = []
    lists: list[list[str]] = []
    reflector = Reflector(
        name="pods",
        list_call=api.list_pod_for_all_namespaces,
        replace=lambda items: lists.append([p["metadata"]["name"] for p in items]),
        handle=lambda kind, obj: seen.append((kind, obj["metadata"]["name"], obj["metadata"]["resourceVersion"])),
        watch_timeout_s=5,
    )
    t = threading.Thread(target=reflector.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while reflector.relists < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    reflector.stop()
    t.join(30)
    assert seen == [("ADDED", "a", "11"), ("MODIFIED", "a", "12"), ("DELETED", "a", "16")]
    assert lists[:2] == [["listed"], ["listed"]]  # the 410 relisted
    watches = [p for p in handler.asked if "watch=true" in p]
    assert "resourceVersion=10" in watches[0] and "allowWatchBookmarks=true" in watches[0]
    assert "resourceVersion=15" in watches[1]  # the second watch starts at the bookmark's version


def test_watched_objects_are_slimmed_as_listed_ones(server: tuple[client.CoreV1Api, type[_Pods]]) -> None:
    """The pod reflector's `slim` (scheduler_extender.slim.slim_pod) applies to each event's object too: what the
    handlers hold no longer carries managedFields or the status beyond phase and nominatedNodeName."""
    from scheduler_extender.slim import slim_pod

    api, handler = server
    whole = _pod("a", "11")
    whole["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    whole["spec"] = {"nodeName": "n1"}
    whole["status"] = {"phase": "Running", "nominatedNodeName": "n1", "conditions": [{"type": "Ready"}]}
    handler.streams = [[_line("MODIFIED", whole), _line("ERROR", {"code": 410, "message": "too old"})]]
    seen: list[dict[str, Any]] = []
    listed: list[dict[str, Any]] = []
    reflector = Reflector(
        name="pods",
        list_call=api.list_pod_for_all_namespaces,
        replace=listed.extend,
        handle=lambda kind, obj: seen.append(obj),
        watch_timeout_s=5,
        slim=slim_pod,
    )
    t = threading.Thread(target=reflector.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while reflector.relists < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    reflector.stop()
    t.join(30)
    assert seen == [
        {
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "11"},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "nominatedNodeName": "n1"},
        }
    ]
    assert listed and "managedFields" not in listed[0]["metadata"]
