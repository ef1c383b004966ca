"""Hard per-container GPU memory caps with nvmlDeviceSetMemoryLimits_v1, where the platform has them.

Needs: driver r615+, cgroup v2, a non-MIG GPU, root (CAP_SYS_ADMIN). The cap is set on the container's
cgroup directory (the `nameSpace` of nvmlSetMemoryLimits_v1_t) the first time the watchdog sees one of its
processes, with soft = hard = the slice's memory. When any requirement is missing the limiter says why
(`reason`, exported as vgpu_node_hard_memory_limits_supported{reason}) and logs it once; the watchdog's
memory ladder stays the enforcement then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from device_plugin.nvml import real
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.watchdog.cgroup import ContainerRef, host_cgroup_dir
from device_plugin.watchdog.slices import Slice

log = logging.getLogger(__name__)

MIN_DRIVER = 615
_UNSUPPORTED = {real.error_code(n): n for n in ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION")}


class HardLimiter:
    def __init__(
        self,
        nvml: NvmlBackend,
        handles: Mapping[str, object],
        *,
        cgroup_root: str = "/sys/fs/cgroup",
        enabled: bool = True,
        make_limits: Callable[[str, int, int], object] = real.memory_limits,
    ) -> None:
        self.nvml = nvml
        self.handles = dict(handles)
        self.cgroup_root = cgroup_root
        self.make_limits = make_limits
        self.applied: dict[tuple[str, str], int] = {}  # (cgroup dir, GPU uuid) -> hard limit bytes
        self.supported = enabled
        self.reason = "" if enabled else "disabled"
        self.errors = 0
        if enabled:
            self._probe()

    def _probe(self) -> None:
        try:
            version = self.nvml.nvmlSystemGetDriverVersion()
            major = int(version.split(".")[0])
        except Exception as exc:
            self._unsupported(f"driver version unknown ({exc})")
            return
        if major < MIN_DRIVER:
            self._unsupported(f"driver {version} < r{MIN_DRIVER}")

    def _unsupported(self, reason: str) -> None:
        if self.supported:
            log.warning("hard GPU memory limits (nvmlDeviceSetMemoryLimits_v1) unavailable: %s", reason)
        self.supported = False
        self.reason = reason

    def apply(self, s: Slice, ref: ContainerRef) -> int | None:
        """Cap the container's cgroup on the slice's GPU once; returns the cap in force (bytes) or None."""
        if not self.supported:
            return None
        if ref.version != 2:
            self._unsupported("cgroup v1 (needs cgroup v2)")
            return None
        path = host_cgroup_dir(ref, self.cgroup_root)
        key = (path, s.id.uuid)
        if key in self.applied:
            return self.applied[key]
        handle = self.handles.get(s.id.uuid)
        if handle is None:
            return None
        try:
            self.nvml.nvmlDeviceSetMemoryLimits_v1(handle, self.make_limits(path, s.memory_limit, s.memory_limit))
        except Exception as exc:
            code = real.code_of(exc)
            if code in _UNSUPPORTED:
                self._unsupported(f"NVML {_UNSUPPORTED[code]}")
            else:
                self.errors += 1
                log.warning("cannot cap GPU memory of %s on %s: %s", path, s.id.uuid, exc)
            return None
        self.applied[key] = s.memory_limit
        log.info("capped GPU memory of %s on %s at %d bytes", path, s.id.uuid, s.memory_limit)
        return s.memory_limit

    def forget(self, live: set[tuple[str, str]]) -> None:
        """Drop records of containers that are gone (their cgroups are removed with them)."""
        for key in [k for k in self.applied if k not in live]:
            del self.applied[key]
