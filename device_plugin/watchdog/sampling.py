"""One NVML read per GPU per cycle: per-process memory and SM use, device memory and utilisation.

nvmlDeviceGetProcessUtilization returns the samples newer than the timestamp passed in; we keep the last
timestamp seen per GPU so each cycle sees only its own interval, and take each PID's latest sample. It
raises NotFound when there is no sample in that interval: every process then used 0 % SM.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from device_plugin.nvml import real
from device_plugin.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)

_NOT_FOUND = real.error_code("NOT_FOUND")


@dataclass(frozen=True, slots=True)
class ProcessUse:
    pid: int
    memory_bytes: int  # 0 when NVML cannot tell (usedGpuMemory None)
    sm: float  # percent of the GPU's SMs in the last interval


@dataclass(frozen=True, slots=True)
class GpuReading:
    uuid: str
    memory_total: int = 0
    memory_used: int = 0
    utilization: float = 0.0  # percent
    processes: tuple[ProcessUse, ...] = ()
    error: str = ""  # non-empty: this GPU could not be read this cycle


class NvmlSampler:
    """Reads every GPU through the NvmlBackend handed in (real pynvml or the scenario fake)."""

    def __init__(self, nvml: NvmlBackend, handles: Mapping[str, object]) -> None:
        self.nvml = nvml
        self.handles = dict(handles)
        self.last_seen: dict[str, int] = dict.fromkeys(self.handles, 0)

    def _sm(self, uuid: str, handle: object) -> dict[int, float]:
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, self.last_seen[uuid])
        except Exception as exc:
            if real.code_of(exc) == _NOT_FOUND:
                return {}
            raise
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            if s.pid not in latest or s.timeStamp >= latest[s.pid][0]:
                latest[s.pid] = (s.timeStamp, float(s.smUtil))
            self.last_seen[uuid] = max(self.last_seen[uuid], s.timeStamp)
        return {pid: sm for pid, (_, sm) in latest.items()}

    def read_gpu(self, uuid: str) -> GpuReading:
        handle = self.handles[uuid]
        try:
            mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            sm = self._sm(uuid, handle)
        except Exception as exc:  # NVML errors become a per-GPU error; health is the HealthMonitor's job
            if real.code_of(exc) is None:
                raise
            return GpuReading(uuid=uuid, error=f"{type(exc).__name__}: {exc}")
        return GpuReading(
            uuid=uuid,
            memory_total=int(mem.total),
            memory_used=int(mem.used),
            utilization=float(util.gpu),
            processes=tuple(ProcessUse(p.pid, int(p.usedGpuMemory or 0), sm.get(p.pid, 0.0)) for p in procs),
        )

    def read(self) -> list[GpuReading]:
        return [self.read_gpu(u) for u in self.handles]
