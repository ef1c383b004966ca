from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from webhook.inventory import NodeAnnotationInventory, node_shape
from webhook.testing import node_annotation


def _node(name: str, gpus: list[tuple[str, int]] | None, rv: str = "1") -> SimpleNamespace:
    annotations = node_annotation(gpus, name) if gpus is not None else {}
    return SimpleNamespace(metadata=SimpleNamespace(name=name, annotations=annotations, resource_version=rv))


class FakeApi:
    """list_node + a scripted watch: each stream() call yields the next batch of events, then blocks."""

    def __init__(self, nodes: list[SimpleNamespace], batches: list[list[dict[str, Any]]]) -> None:
        self.nodes = nodes
        self.batches = batches
        self.lists = 0
        self.stopped = threading.Event()

    def list_node(self, **_: Any) -> SimpleNamespace:
        self.lists += 1
        return SimpleNamespace(items=list(self.nodes), metadata=SimpleNamespace(resource_version="1"))

    def watch(self) -> Any:
        api = self

        class W:
            def stream(self, _fn: Any, **kw: Any) -> Iterator[dict[str, Any]]:
                if api.batches:
                    for event in api.batches.pop(0):
                        obj = event["object"]
                        if event["type"] != "ERROR":  # the world changes as the events say
                            api.nodes = [n for n in api.nodes if n.metadata.name != obj.metadata.name]
                            if event["type"] != "DELETED":
                                api.nodes.append(obj)
                        yield event
                else:
                    api.stopped.wait(0.05)

            def stop(self) -> None:
                pass

        return W()


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_node_shape_ignores_missing_and_broken_annotations() -> None:
    assert node_shape(_node("a", None)) is None
    broken = SimpleNamespace(metadata=SimpleNamespace(name="b", annotations={"vgpu.io/node-inventory": "{"}))
    assert node_shape(broken) is None
    assert node_shape({"metadata": {"name": "c", "annotations": node_annotation([("H100", 80000)], "c")}}) is not None


def test_list_then_watch_updates_and_relists_on_error() -> None:
    api = FakeApi(
        [_node("a", [("H100", 81559)] * 2), _node("plain", None)],
        [
            [{"type": "ADDED", "object": _node("b", [("L40S", 46068)] * 8, "2")}],
            [{"type": "ERROR", "object": None, "raw_object": {"code": 410}}],
            [{"type": "DELETED", "object": _node("a", [("H100", 81559)] * 2, "4")}],
        ],
    )
    inv = NodeAnnotationInventory(api=api, watch_factory=api.watch, backoff_s=0.01)
    assert inv.summary() is None and not inv.ready()
    inv.start()
    try:
        assert inv.wait_synced(30)  # returns once synced; 30 s only bounds a loaded machine's stall
        _wait(lambda: (s := inv.summary()) is not None and s.max_gpus_per_node == 8)
        summary = inv.summary()
        assert summary is not None and summary.max_gpu_memory_mib == 81559
        _wait(lambda: api.lists >= 2)  # the ERROR event forced a relist
        _wait(lambda: (s := inv.summary()) is not None and s.max_gpu_memory_mib == 46068)
    finally:
        api.stopped.set()
        inv.stop()
