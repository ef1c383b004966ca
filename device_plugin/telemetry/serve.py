"""Serve a registry over HTTP, one thread per connection; each endpoint gets its own port.

prometheus_client's own start_http_server neither times connections out nor bounds them: a client that
opens a connection and sends nothing (or a byte now and then) holds a thread for ever. Here each connection
has `timeout_s` in all to send its request and be answered — a deadline, not a per-read timeout, so a trickle
does not extend it — and at most `max_connections` are served at once; more are closed at once
(docs/device-plugin.md, "Limits").

With `version` (the watchdog's snapshot getter) the exposition is rendered once per snapshot and the same
bytes are served to every scrape until the next one: the llm-d router scrapes the node's feed once per
endpoint per tick (50 ms by default), so a node with many endpoints is scraped hundreds of times a second
while the data changes once a second (benchmarks/router_feed_scrape.py).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer

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
        self._timed_out = False
        deadline = threading.Timer(self.bounded.timeout_s, self._expire)
        deadline.daemon = True
        deadline.start()
        try:
            super().handle()
        except TimeoutError:  # the per-read timeout fired before the deadline did: the same expiry
            self.close_connection = True
            self._count_expiry()
        except OSError:  # reset, or the deadline's shutdown: nothing to answer
            self.close_connection = True
        finally:
            deadline.cancel()

    def _expire(self) -> None:
        self._count_expiry()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _count_expiry(self) -> None:
        """Once per connection, whichever of the read timeout and the deadline fires first."""
        with self.bounded.count_lock:
            if not self._timed_out:
                self._timed_out = True
                self.bounded.expired += 1

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
        self.count_lock = threading.Lock()
        super().__init__(*args, **kw)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count:
            full = self.active >= self.max_connections
            if not full:
                self.active += 1
        if full:
            with self.count_lock:
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


class CachedExposition:
    """A WSGI app serving `registry`'s text exposition, rendered again only when `version()` returns another
    object (identity: the watchdog publishes a new Snapshot per cycle). Any path, any method: like the
    exporter it replaces, the body is the whole registry."""

    def __init__(self, registry: CollectorRegistry, version: Callable[[], object]) -> None:
        self.registry = registry
        self.version = version
        self.renders = 0
        self._lock = threading.Lock()
        self._key: object = None
        self._body = b""

    def body(self) -> bytes:
        key = self.version()
        with self._lock:  # one render per snapshot even when scrapes arrive together
            if key is not self._key or not self.renders:
                self._body = generate_latest(self.registry)
                self._key = key
                self.renders += 1
            return self._body

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = self.body()
        # the text format 0.0.4, what make_wsgi_app answers without an Accept header and what the router's
        # dcgm-data-source parses (expfmt.NewTextParser: source/dcgm/datasource.go @ 7addc8ec)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(body)))])
        return [body]


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
    version: Callable[[], object] | None = None,
) -> MetricsServer:
    """Start serving /metrics (any path) on host:port; port 0 picks a free one (tests). With `version`, the
    exposition is rendered once per value of version() (CachedExposition)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type(
        "ExporterServer",
        (_BoundedServer,),
        {"address_family": family, "timeout_s": timeout_s, "max_connections": max_connections},
    )
    app = make_wsgi_app(registry) if version is None else CachedExposition(registry, version)
    httpd: WSGIServer = make_server(host, port, app, server_class, handler_class=_Handler)
    thread = threading.Thread(target=httpd.serve_forever, name=f"exporter-{httpd.server_port}", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)
