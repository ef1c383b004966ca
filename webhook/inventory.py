"""Where the webhook learns the cluster's GPU shapes: nowhere, static settings, or Node annotations.

The Node source lists and watches Nodes (relisting on `410 Gone` and on any stream error, with
backoff) and keeps one `NodeShape` per node decoded from `vgpu.io/node-inventory`, the annotation the
device plugin writes. Readers get an immutable `InventorySummary` swapped in atomically, so the
admission path never takes a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from vgpu.annotations import NODE_INVENTORY, decode_inventory
from vgpu.errors import CodecError
from webhook.capacity import InventorySummary, NodeShape

log = logging.getLogger(__name__)


class InventorySource(Protocol):
    # False when the operator turned capacity checks off: no "inventory unknown" warning then.
    expected: bool

    def summary(self) -> InventorySummary | None: ...

    def ready(self) -> bool: ...


class NoInventory:
    expected = False

    def summary(self) -> InventorySummary | None:
        return None

    def ready(self) -> bool:
        return True


class StaticInventory:
    expected = True

    def __init__(self, *, max_gpu_memory_mib: int, max_gpus_per_node: int) -> None:
        self._summary = InventorySummary.static(
            max_gpu_memory_mib=max_gpu_memory_mib, max_gpus_per_node=max_gpus_per_node
        )

    def summary(self) -> InventorySummary | None:
        return self._summary

    def ready(self) -> bool:
        return True


def node_shape(node: Any) -> NodeShape | None:
    """The shape advertised by a Node (client model or dict); None without a valid inventory annotation."""
    meta = node.get("metadata") if isinstance(node, Mapping) else getattr(node, "metadata", None)
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else getattr(meta, "annotations", None)
    raw = (annotations or {}).get(NODE_INVENTORY)
    if not isinstance(raw, str):
        return None
    try:
        gpus = decode_inventory(raw)
    except CodecError as exc:
        log.warning("ignoring node %s: %s", _name(node), exc)
        return None
    return NodeShape.of(gpus) if gpus else None


def _name(node: Any) -> str:
    meta = node.get("metadata") if isinstance(node, Mapping) else getattr(node, "metadata", None)
    name = meta.get("name") if isinstance(meta, Mapping) else getattr(meta, "name", None)
    return str(name or "")


class NodeAnnotationInventory:
    """Nodes' `vgpu.io/node-inventory` annotations, kept current by list + watch in a daemon thread."""

    expected = True

    def __init__(
        self,
        *,
        api: Any,
        watch_factory: Callable[[], Any] | None = None,
        watch_timeout_s: int = 300,
        backoff_s: float = 1.0,
    ) -> None:
        self._api = api  # kubernetes.client.CoreV1Api (or anything with list_node)
        self._watch_factory = watch_factory or _default_watch
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._shapes: dict[str, NodeShape] = {}
        self._summary = InventorySummary(frozenset())
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- readers ------------------------------------------------------------------------------------

    def summary(self) -> InventorySummary | None:
        return self._summary if self._synced.is_set() else None

    def ready(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # -- updates ------------------------------------------------------------------------------------

    def replace(self, nodes: Iterable[Any]) -> None:
        self._shapes = {_name(n): s for n in nodes if (s := node_shape(n)) is not None}
        self._publish()
        self._synced.set()

    def apply(self, event_type: str, node: Any) -> None:
        name = _name(node)
        shape = None if event_type == "DELETED" else node_shape(node)
        if shape is None:
            if self._shapes.pop(name, None) is None:
                return
        elif self._shapes.get(name) == shape:
            return
        else:
            self._shapes[name] = shape
        self._publish()

    def _publish(self) -> None:
        self._summary = InventorySummary(frozenset(self._shapes.values()))

    # -- the loop -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except Exception as exc:  # any API or stream failure: relist after a pause
                log.warning("node inventory watch failed, relisting: %s", exc)
                self._stop.wait(self._backoff_s)

    def _list_and_watch(self) -> None:
        listing = self._api.list_node()
        self.replace(listing.items)
        version = listing.metadata.resource_version
        while not self._stop.is_set():
            watch = self._watch_factory()
            for event in watch.stream(
                self._api.list_node, resource_version=version, timeout_seconds=self._watch_timeout_s
            ):
                if self._stop.is_set():
                    watch.stop()
                    return
                kind = event.get("type")
                obj = event.get("object")
                if kind == "ERROR":
                    raise RuntimeError(f"watch error event: {event.get('raw_object') or obj}")
                if kind == "BOOKMARK":
                    continue
                self.apply(str(kind), obj)
                new_version = getattr(getattr(obj, "metadata", None), "resource_version", None)
                version = new_version or version


def _default_watch() -> Any:
    from webhook.kube import node_watch  # imported lazily: only the Node source needs the client

    return node_watch()
