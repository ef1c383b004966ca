"""Serve a registry over HTTP (prometheus_client's threaded server); each endpoint gets its own port."""

from __future__ import annotations

from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(registry: CollectorRegistry, *, host: str = "0.0.0.0", port: int = 0) -> MetricsServer:
    """Start serving /metrics (any path) on host:port; port 0 picks a free one (tests)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
