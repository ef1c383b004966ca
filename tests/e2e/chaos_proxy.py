"""A fault-injecting HTTPS proxy in front of kube-apiserver, for one client (the extender) in the chaos e2e.

It terminates TLS with a serving certificate from the control plane's CA (so the client's kubeconfig only changes
its server URL) and re-originates every request to the apiserver with the client's own certificate (so RBAC stays
the client's). Seeing requests, not only bytes, lets it fault by method and path:

- `delay(method, seconds, path_part)`: hold matching requests that long before forwarding them (a slow apiserver;
  the request still lands, late, as a queued one would);
- `fail(status, count, path_part)`: answer the next `count` matching requests with a Status error (429 with
  Retry-After, or 500) without forwarding them;
- `drop_watches()`: cut every open watch stream mid-flight (the client sees the connection end).

HTTP/1.1 with keep-alive, one thread per client connection; watch responses are streamed chunk by chunk.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import yaml

if TYPE_CHECKING:
    from tests.e2e.controlplane import ControlPlane

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


@dataclass
class Faults:
    delays: list[tuple[str, float, str]] = field(default_factory=list)  # (method, seconds, path part)
    failures: list[list[object]] = field(default_factory=list)  # [status, remaining, path part]
    counts: dict[str, int] = field(default_factory=dict)


class ChaosProxy:
    def __init__(
        self, upstream: str, *, ca_file: Path, client_cert: Path, client_key: Path, serving: tuple[Path, Path]
    ):
        u = urlsplit(upstream)
        self.upstream_host, self.upstream_port = u.hostname or "127.0.0.1", u.port or 443
        self.upstream_ctx = ssl.create_default_context(cafile=str(ca_file))
        self.upstream_ctx.load_cert_chain(str(client_cert), str(client_key))
        serve_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serve_ctx.load_cert_chain(str(serving[0]), str(serving[1]))
        self.faults = Faults()
        self._lock = threading.Lock()
        self._watches: set[socket.socket] = set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = serve_ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="chaos-proxy", daemon=True)

    # -- control ----------------------------------------------------------------------------------------------

    def start(self) -> ChaosProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.drop_watches()

    def delay(self, method: str, seconds: float, path_part: str = "") -> None:
        with self._lock:
            self.faults.delays.append((method.upper(), seconds, path_part))

    def fail(self, status: int, count: int, path_part: str = "") -> None:
        with self._lock:
            self.faults.failures.append([status, count, path_part])

    def heal(self) -> None:
        with self._lock:
            self.faults.delays.clear()
            self.faults.failures.clear()

    def drop_watches(self) -> int:
        with self._lock:
            socks, self._watches = list(self._watches), set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return len(socks)

    def count(self, what: str) -> int:
        with self._lock:
            return self.faults.counts.get(what, 0)

    # -- serving ----------------------------------------------------------------------------------------------

    def _bump(self, what: str) -> None:
        self.faults.counts[what] = self.faults.counts.get(what, 0) + 1

    def _decide(self, method: str, path: str) -> tuple[float, int]:
        with self._lock:
            self._bump("requests")
            delay = max((s for m, s, p in self.faults.delays if m == method and p in path), default=0.0)
            for f in self.faults.failures:
                status, left, part = f
                if isinstance(left, int) and left > 0 and str(part) in path:
                    f[1] = left - 1
                    self._bump(f"answered {status}")
                    return delay, int(str(status))
            if delay:
                self._bump(f"delayed {method}")
            return delay, 0

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        delay, status = self._decide(h.command, h.path)
        if status:
            self._error(h, status)
            return
        if delay:
            time.sleep(delay)
        watch = "watch=true" in h.path.lower()
        conn = http.client.HTTPSConnection(
            self.upstream_host, self.upstream_port, context=self.upstream_ctx, timeout=None if watch else 120
        )
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            h.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    h.send_header(k, v)
            if watch:
                self._stream(h, resp, conn)
            else:
                data = resp.read()
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
        except (OSError, http.client.HTTPException):  # a cut watch or a client that went away
            h.close_connection = True
        finally:
            conn.close()

    def _stream(
        self, h: BaseHTTPRequestHandler, resp: http.client.HTTPResponse, conn: http.client.HTTPSConnection
    ) -> None:
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        with self._lock:
            self._watches.add(h.connection)
            if conn.sock is not None:
                self._watches.add(conn.sock)
            self._bump("watches")
        try:
            while chunk := resp.read1(65536):
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
        finally:
            h.close_connection = True
            with self._lock:
                self._watches.discard(h.connection)
                if conn.sock is not None:
                    self._watches.discard(conn.sock)

    def _error(self, h: BaseHTTPRequestHandler, status: int) -> None:
        reason = "TooManyRequests" if status == 429 else "InternalError"
        data = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": reason,
                "code": status,
                "message": f"chaos proxy: injected {status}",
            }
        ).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        if status == 429:
            h.send_header("Retry-After", "1")
        h.end_headers()
        h.wfile.write(data)


def behind_proxy(cp: ControlPlane, name: str, kubeconfig: Path) -> ChaosProxy:
    """Start a proxy that forwards with the client certificate of `kubeconfig`, and point that kubeconfig at it
    (only its server URL changes; the client then reaches the apiserver through the proxy alone)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    user = doc["users"][0]["user"]
    cert, key = cp.workdir / f"{name}-proxy-client.crt", cp.workdir / f"{name}-proxy-client.key"
    cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    key.chmod(0o600)
    proxy = ChaosProxy(
        cp.server, ca_file=cp.ca_file, client_cert=cert, client_key=key, serving=cp.issue_server_cert(f"{name}-proxy")
    ).start()
    doc["clusters"][0]["cluster"]["server"] = proxy.url
    kubeconfig.write_text(yaml.safe_dump(doc))
    return proxy
