"""/filter, /prioritize and /preempt run on the extender's own worker threads (scheduler_extender.app.VERB_THREADS),
not on the event loop and not through anyio's thread pool, and answer as before."""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import httpx

from scheduler_extender.app import VERB_THREADS, create_app
from scheduler_extender.service import ExtenderService
from tests.unit.test_extender_service import FakeBinder, _pod, _state


def test_verbs_run_on_the_verb_threads_and_answer() -> None:
    svc = ExtenderService(_state(), FakeBinder())
    seen: list[str] = []
    for verb in ("filter", "prioritize"):
        real = getattr(svc, verb)

        def record(args: Any, real: Any = real) -> Any:
            seen.append(threading.current_thread().name)
            return real(args)

        setattr(svc, verb, record)
    body = {"Pod": copy.deepcopy(_pod("q", 10)), "NodeNames": ["a", "b"]}

    async def scenario() -> tuple[httpx.Response, httpx.Response, set[str]]:
        loop_thread = threading.current_thread().name
        transport = httpx.ASGITransport(app=create_app(svc))
        async with httpx.AsyncClient(transport=transport, base_url="http://extender", timeout=30) as c:
            # More calls at once than there are verb threads: the rest wait for one, none is refused.
            calls = [c.post("/filter", json=body) for _ in range(VERB_THREADS * 2)]
            filtered = await asyncio.gather(*calls)
            prioritized = await c.post("/prioritize", json=body)
        assert all(r.status_code == 200 and r.json() == filtered[0].json() for r in filtered)
        return filtered[0], prioritized, {loop_thread}

    filtered, prioritized, loop_threads = asyncio.run(scenario())
    assert sorted(filtered.json()["NodeNames"]) == ["a", "b"]
    assert prioritized.status_code == 200 and isinstance(prioritized.json(), list)
    assert len(seen) == VERB_THREADS * 2 + 1
    assert all(name.startswith("verb") for name in seen) and not loop_threads & set(seen)
