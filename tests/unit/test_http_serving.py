"""vgpu_http.serving: which parser and loop the services serve with, the fallbacks, and the errors for bad names."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol

from vgpu_http import guard, serving
from vgpu_http.serving import Choice, server_options


def test_auto_picks_httptools_and_uvloop_where_installed() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    opts = server_options(read_timeout_s=3.0, max_connections=7)
    assert issubclass(opts["http"], HttpToolsProtocol) and opts["http"].read_timeout == 3.0
    assert opts["loop"] == "uvloop"
    assert opts["limit_concurrency"] == 7 and opts["timeout_keep_alive"] == serving.KEEP_ALIVE_S


def test_auto_falls_back_to_h11_and_asyncio_when_they_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "httptools_available", lambda: False)
    monkeypatch.setattr(serving, "uvloop_available", lambda: False)
    opts = server_options(read_timeout_s=2.0, max_connections=1)
    assert issubclass(opts["http"], H11Protocol) and opts["http"].read_timeout == 2.0
    assert opts["loop"] == "asyncio"


def test_a_named_choice_is_kept() -> None:
    opts = server_options(read_timeout_s=1.0, max_connections=1, choice=Choice("h11", "asyncio"))
    assert issubclass(opts["http"], H11Protocol) and opts["loop"] == "asyncio"


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (Choice("picohttp", "auto"), "HTTP parser 'picohttp'; allowed: auto, httptools, h11"),
        (Choice("auto", "trio"), "event loop 'trio'; allowed: auto, uvloop, asyncio"),
    ],
)
def test_an_unknown_parser_or_loop_is_an_error_naming_the_allowed_ones(choice: Choice, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        server_options(read_timeout_s=1.0, max_connections=1, choice=choice)


def test_a_server_on_a_daemon_thread_runs_asyncio_unless_a_loop_is_named() -> None:
    """uvloop only where the process's exit is orderly (the main thread): a uvloop loop on a daemon thread at
    interpreter exit can end the process by SIGSEGV."""
    assert server_options(read_timeout_s=1.0, max_connections=1, in_thread=True)["loop"] == "asyncio"
    named = server_options(read_timeout_s=1.0, max_connections=1, in_thread=True, choice=Choice("auto", "uvloop"))
    assert named["loop"] == "uvloop"


def test_the_webhooks_in_process_server_runs_asyncio(tmp_path: Path) -> None:
    import asyncio
    import urllib.request

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from webhook import certs
    from webhook.runner import TlsServer
    from webhook.tls import ReloadingTls

    async def loop_kind(request: Request) -> PlainTextResponse:
        return PlainTextResponse(type(asyncio.get_running_loop()).__module__)

    pki = certs.write_dev_certs(tmp_path, ("localhost", "127.0.0.1"))
    tls = ReloadingTls(str(pki.cert), str(pki.key))
    server = TlsServer(Starlette(routes=[Route("/loop", loop_kind)]), tls).start(timeout=60)
    try:
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        with urllib.request.urlopen(f"https://127.0.0.1:{server.port}/loop", context=ctx, timeout=30) as resp:
            assert resp.read().decode().startswith("asyncio")
    finally:
        server.stop()
