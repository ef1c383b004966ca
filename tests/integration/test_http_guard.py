"""The guarded protocols (vgpu_http.guard) on a real uvicorn server on loopback, for each parser and event loop.

What a slow or oversized client meets is the same whichever parser serves it: a request not whole within the read
deadline is cut, a response slower than the deadline is not, a head still incomplete after 16 KiB is refused
(httptools: 431 naming the cap; h11: its 400), and the head cap counts one request, not a keep-alive connection.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.integration.http_fuzz import SLOW_BODY, SLOW_HEADERS, slow_client_closed_after
from vgpu_http.guard import MAX_HEAD_BYTES
from vgpu_http.serving import Choice, server_options

READ_TIMEOUT_S = 1.5  # short, so the slow-client tests end soon; long enough for a loaded machine to send a request
COMBINATIONS = [Choice("httptools", "uvloop"), Choice("httptools", "asyncio"), Choice("h11", "asyncio")]


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _slow(request: Request) -> PlainTextResponse:
    await asyncio.sleep(float(request.query_params["s"]))
    return PlainTextResponse("done")


async def _echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


APP = Starlette(routes=[Route("/ok", _ok), Route("/slow", _slow), Route("/echo", _echo, methods=["POST"])])


@pytest.fixture(scope="module", params=COMBINATIONS, ids=lambda c: f"{c.parser}-{c.loop}")
def server(request: pytest.FixtureRequest) -> Iterator[tuple[int, Choice]]:
    choice: Choice = request.param
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(
        APP,
        log_config=None,
        access_log=False,
        lifespan="off",
        **server_options(read_timeout_s=READ_TIMEOUT_S, max_connections=100, choice=choice),
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1], choice
    srv.should_exit = True
    thread.join(timeout=10)
    sock.close()


def _read_all(conn: socket.socket, until: float) -> bytes:
    """Everything the server sends until it closes the connection (or `until`, a monotonic time, passes)."""
    out = b""
    while time.monotonic() < until:
        conn.settimeout(max(0.01, until - time.monotonic()))
        try:
            data = conn.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


@pytest.mark.parametrize("request_bytes", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_a_request_not_whole_within_the_deadline_is_cut(server: tuple[int, Choice], request_bytes: bytes) -> None:
    port, _ = server
    closed = slow_client_closed_after("127.0.0.1", port, tls=False, give_up_s=30, request=request_bytes)
    assert closed is not None and READ_TIMEOUT_S - 0.05 <= closed < READ_TIMEOUT_S + 15


def test_a_response_slower_than_the_deadline_is_not_cut(server: tuple[int, Choice]) -> None:
    port, _ = server
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        slow = client.get("/slow", params={"s": 2.5 * READ_TIMEOUT_S})
        assert slow.status_code == 200 and slow.text == "done"
        # the same keep-alive connection serves the next request
        assert client.get("/ok").text == "ok"


def test_a_pipelined_request_served_after_a_slow_one_is_not_cut(server: tuple[int, Choice]) -> None:
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(
            f"GET /slow?s={2 * READ_TIMEOUT_S} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            + f"GET /slow?s={2 * READ_TIMEOUT_S} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        answer = _read_all(conn, time.monotonic() + 30)
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.count(b"done") == 2, answer


def test_an_incomplete_head_over_16_kib_is_refused(server: tuple[int, Choice]) -> None:
    port, choice = server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        # 1 KiB past the cap, never ending the header; then nothing more, so the server reads all that was sent
        # and its answer is not lost to a reset
        conn.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES + 1024))
        answer = _read_all(conn, time.monotonic() + 20)
    if choice.parser == "httptools":
        assert answer.startswith(b"HTTP/1.1 431 "), answer
        assert f"at most {MAX_HEAD_BYTES} allowed".encode() in answer
    else:  # uvicorn's h11 protocol answers h11's "Receive buffer too long" with its generic 400
        assert answer.startswith(b"HTTP/1.1 400 "), answer


def test_heads_under_the_cap_pass_however_many_come_on_one_connection(server: tuple[int, Choice]) -> None:
    port, _ = server
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        # one large head arriving whole: under the cap
        assert client.get("/ok", headers={"x-pad": "a" * (MAX_HEAD_BYTES - 2048)}).text == "ok"
        # 40 requests of 1 KiB heads and bodies on one keep-alive connection: the cap is per request
        for i in range(40):
            r = client.post("/echo", content=b"b" * 1024, headers={"x-pad": "a" * 1024, "x-i": str(i)})
            assert r.status_code == 200 and r.text == "1024"
