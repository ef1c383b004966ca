"""Publishes the node inventory annotation the extender schedules from: on every health change and on a timer."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from device_plugin.health import GpuHealth, HealthBoard
from device_plugin.pods import PodSource
from vgpu import annotations as ann
from vgpu.devices import GpuDevice
from vgpu.kubelet_topology import NodePolicy, with_policy

log = logging.getLogger(__name__)


def current_inventory(gpus: tuple[GpuDevice, ...], board: HealthBoard) -> tuple[GpuDevice, ...]:
    _, health = board.snapshot()
    return tuple(
        dataclasses.replace(g, healthy=g.healthy and health.get(g.uuid, GpuHealth(False)).healthy) for g in gpus
    )


class InventoryPublisher:
    def __init__(
        self,
        *,
        node: str,
        gpus: tuple[GpuDevice, ...],
        board: HealthBoard,
        pods: PodSource,
        refresh_s: float = 60.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        kubelet: NodePolicy | None = None,
    ) -> None:
        self.kubelet = kubelet  # the node's Topology Manager, stated for the extender (vgpu.kubelet_topology)
        self.node = node
        self.gpus = gpus
        self.board = board
        self.pods = pods
        self.refresh_s = refresh_s
        self.now = now
        self.last: str | None = None
        self.writes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self, *, force: bool = False) -> bool:
        """Write the annotation if it changed (or force); returns whether it wrote. Errors are logged."""
        value = with_policy(ann.encode_inventory(current_inventory(self.gpus, self.board)), self.kubelet)
        if value == self.last and not force:
            return False
        try:
            self.pods.patch_node_annotations(
                node=self.node,
                annotations={ann.NODE_INVENTORY: value, ann.NODE_INVENTORY_TIME: self.now().isoformat()},
            )
        except Exception as exc:
            log.warning("node %s: cannot publish inventory: %s", self.node, exc)
            self.last = None
            return False
        self.last = value
        self.writes += 1
        return True

    def run(self) -> None:
        seen = self.board.version
        elapsed = 0.0
        self.publish(force=True)
        while not self._stop.is_set():
            new = self.board.wait_change(seen, timeout=1.0)
            elapsed += 1.0 if new == seen else 0.0
            seen = new
            due = elapsed >= self.refresh_s
            if self.publish(force=due) or due:
                elapsed = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.board.poke()
        if self._thread is not None:
            self._thread.join(timeout=5)
