"""uvicorn's httptools protocol with vgpu_http.guard's bounds: a read deadline per request and a 16 KiB head cap.

Imported only where httptools is installed (uvicorn/protocols/http/httptools_impl.py imports it at its top).
Depends on uvicorn 0.54's HttpToolsProtocol (uvicorn/protocols/http/httptools_impl.py): `data_received` feeds the
parser, whose callbacks `on_headers_complete` start a request's cycle and `on_message_complete` end its body; the
cycle calls `on_response_complete` once its response is written; `connection_lost` drops the parser.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from vgpu_http.guard import MAX_HEAD_BYTES, ReadDeadline

HEAD_TOO_LARGE = (
    f"request head (request line and headers) over {MAX_HEAD_BYTES} bytes; at most {MAX_HEAD_BYTES} allowed"
)


class OneWrite(asyncio.Transport):
    """A request cycle's view of the connection that sends a response's head and body in one write.

    uvicorn 0.54's `RequestResponseCycle.send` (uvicorn/protocols/http/httptools_impl.py) writes the status line and
    headers on `http.response.start` and the body on `http.response.body`: two writes, and over TLS two records and two
    send calls each way, for every answer (a fifth of the extender's event-loop CPU in benchmarks/scale.py). Here the
    cycle's first write is held and sent with the next one; it is never held past the loop's current step (a
    `call_soon` sends it alone), a close, or any other write, so what goes out and in what order is unchanged."""

    __slots__ = ("_first", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            head, self._held = self._held, None
            self._transport.write(head + bytes(data))
        elif self._first:
            self._first = False
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held write on its own (the end of the step it was made in came first)."""
        if self._held is not None:
            head, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


def guarded_httptools(read_timeout_s: float) -> type[HttpToolsProtocol]:
    """An HttpToolsProtocol subclass that closes a connection whose request has not arrived whole in time, and answers
    431 to a head still incomplete after MAX_HEAD_BYTES."""

    class GuardedHttpTools(HttpToolsProtocol):
        read_timeout = read_timeout_s
        _deadline: ReadDeadline
        # Requests whose body has fully arrived, and responses written: more in than out means one is being
        # served (or queued behind it), so the deadline leaves the connection alone.
        _received = 0
        _answered = 0
        # Whether the bytes arriving belong to a head not yet parsed whole, and how many of them have come.
        _in_head = True
        _head_bytes = 0

        def _too_slow(self) -> None:
            if self._received <= self._answered and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._deadline = ReadDeadline(self.loop, read_timeout_s, self._too_slow)
            self._deadline.arm()

        def data_received(self, data: bytes) -> None:
            # Counted before parsing: whether this chunk ends the head is known only after. A chunk that ends one
            # request and starts the next is not counted for the next, so the cap may be passed by one chunk.
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(431, HEAD_TOO_LARGE)

        def _refuse(self, status: int, msg: str) -> None:
            """Answer `status` with `msg` and close, as uvicorn's send_400_response does for a parse error."""
            body = msg.encode("ascii")
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
            self.transport.write(b"".join(head))
            self.transport.close()

        def on_headers_complete(self) -> None:
            self._in_head = False
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not before:  # the cycle uvicorn just made for this request (none for an upgrade)
                self.cycle.transport = OneWrite(self.transport, self.loop)

        def on_message_complete(self) -> None:
            self._received += 1
            self._in_head, self._head_bytes = True, 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._answered += 1
            super().on_response_complete()
            if not self.transport.is_closing():
                self._deadline.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

    return GuardedHttpTools
