"""vgpu_http.guard_httptools.OneWrite: a response's head goes out with its body in one write, and nothing is held
past the loop step it was written in, a close, or the next write."""

from __future__ import annotations

import asyncio

from vgpu_http.guard_httptools import OneWrite


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__(extra={"peername": ("127.0.0.1", 1)})
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _step(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def test_head_and_body_written_in_one_step_go_out_as_one_write() -> None:
    loop = asyncio.new_event_loop()
    try:
        raw = Recorder()
        one = OneWrite(raw, loop)
        one.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert raw.writes == []  # held until the body
        one.write(memoryview(b"{}"))
        one.write(b"more")  # anything after goes straight out
        assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b"more"]
        _step(loop)  # the scheduled flush finds nothing held
        assert len(raw.writes) == 2
        assert one.get_extra_info("peername") == ("127.0.0.1", 1) and not one.is_closing()
    finally:
        loop.close()


def test_a_write_alone_goes_out_at_the_end_of_its_step() -> None:
    loop = asyncio.new_event_loop()
    try:
        raw = Recorder()
        one = OneWrite(raw, loop)
        one.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        _step(loop)
        assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        one.write(b"HTTP/1.1 200 OK\r\n\r\n")  # not the first write: not held
        assert raw.writes[-1] == b"HTTP/1.1 200 OK\r\n\r\n"
    finally:
        loop.close()


def test_close_sends_what_is_held_first_and_a_closed_connection_gets_nothing() -> None:
    loop = asyncio.new_event_loop()
    try:
        raw = Recorder()
        one = OneWrite(raw, loop)
        one.write(b"head")
        one.close()
        assert raw.writes == [b"head"] and raw.closed and one.is_closing()
        _step(loop)
        assert raw.writes == [b"head"]

        gone = Recorder()
        late = OneWrite(gone, loop)
        late.write(b"head")
        gone.close()  # the protocol closed the connection itself before the step ended
        _step(loop)
        assert gone.writes == []
    finally:
        loop.close()
