"""uvicorn's HTTP/1.1 protocols with a deadline on reading each request, so a slow client cannot hold a connection.

uvicorn 0.54 has no header or body read timeout: `timeout_keep_alive` only runs between requests and is cancelled
by the first byte that arrives (uvicorn/protocols/http/h11_impl.py and httptools_impl.py, `data_received` ->
`_unset_keepalive_if_required`), so a client sending its headers a byte a second keeps a connection forever (400 of
them for 40 s: none closed). Here a request must arrive whole, headers and body, within `read_timeout_s` of the
connection opening or of the previous response; otherwise the connection is closed. The number of connections is
capped by uvicorn's `limit_concurrency` (503 beyond it).

Two parsers, the same guarantees: httptools (llhttp, in C; what the services run when it is installed, it costs
less CPU a request) and h11 (pure Python; the fallback). h11 refuses a head (request line and headers) still
incomplete after 16 KiB of bytes (h11 0.16, h11/_connection.py `DEFAULT_MAX_INCOMPLETE_EVENT_SIZE`, `next_event`:
"Receive buffer too long"); httptools buffers a head without a bound (it joins a header's pieces in Python), so
the httptools protocol counts the bytes of an incomplete head itself and refuses it past the same 16 KiB.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1000
# h11's cap on an incomplete head (h11 0.16, h11/_connection.py DEFAULT_MAX_INCOMPLETE_EVENT_SIZE), kept for httptools.
MAX_HEAD_BYTES = 16 * 1024


class ReadDeadline:
    """One connection's deadline on reading a request, for both protocols: armed when the connection opens and
    again after each response, cancelled when it closes; `expired` decides what a late request means."""

    __slots__ = ("_expired", "_handle", "_loop", "_seconds")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, expired: Callable[[], None]) -> None:
        self._loop, self._seconds, self._expired = loop, seconds, expired
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        self.cancel()
        self._handle = self._loop.call_later(self._seconds, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._expired()


def httptools_available() -> bool:
    """Whether the C parser is installed (uvicorn[standard] brings it; a bare uvicorn does not)."""
    return importlib.util.find_spec("httptools") is not None


def guarded_protocol(read_timeout_s: float, *, parser: str = "auto") -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's `http=`: `parser` "httptools", "h11", or "auto" (httptools when installed)."""
    if parser == "auto":
        parser = "httptools" if httptools_available() else "h11"
    if parser == "h11":
        return guarded_h11(read_timeout_s)
    if parser == "httptools":
        from vgpu_http.guard_httptools import guarded_httptools

        return guarded_httptools(read_timeout_s)
    raise ValueError(f"HTTP parser {parser!r}; allowed: auto, httptools, h11")


def guarded_h11(read_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol subclass that closes a connection whose request has not arrived whole in time."""

    class Guarded(H11Protocol):
        read_timeout = read_timeout_s
        _deadline: ReadDeadline

        def _too_slow(self) -> None:
            # DONE: the request is in and its response is being made; uvicorn's keep-alive timer takes over after it.
            if self.conn.their_state not in (h11.DONE, h11.MUST_CLOSE) and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._deadline = ReadDeadline(self.loop, read_timeout_s, self._too_slow)
            self._deadline.arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._deadline.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

    return Guarded
