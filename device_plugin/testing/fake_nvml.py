"""A scenario-driven fake of the pynvml functions in NvmlBackend, raising the real pynvml.NVMLError_* classes.

Scenario (YAML or dict), times in seconds on the fake's clock. The clock is manual by default (`advance()`
moves it; tests never sleep); `FakeNvml(scenario, clock=time.monotonic)` (what `vgpu-device-plugin
--fake-nvml` uses) makes it follow wall time from construction, so a scenario's XIDs, process timelines and
injected errors play out on their own; `advance()` then skips ahead on top of wall time.

    driver: "550.54.15"
    library: present            # or "missing" -> nvmlInit raises NVMLError_LibraryNotFound
    gpus:                       # expanded in order; index = position
      - {model: "NVIDIA H100 80GB HBM3", memoryMiB: 81559, count: 8, numa: [0,0,0,0,1,1,1,1], nvlink: switch}
    processes:                  # per-process memory/SM timelines (last point at or before now wins)
      - {gpu: 0, pid: 4242, timeline: [{t: 0, memoryMiB: 1000, sm: 20}, {t: 10, memoryMiB: 4000, sm: 55}]}
    xids:                       # XID queue, delivered by nvmlEventSetWait once the clock reaches t
      - {t: 5, gpu: 3, xid: 79}
    memoryLimits: supported     # nvmlDeviceSetMemoryLimits_v1: "supported" (needs driver >= 615), default
                                # "unsupported" -> NVMLError_NotSupported; set limits land in .memory_limits
    computeModes: settable      # nvmlDeviceSetComputeMode: "settable" (default) or "denied" -> NO_PERMISSION;
                                # the mode per GPU is in .compute_modes (0 DEFAULT, 3 EXCLUSIVE_PROCESS)
    errors:                     # injected errors: function (optionally for one gpu) raises in [from, until)
      - {function: nvmlDeviceGetMemoryInfo, gpu: 2, error: GPU_IS_LOST, from: 5, until: 20}

`nvlink`: "switch" (every GPU of the group linked through NVSwitches), "mesh" (direct links between the
group's GPUs), "none", or a list of peer indexes per GPU.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from device_plugin.nvml import real
from device_plugin.nvml.backend import NVML_FEATURE_ENABLED, nvmlEventTypeXidCriticalError

MIB = 1024 * 1024


@dataclass(frozen=True)
class Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class Pci:
    busId: str


@dataclass(frozen=True)
class Process:
    pid: int
    usedGpuMemory: int | None


@dataclass(frozen=True)
class UtilSample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int


@dataclass(frozen=True)
class Util:
    gpu: int
    memory: int


@dataclass(frozen=True)
class Event:
    device: object
    eventType: int
    eventData: int


@dataclass(frozen=True)
class FakeHandle:
    index: int


@dataclass
class FakeGpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int | None
    bus_id: str
    links: list[str]  # remote bus ids per NVLink


@dataclass
class InjectedError:
    function: str
    gpu: int | None
    code: int
    start: float
    until: float | None


@dataclass
class _EventSet:
    handles: set[int] = field(default_factory=set)


def _uuid(model: str, index: int) -> str:
    """A stable, real-looking GPU UUID (GPU-8-4-4-4-12 hex) so scenario runs are reproducible."""
    h = hashlib.sha1(f"{model}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _switch_bus(i: int) -> str:
    return f"00000000:{0xA0 + i:02X}:00.0"


def _expand_gpus(raw: list[Mapping[str, Any]]) -> list[FakeGpu]:
    gpus: list[FakeGpu] = []
    groups: list[tuple[list[int], Any]] = []
    for spec in raw:
        count = int(spec.get("count", 1))
        numa = spec.get("numa")
        members: list[int] = []
        for k in range(count):
            idx = len(gpus)
            node = numa[k] if isinstance(numa, list) else numa
            uuid = str(spec["uuids"][k]) if "uuids" in spec else _uuid(str(spec["model"]), idx)
            gpus.append(
                FakeGpu(
                    idx, uuid, str(spec["model"]), int(spec["memoryMiB"]), node, f"00000000:{0x10 + idx:02X}:00.0", []
                )
            )
            members.append(idx)
        groups.append((members, spec.get("nvlink", "none")))
    for members, kind in groups:
        for pos, idx in enumerate(members):
            if kind == "switch":
                gpus[idx].links = [_switch_bus(s) for s in range(4)]
            elif kind == "mesh":
                gpus[idx].links = [gpus[p].bus_id for p in members if p != idx]
            elif isinstance(kind, list):
                gpus[idx].links = [gpus[int(p)].bus_id for p in kind[pos]]
    return gpus


class FakeNvml:
    """Implements NvmlBackend. Thread-safe; nvmlEventSetWait wakes on inject_xid() or advance()."""

    def __init__(self, scenario: Mapping[str, Any], *, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._origin = clock() if clock is not None else 0.0
        self._skipped = 0.0  # what advance() added
        self.driver = str(scenario.get("driver", "550.54.15"))
        self.library_present = scenario.get("library", "present") != "missing"
        self.gpus = _expand_gpus(list(scenario.get("gpus", [])))
        self.processes: list[Mapping[str, Any]] = list(scenario.get("processes", []))
        self.xids: list[tuple[float, int, int]] = sorted(
            (float(x.get("t", 0)), int(x["gpu"]), int(x["xid"])) for x in scenario.get("xids", [])
        )
        self.errors = [
            InjectedError(
                function=str(e["function"]),
                gpu=None if e.get("gpu") is None else int(e["gpu"]),
                code=real.error_code(str(e["error"])),
                start=float(e.get("from", 0)),
                until=None if e.get("until") is None else float(e["until"]),
            )
            for e in scenario.get("errors", [])
        ]
        self.memory_limits_supported = scenario.get("memoryLimits", "unsupported") == "supported"
        self.memory_limits: dict[tuple[int, str], tuple[int, int]] = {}  # (gpu, cgroup dir) -> (soft, hard)
        self.compute_modes_settable = scenario.get("computeModes", "settable") != "denied"
        self.compute_modes: dict[int, int] = {g.index: 0 for g in self.gpus}
        self.initialized = False
        self.calls: dict[str, int] = {}
        self._cond = threading.Condition()

    @classmethod
    def from_file(cls, path: str | Path, *, clock: Callable[[], float] | None = None) -> FakeNvml:
        return cls(yaml.safe_load(Path(path).read_text()), clock=clock)

    @property
    def now(self) -> float:
        """Seconds on the scenario's timeline: advance()d time, plus wall time since start with a clock."""
        wall = self._clock() - self._origin if self._clock is not None else 0.0
        return wall + self._skipped

    # --- scenario control -------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._skipped += seconds
            self._cond.notify_all()

    def inject_xid(self, gpu: int, xid: int) -> None:
        with self._cond:
            self.xids.append((self.now, gpu, xid))
            self.xids.sort()
            self._cond.notify_all()

    def inject_error(self, function: str, error: str, gpu: int | None = None, until: float | None = None) -> None:
        with self._cond:
            self.errors.append(InjectedError(function, gpu, real.error_code(error), self.now, until))

    def clear_errors(self) -> None:
        with self._cond:
            self.errors.clear()

    # --- helpers ---------------------------------------------------------------------------------

    def _enter(self, function: str, handle: object | None = None) -> FakeGpu | None:
        self.calls[function] = self.calls.get(function, 0) + 1
        gpu_index = handle.index if isinstance(handle, FakeHandle) else None
        for e in self.errors:
            active = e.start <= self.now and (e.until is None or self.now < e.until)
            if active and e.function in (function, "*") and (e.gpu is None or e.gpu == gpu_index):
                raise real.error(e.code)
        if function != "nvmlInit" and not self.initialized:
            raise real.error(real.error_code("UNINITIALIZED"))
        if handle is None:
            return None
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        return self.gpus[handle.index]

    def _gpu(self, function: str, handle: object) -> FakeGpu:
        gpu = self._enter(function, handle)
        assert gpu is not None
        return gpu

    def _process_points(self, gpu: int) -> list[tuple[int, int, int]]:
        """(pid, memory MiB, SM %) of each process alive on `gpu` at the current time."""
        out: list[tuple[int, int, int]] = []
        for p in self.processes:
            if int(p["gpu"]) != gpu:
                continue
            point = None
            for sample in p.get("timeline", []):
                if float(sample.get("t", 0)) <= self.now:
                    point = sample
            if point is not None and not point.get("exited", False):
                out.append((int(p["pid"]), int(point.get("memoryMiB", 0)), int(point.get("sm", 0))))
        return out

    # --- NvmlBackend -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if not self.library_present:
            raise real.error(real.error_code("LIBRARY_NOT_FOUND"))
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        handle = FakeHandle(index)
        self._gpu("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: object) -> str:
        return self._gpu("nvmlDeviceGetName", handle).model

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Memory:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        used = sum(m for _, m, _ in self._process_points(gpu.index)) * MIB
        total = gpu.memory_mib * MIB
        return Memory(total=total, free=max(total - used, 0), used=used)

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        gpu = self._gpu("nvmlDeviceGetNumaNodeId", handle)
        if gpu.numa is None:
            raise real.error(real.error_code("NOT_SUPPORTED"))
        return gpu.numa

    def nvmlDeviceGetPciInfo(self, handle: object) -> Pci:
        return Pci(self._gpu("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", device)
        if link >= len(gpu.links):
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        return NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: object, link: int) -> Pci:
        gpu = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", device)
        if link >= len(gpu.links):
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        return Pci(gpu.links[link])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Process]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [Process(pid, mem * MIB) for pid, mem, _ in self._process_points(gpu.index)]

    def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> list[UtilSample]:
        gpu = self._gpu("nvmlDeviceGetProcessUtilization", handle)
        stamp = int(self.now * 1_000_000) + 1  # microseconds; like NVML's, never 0 (0 = "everything")
        samples = [UtilSample(pid, stamp, sm, 0) for pid, _, sm in self._process_points(gpu.index)]
        samples = [s for s in samples if s.timeStamp > timeStamp]
        if not samples:
            raise real.error(real.error_code("NOT_FOUND"))
        return samples

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Util:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        sm = min(100, sum(s for _, _, s in self._process_points(gpu.index)))
        return Util(gpu=sm, memory=0)

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: object) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not isinstance(eventSet, _EventSet):
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        if eventTypes & nvmlEventTypeXidCriticalError:
            eventSet.handles.add(gpu.index)

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> Event:
        """Deliver the next due XID of a registered GPU; waits (really) at most timeoutms, then NVMLError_Timeout."""
        self._enter("nvmlEventSetWait")
        if not isinstance(eventSet, _EventSet):
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        with self._cond:
            due = self._pop_due(eventSet)
            if due is None:
                self._cond.wait(timeout=self._wait_s(eventSet, timeoutms / 1000))
                due = self._pop_due(eventSet)
        if due is None:
            raise real.error(real.NVML_ERROR_TIMEOUT)
        return due

    def _wait_s(self, event_set: _EventSet, timeout_s: float) -> float:
        """How long to wait for an XID: the whole timeout on the manual clock (advance() wakes the waiter);
        on wall time, only until the next XID of a registered GPU falls due."""
        if self._clock is None:
            return timeout_s
        due = [t for t, gpu, _ in self.xids if gpu in event_set.handles]
        return min([timeout_s, *(max(0.0, t - self.now) for t in due)])

    def _pop_due(self, event_set: _EventSet) -> Event | None:
        for i, (t, gpu, xid) in enumerate(self.xids):
            if t <= self.now and gpu in event_set.handles:
                del self.xids[i]
                return Event(device=FakeHandle(gpu), eventType=nvmlEventTypeXidCriticalError, eventData=xid)
        return None

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self._enter("nvmlEventSetFree")

    def nvmlDeviceSetMemoryLimits_v1(self, device: object, limits: object) -> None:
        """Like the r615+ driver: only with `memoryLimits: supported` and a driver >= 615, else NotSupported."""
        gpu = self._gpu("nvmlDeviceSetMemoryLimits_v1", device)
        if not self.memory_limits_supported or int(self.driver.split(".")[0]) < 615:
            raise real.error(real.error_code("NOT_SUPPORTED"))
        raw = getattr(limits, "nameSpace", b"")
        namespace = raw.decode() if isinstance(raw, bytes) else str(raw)
        if not namespace:
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        with self._cond:
            self.memory_limits[(gpu.index, namespace)] = (
                int(getattr(limits, "softLimit", 0)),
                int(getattr(limits, "hardLimit", 0)),
            )

    def nvmlDeviceGetComputeMode(self, handle: object) -> int:
        return self.compute_modes[self._gpu("nvmlDeviceGetComputeMode", handle).index]

    def nvmlDeviceSetComputeMode(self, handle: object, mode: int) -> None:
        """Like the driver run without root: NO_PERMISSION with `computeModes: denied`."""
        gpu = self._gpu("nvmlDeviceSetComputeMode", handle)
        if not self.compute_modes_settable:
            raise real.error(real.error_code("NO_PERMISSION"))
        if mode not in (0, 2, 3):  # DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS (1 was removed from NVML)
            raise real.error(real.error_code("INVALID_ARGUMENT"))
        with self._cond:
            self.compute_modes[gpu.index] = mode
