"""The MPS control daemon's lifecycle on this node: bring it up, watch it, restart it with backoff, quit it.

While it is not answering, the health board carries the node condition `mps`: every GPU reads unhealthy with
the reason, so ListAndWatch reports the replicas Unhealthy, the node inventory publishes the GPUs unhealthy (the
extender places nothing there) and Allocate refuses with that reason — an MPS client without a daemon would
either fail or, worse, run outside MPS with no limit at all.

Bring-up, as NVIDIA's device plugin does it (k8s-device-plugin cmd/mps-control-daemon/mps/daemon.go at commit
05d317d5): every GPU to EXCLUSIVE_PROCESS (here through NVML rather than nvidia-smi), the pipe and log folders
created, `nvidia-cuda-mps-control -d`, then the default limits sent. On stop: `quit`, and each GPU back to the
compute mode it had before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from device_plugin.health import HealthBoard
from device_plugin.mps.control import MpsControl, MpsError
from device_plugin.nvml.backend import NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, NvmlBackend

log = logging.getLogger(__name__)
CONDITION = "mps"


@dataclass(frozen=True, slots=True)
class MpsDaemonSettings:
    probe_interval_s: float = 5.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    # Sent after every start; 0 = not sent. Only clients that set no limit of their own get these: every
    # container we allocate brings CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
    default_active_thread_percentage: int = 0
    default_pinned_mem_limit_mib: int = 0


@dataclass(frozen=True, slots=True)
class MpsStatus:
    up: bool
    reason: str  # why it is down ("" while up)
    starts: int  # successful bring-ups
    failures: int  # failed bring-ups and lost daemons
    since: float  # clock time of the last change between up and down

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)


class MpsDaemon:
    """One per node. `step()` is one iteration of the watch loop (tests drive it directly)."""

    def __init__(
        self,
        control: MpsControl,
        nvml: NvmlBackend,
        handles: dict[str, object],
        board: HealthBoard,
        settings: MpsDaemonSettings = MpsDaemonSettings(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self.nvml = nvml
        self.handles = handles
        self.board = board
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._status = MpsStatus(False, "MPS control daemon not started yet", 0, 0, clock())
        self._backoff = settings.backoff_initial_s
        self._previous_modes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        board.set_condition(CONDITION, self._condition(self._status.reason))

    @staticmethod
    def _condition(reason: str) -> str:
        return f"MPS control daemon down ({reason}); MPS allocations on this node are refused until it is back"

    def status(self) -> MpsStatus:
        with self._lock:
            return self._status

    def _set(self, *, up: bool, reason: str = "", started: bool = False, failed: bool = False) -> None:
        with self._lock:
            old = self._status
            self._status = MpsStatus(
                up=up,
                reason=reason,
                starts=old.starts + (1 if started else 0),
                failures=old.failures + (1 if failed else 0),
                since=self.clock() if up != old.up else old.since,
            )
        self.board.set_condition(CONDITION, None if up else self._condition(reason))

    # --- bring-up ----------------------------------------------------------------------------------

    def _exclusive_process(self) -> None:
        for uuid, handle in self.handles.items():
            try:
                mode = self.nvml.nvmlDeviceGetComputeMode(handle)
                if mode != NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
                    self.nvml.nvmlDeviceSetComputeMode(handle, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
                    self._previous_modes.setdefault(uuid, mode)
            except Exception as exc:
                raise MpsError(
                    f"cannot set GPU {uuid} to compute mode EXCLUSIVE_PROCESS: {exc} (the plugin needs root and "
                    "the GPU's device node; no process may hold a context on it in another mode)"
                ) from None

    def _defaults(self) -> list[str]:
        s = self.settings
        out: list[str] = []
        if s.default_active_thread_percentage:
            out.append(f"set_default_active_thread_percentage {s.default_active_thread_percentage}")
        if s.default_pinned_mem_limit_mib:
            for handle in self.handles.values():
                index = self.nvml.nvmlDeviceGetIndex(handle)
                out.append(f"set_default_device_pinned_mem_limit {index} {s.default_pinned_mem_limit_mib}M")
        return out

    def bring_up(self) -> str:
        """Compute mode, folders, daemon, defaults, probe. Returns how (started / adopted); MpsError if not up."""
        self._exclusive_process()
        paths = self.control.paths
        for d in (paths.pipe_dir, paths.log_dir, paths.shm_dir):
            try:
                os.makedirs(d, mode=0o755, exist_ok=True)
            except OSError as exc:
                raise MpsError(f"cannot create {d}: {exc}") from None
        try:
            self.control.probe()
            how = "adopted the daemon already answering"
        except MpsError:
            self.control.start_daemon()
            how = "started"
        defaults = self._defaults()
        if defaults:
            self.control.send(*defaults)
        self.control.probe()
        return how

    # --- the watch loop ----------------------------------------------------------------------------

    def step(self) -> float:
        """Bring the daemon up if it is down, else probe it. Returns the seconds to wait before the next step."""
        status = self.status()
        if status.up:
            try:
                self.control.probe()
                return self.settings.probe_interval_s
            except MpsError as exc:
                log.error("MPS control daemon lost: %s; restarting it", exc)
                self._set(up=False, reason=f"stopped answering: {exc}", failed=True)
                return 0.0
        try:
            how = self.bring_up()
        except (MpsError, OSError) as exc:
            wait = self._backoff
            self._backoff = min(self._backoff * 2, self.settings.backoff_max_s)
            log.error("MPS control daemon not up: %s; next try in %.1f s", exc, wait)
            self._set(up=False, reason=str(exc), failed=True)
            return wait
        self._backoff = self.settings.backoff_initial_s
        self._set(up=True, started=True)
        log.info("MPS control daemon %s (pipe %s)", how, self.control.paths.pipe_dir)
        return self.settings.probe_interval_s

    def run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            try:
                delay = self.step()
            except Exception:  # the watcher must outlive any surprise; the board keeps the last state
                log.exception("MPS watch loop")
                delay = self.settings.probe_interval_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="mps-daemon", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching, `quit` the daemon, restore the GPUs' compute modes. Failures are logged."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.control.timeout_s + 5)
        try:
            self.control.send("quit")
            log.info("MPS control daemon quit")
        except MpsError as exc:
            log.warning("MPS quit: %s", exc)
        for uuid, mode in self._previous_modes.items():
            try:
                self.nvml.nvmlDeviceSetComputeMode(self.handles[uuid], mode)
            except Exception as exc:
                log.warning("GPU %s: cannot restore compute mode %d: %s", uuid, mode, exc)
        self._previous_modes.clear()
        self._set(up=False, reason="stopped")
