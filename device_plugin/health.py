"""GPU health: one producer (HealthMonitor) publishing to a HealthBoard that ListAndWatch and the inventory
publisher consume. NVML errors are logged and turned into health states, never raised out of the loop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from device_plugin.nvml.backend import IGNORED_XIDS, NvmlBackend, nvmlEventTypeXidCriticalError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuHealth:
    healthy: bool
    reason: str = ""


class HealthBoard:
    """Versioned health per GPU uuid; consumers block in wait_change() instead of polling.

    Node conditions (set_condition) make every GPU read as unhealthy with their reason on top of the per-GPU
    state, e.g. the MPS control daemon being down: no MPS client on the node could run, whichever GPU.
    """

    def __init__(self, uuids: Iterable[str]) -> None:
        self._cond = threading.Condition()
        self._state = {u: GpuHealth(True) for u in uuids}
        self._conditions: dict[str, str] = {}
        self.version = 0

    def set_condition(self, name: str, reason: str | None) -> bool:
        """Raise (reason) or clear (None) the node condition `name`; returns whether anything changed."""
        with self._cond:
            if self._conditions.get(name) == reason:
                return False
            if reason is None:
                del self._conditions[name]
            else:
                self._conditions[name] = reason
            self.version += 1
            self._cond.notify_all()
            return True

    def _seen(self, health: GpuHealth) -> GpuHealth:
        if not self._conditions or not health.healthy:
            return health
        return GpuHealth(False, "; ".join(self._conditions[k] for k in sorted(self._conditions)))

    def set(self, uuid: str, health: GpuHealth) -> bool:
        with self._cond:
            if self._state.get(uuid) == health:
                return False
            self._state[uuid] = health
            self.version += 1
            self._cond.notify_all()
            return True

    def get(self, uuid: str) -> GpuHealth:
        with self._cond:
            return self._seen(self._state.get(uuid, GpuHealth(False, "unknown GPU")))

    def snapshot(self) -> tuple[int, dict[str, GpuHealth]]:
        with self._cond:
            return self.version, {u: self._seen(h) for u, h in self._state.items()}

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until version != seen or timeout; returns the current version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout=timeout)
            return self.version

    def poke(self) -> None:
        """Wake every waiter (shutdown)."""
        with self._cond:
            self.version += 1
            self._cond.notify_all()


class HealthMonitor:
    """Critical XIDs mark a GPU unhealthy; it recovers once probes succeed and no critical XID arrived for
    `recovery_s`. A probe failing (GPU lost, NVML gone) marks it unhealthy until a probe succeeds."""

    def __init__(
        self,
        nvml: NvmlBackend,
        board: HealthBoard,
        handles: dict[str, object],
        *,
        probe_interval_s: float = 5.0,
        recovery_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.board = board
        self.handles = handles
        self.probe_interval_s = probe_interval_s
        self.recovery_s = recovery_s
        self.clock = clock
        self._last_xid: dict[str, tuple[float, int]] = {}
        self._probe_failed: dict[str, str] = {}
        self._event_set: object | None = None
        self._next_probe = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        """Subscribe to XID events; a GPU that cannot register is still probed (logged, not fatal)."""
        try:
            self._event_set = self.nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("XID events unavailable, probing only: %s", exc)
            return
        for uuid, handle in self.handles.items():
            try:
                self.nvml.nvmlDeviceRegisterEvents(handle, nvmlEventTypeXidCriticalError, self._event_set)
            except Exception as exc:
                log.warning("GPU %s: XID events unavailable: %s", uuid, exc)

    def on_xid(self, uuid: str, xid: int) -> None:
        if xid in IGNORED_XIDS:
            log.info("GPU %s: XID %d ignored (application error)", uuid, xid)
            return
        log.warning("GPU %s: critical XID %d, marking unhealthy", uuid, xid)
        self._last_xid[uuid] = (self.clock(), xid)
        self._publish(uuid)

    def wait_events(self, timeout_ms: int) -> None:
        """One nvmlEventSetWait; Timeout and every other NVML error are swallowed."""
        if self._event_set is None:
            self._stop.wait(timeout_ms / 1000)
            return
        try:
            event = self.nvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except Exception as exc:
            if "Timeout" not in type(exc).__name__:
                log.debug("nvmlEventSetWait: %s", exc)
                self._stop.wait(min(timeout_ms / 1000, 1.0))
            return
        if event.eventType != nvmlEventTypeXidCriticalError:
            return
        try:
            uuid = self.nvml.nvmlDeviceGetUUID(event.device)
        except Exception as exc:
            log.warning("XID %d on an unidentifiable GPU (%s): marking every GPU unhealthy", event.eventData, exc)
            for u in self.handles:
                self.on_xid(u, int(event.eventData))
            return
        self.on_xid(uuid, int(event.eventData))

    def probe(self) -> None:
        for uuid, handle in self.handles.items():
            try:
                self.nvml.nvmlDeviceGetMemoryInfo(handle)
                self._probe_failed.pop(uuid, None)
            except Exception as exc:
                self._probe_failed[uuid] = f"NVML: {exc}"
            self._publish(uuid)

    def _publish(self, uuid: str) -> None:
        failed = self._probe_failed.get(uuid)
        xid = self._last_xid.get(uuid)
        if failed:
            health = GpuHealth(False, failed)
        elif xid and self.clock() - xid[0] < self.recovery_s:
            health = GpuHealth(False, f"XID {xid[1]}")
        else:
            self._last_xid.pop(uuid, None)
            health = GpuHealth(True)
        if self.board.set(uuid, health):
            log.warning("GPU %s health: %s", uuid, "Healthy" if health.healthy else f"Unhealthy ({health.reason})")

    def step(self, timeout_ms: int = 1000) -> None:
        """One iteration of the producer loop: wait for XIDs, then probe when due."""
        self.wait_events(timeout_ms)
        now = self.clock()
        if now >= self._next_probe:
            self.probe()
            self._next_probe = now + self.probe_interval_s

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # belt and braces: the producer must outlive any surprise
                log.exception("health loop error")
                self._stop.wait(1.0)

    def start(self) -> None:
        self.register()
        self._thread = threading.Thread(target=self.run, name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
