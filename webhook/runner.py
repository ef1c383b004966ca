"""Run the Starlette app on uvicorn over TLS, in the foreground (the service) or a thread (tests, benchmarks).

uvicorn's `ssl_context_factory` hands it our `ReloadingTls.listening` context, so rotated certificates
take effect without a restart. We bind the socket ourselves so port 0 works and the port is known.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette

from vgpu_http.guard import MAX_CONNECTIONS, READ_TIMEOUT_S
from vgpu_http.serving import THREAD_LOOP, server_options
from webhook.tls import ReloadingTls


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class TlsServer:
    def __init__(
        self,
        app: Starlette,
        tls: ReloadingTls,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.tls = tls
        self.sock = bind(host, port)
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            ssl_context_factory=lambda _cfg, _default: tls.listening,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            # Connection bounds and the parser and loop (vgpu_http.serving): a deadline on reading each request, a
            # 16 KiB head cap, the keep-alive timeout between requests, a cap on open connections (503 beyond it).
            **server_options(read_timeout_s=read_timeout_s, max_connections=max_connections),
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (uvicorn's handlers; drains in-flight requests)."""
        self.server.run(sockets=[self.sock])

    def start(self, timeout: float = 10.0) -> TlsServer:
        # Server.run: a fresh loop in this thread, asyncio's (vgpu_http.serving.THREAD_LOOP: uvloop is for the
        # foreground process); off the main thread uvicorn installs no signal handlers (uvicorn 0.54,
        # uvicorn/server.py `run` -> config.get_loop_factory(), `capture_signals`).
        self.server.config.loop = THREAD_LOOP
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("webhook server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()
