"""Serve a registry over HTTP, one thread per connection; each endpoint gets its own port.

prometheus_client's own start_http_server neither times connections out nor bounds them: a client that
opens a connection and sends nothing (or a byte now and then) holds a thread for ever. Here each connection
has `timeout_s` in all to send its request and be answered — a deadline, not a per-read timeout, so a trickle
does not extend it — and at most `max_connections` are served at once; more are closed at once
(docs/device-plugin.md, "Limits").
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)


class _Handler(WSGIRequestHandler):
    """No access log; a connection past its deadline or closed by the client ends quietly."""

    @property
    def bounded(self) -> _BoundedServer:
        return cast(_BoundedServer, self.server)

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.bounded.timeout_s)  # per read; the deadline below bounds the total

    def handle(self) -> None:
        deadline = threading.Timer(self.bounded.timeout_s, self._expire)
        deadline.daemon = True
        deadline.start()
        try:
            super().handle()
        except OSError:  # TimeoutError, reset, or the deadline's shutdown: nothing to answer
            self.close_connection = True
        finally:
            deadline.cancel()

    def _expire(self) -> None:
        self.bounded.expired += 1
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _BoundedServer(ThreadingWSGIServer):
    timeout_s: float = 10.0
    max_connections: int = 64

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.active = 0
        self.refused = 0
        self.expired = 0
        self._count = threading.Lock()
        super().__init__(*args, **kw)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count:
            full = self.active >= self.max_connections
            if not full:
                self.active += 1
        if full:
            self.refused += 1
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count:
                self.active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("exporter connection from %s failed", client_address, exc_info=True)


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(
    registry: CollectorRegistry,
    *,
    host: str = "0.0.0.0",
    port: int = 0,
    timeout_s: float = 10.0,
    max_connections: int = 64,
) -> MetricsServer:
    """Start serving /metrics (any path) on host:port; port 0 picks a free one (tests)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type(
        "ExporterServer",
        (_BoundedServer,),
        {"address_family": family, "timeout_s": timeout_s, "max_connections": max_connections},
    )
    httpd: WSGIServer = make_server(host, port, make_wsgi_app(registry), server_class, handler_class=_Handler)
    thread = threading.Thread(target=httpd.serve_forever, name=f"exporter-{httpd.server_port}", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)
