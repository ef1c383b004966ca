"""uvicorn's HTTP/1.1 protocol with a deadline on reading each request, so a slow client cannot hold a connection.

uvicorn 0.54 has no header or body read timeout: `timeout_keep_alive` only runs between requests and is cancelled
by the first byte that arrives (uvicorn/protocols/http/h11_impl.py, `data_received` -> `_unset_keepalive_if_
required`), so a client sending its headers a byte a second keeps a connection forever (400 of them for 40 s: none
closed). Here a request must arrive whole, headers and body, within `read_timeout_s` of the connection opening or
of the previous response; otherwise the connection is closed. Headers stay capped by h11's max incomplete event
size (16 KiB), the number of connections by uvicorn's `limit_concurrency` (503 beyond it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1000


def guarded_protocol(read_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol subclass that closes a connection whose request has not arrived whole in time."""

    class Guarded(H11Protocol):
        read_timeout = read_timeout_s
        _read_deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
            self._read_deadline = self.loop.call_later(read_timeout_s, self._too_slow)

        def _too_slow(self) -> None:
            self._read_deadline = None
            # DONE: the request is in and its response is being made; uvicorn's keep-alive timer takes over after it.
            if self.conn.their_state not in (h11.DONE, h11.MUST_CLOSE) and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None
            super().connection_lost(exc)

    return Guarded
