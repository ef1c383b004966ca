"""The real pynvml backend on a real GPU: the same assertions as the fake-NVML unit tests. Skipped without
a GPU; run with `python -m pytest tests/gpu -m gpu -q` on a GPU machine."""

from __future__ import annotations

import contextlib

import pynvml
import pytest

from device_plugin.health import HealthBoard, HealthMonitor
from device_plugin.nvml import real
from device_plugin.nvml.discovery import discover
from device_plugin.replicas import MAX_ID_LEN, replica_ids


def _has_gpu() -> bool:
    try:
        pynvml.nvmlInit()
        n = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return n > 0
    except pynvml.NVMLError:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU/driver here")]


def is_err(e: BaseException) -> bool:
    return isinstance(e, real.NVMLError)


def test_discovery_reports_real_devices() -> None:
    gpus, handles = discover(real.load(), split_count=10, is_nvml_error=is_err)
    assert gpus and len(handles) == len(gpus)
    for g in gpus:
        assert g.uuid.startswith(("GPU-", "MIG-")) and g.memory_mib > 1000 and g.healthy
        assert all(len(i) <= MAX_ID_LEN for i in replica_ids(g.uuid, 10))


def test_backend_calls_return_the_protocol_shapes() -> None:
    nvml = real.load()
    gpus, handles = discover(nvml, split_count=10, is_nvml_error=is_err)
    h = handles[gpus[0].uuid]
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total >= mem.used >= 0
    assert isinstance(nvml.nvmlSystemGetDriverVersion(), str)
    for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
        assert p.pid > 0
    with contextlib.suppress(pynvml.NVMLError_NotFound):  # no samples: the same class the fake raises
        nvml.nvmlDeviceGetProcessUtilization(h, 0)
    util = nvml.nvmlDeviceGetUtilizationRates(h)
    assert 0 <= util.gpu <= 100


def test_health_monitor_runs_against_real_events() -> None:
    nvml = real.load()
    gpus, handles = discover(nvml, split_count=10, is_nvml_error=is_err)
    board = HealthBoard(handles)
    m = HealthMonitor(nvml, board, handles, probe_interval_s=0)
    m.register()
    for _ in range(2):
        m.step(timeout_ms=200)  # nvmlEventSetWait times out (no XID) and is swallowed
    assert all(board.get(g.uuid).healthy for g in gpus)
