"""The uvicorn settings both services serve with: the guarded protocol, the event loop and the connection bounds.

Defaults are the cheapest per request that is installed: the httptools parser and the uvloop event loop
(uvicorn[standard] brings both), else h11 and asyncio's own loop, with the same bounds either way
(vgpu_http.guard). benchmarks/http_serving.py measures each combination against the others in one run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

from vgpu_http.guard import guarded_protocol

KEEP_ALIVE_S = 5
PARSERS = ("auto", "httptools", "h11")
LOOPS = ("auto", "uvloop", "asyncio")


@dataclasses.dataclass(frozen=True)
class Choice:
    """Which parser and loop `server_options` picks when its caller names none; "auto": the faster one installed."""

    parser: str = "auto"
    loop: str = "auto"


# Only benchmarks/http_serving.py changes this, in the server process it starts, to compare the combinations.
DEFAULT = Choice()


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def event_loop(loop: str = "auto") -> str:
    """uvicorn's `loop=` value (uvicorn 0.54, uvicorn/config.py LOOP_FACTORIES): "uvloop" or "asyncio"."""
    if loop not in LOOPS:
        raise ValueError(f"event loop {loop!r}; allowed: {', '.join(LOOPS)}")
    if loop == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    return loop


# A server on a daemon thread (the extender's --health-port, the webhook's in-process mode of tests and benchmarks)
# runs asyncio's own loop: a uvloop loop still shutting down on a daemon thread while the interpreter finalises can
# crash the process (the leader e2e saw a replica exit by SIGSEGV instead of its exit code, once in ~18 loaded runs),
# and those servers are not where the per-request cost matters.
THREAD_LOOP = "asyncio"


def server_options(
    *, read_timeout_s: float, max_connections: int, choice: Choice | None = None, in_thread: bool = False
) -> dict[str, Any]:
    """Keyword arguments for uvicorn.Config / uvicorn.run (uvicorn 0.54, uvicorn/config.py `Config`): the guarded
    protocol (`http`), the loop (THREAD_LOOP for a server on a daemon thread), uvicorn's keep-alive timeout between
    requests and its cap on open connections (`limit_concurrency`, 503 beyond it)."""
    picked = choice or DEFAULT
    return {
        "http": guarded_protocol(read_timeout_s, parser=picked.parser),
        "loop": THREAD_LOOP if in_thread and picked.loop == "auto" else event_loop(picked.loop),
        "timeout_keep_alive": KEEP_ALIVE_S,
        "limit_concurrency": max_connections,
    }
