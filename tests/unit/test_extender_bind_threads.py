"""Binds waiting on a slow apiserver run on threads of their own: /filter, on kube-scheduler's serial scheduling
cycle, still answers while more binds are in flight than the worker threads /filter uses (scheduler_extender.app)."""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import httpx

from scheduler_extender.app import BIND_THREADS, create_app
from scheduler_extender.service import ExtenderService
from tests.unit.test_extender_service import FakeBinder, _pod, _state

STUCK = 50  # more than anyio's 40 default worker threads


class StuckBinder(FakeBinder):
    """The apiserver does not answer reads until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.waiting = 0
        self._count = threading.Lock()

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        with self._count:
            self.waiting += 1
        self.release.wait(120)
        return super().get_pod(namespace=namespace, name=name)


def test_filter_answers_while_binds_hold_more_threads_than_it_uses() -> None:
    binder = StuckBinder()
    svc = ExtenderService(_state(), binder)
    pods = [_pod(f"p{i}", 10) for i in range(STUCK)]
    for p in pods:
        binder.pods[f"ns/{p['metadata']['name']}"] = p

    async def scenario() -> tuple[float, int]:
        transport = httpx.ASGITransport(app=create_app(svc))
        async with httpx.AsyncClient(transport=transport, base_url="http://extender", timeout=30) as c:
            binds = [
                asyncio.create_task(
                    c.post(
                        "/bind",
                        json={
                            "PodName": p["metadata"]["name"],
                            "PodNamespace": "ns",
                            "PodUID": p["metadata"]["uid"],
                            "Node": "a",
                        },
                    )
                )
                for p in pods
            ]
            # Every bind thread is stuck in the apiserver, the other binds wait for one (a loaded machine may take
            # seconds).
            for _ in range(6000):
                if binder.waiting == min(STUCK, BIND_THREADS):
                    break
                await asyncio.sleep(0.01)
            stuck = binder.waiting
            loop = asyncio.get_running_loop()
            started = loop.time()
            body = {"Pod": copy.deepcopy(_pod("q", 10)), "NodeNames": ["a", "b"]}
            # Without threads of their own the binds would hold /filter until they are released (120 s); a generous
            # bound tells the two apart on a loaded machine too. How fast is for benchmarks, not this test.
            answer = await asyncio.wait_for(c.post("/filter", json=body), 60)
            took = loop.time() - started
            assert not binder.release.is_set()
            assert answer.status_code == 200 and sorted(answer.json()["NodeNames"]) == ["a", "b"]
            binder.release.set()
            done = await asyncio.gather(*binds)
            assert all(r.status_code == 200 for r in done)
            return took, stuck

    took, stuck = asyncio.run(scenario())
    assert stuck == min(STUCK, BIND_THREADS) and took < 60
