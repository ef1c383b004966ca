"""uvicorn's httptools protocol with vgpu_http.guard's bounds: a read deadline per request and a 16 KiB head cap.

Imported only where httptools is installed (uvicorn/protocols/http/httptools_impl.py imports it at its top).
Depends on uvicorn 0.54's HttpToolsProtocol (uvicorn/protocols/http/httptools_impl.py): `data_received` feeds the
parser, whose callbacks `on_headers_complete` start a request's cycle and `on_message_complete` end its body; the
cycle calls `on_response_complete` once its response is written; `connection_lost` drops the parser.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from vgpu_http.guard import MAX_HEAD_BYTES, ReadDeadline

HEAD_TOO_LARGE = (
    f"request head (request line and headers) over {MAX_HEAD_BYTES} bytes; at most {MAX_HEAD_BYTES} allowed"
)


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
            super().on_headers_complete()

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
