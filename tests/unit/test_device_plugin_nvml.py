"""The fake NVML mirrors pynvml (names, signatures, real exception classes); discovery and health on top."""

from __future__ import annotations

import inspect
from pathlib import Path

import pynvml
import pytest

from device_plugin.health import HealthBoard, HealthMonitor
from device_plugin.nvml import backend
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.nvml.discovery import DiscoveryError, discover
from device_plugin.testing.fake_nvml import FakeNvml

DATA = Path(__file__).parent.parent / "data" / "nvml"


def fake(name: str) -> FakeNvml:
    return FakeNvml.from_file(DATA / name)


def is_err(e: BaseException) -> bool:
    return isinstance(e, pynvml.NVMLError)


def protocol_methods() -> list[str]:
    return [n for n in dir(NvmlBackend) if n.startswith("nvml")]


@pytest.mark.parametrize("name", protocol_methods())
def test_protocol_and_fake_mirror_pynvml_signatures(name: str) -> None:
    real = [p for p in inspect.signature(getattr(pynvml, name)).parameters.values() if p.default is p.empty]
    ours = list(inspect.signature(getattr(NvmlBackend, name)).parameters)[1:]
    fakes = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]
    assert [p.name for p in real] == ours == fakes


def test_constants_match_pynvml() -> None:
    assert backend.NVML_NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS
    assert backend.nvmlEventTypeXidCriticalError == pynvml.nvmlEventTypeXidCriticalError
    assert backend.NVML_FEATURE_ENABLED == pynvml.NVML_FEATURE_ENABLED
    assert backend.NVML_COMPUTEMODE_DEFAULT == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert backend.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


@pytest.mark.parametrize(
    ("scenario", "count", "model", "mib", "numa", "peers"),
    [
        ("h100x8.yaml", 8, "NVIDIA H100 80GB HBM3", 81559, [0, 0, 0, 0, 1, 1, 1, 1], 7),
        ("mixed.yaml", 6, "NVIDIA A100-SXM4-40GB", 40960, [0, 0, 1, 1, 1, 1], 3),
    ],
)
def test_discovery(scenario: str, count: int, model: str, mib: int, numa: list[int], peers: int) -> None:
    gpus, handles = discover(fake(scenario), split_count=10, is_nvml_error=is_err)
    assert len(gpus) == count == len(handles)
    assert (gpus[0].model, gpus[0].memory_mib) == (model, mib)
    assert [g.numa for g in gpus] == numa
    assert len(gpus[0].nvlink_peers) == peers
    if scenario == "mixed.yaml":
        assert gpus[4].model == "NVIDIA L4" and gpus[4].memory_mib == 23034 and gpus[4].nvlink_peers == ()


def test_missing_library_raises_the_real_pynvml_class_and_discovery_error() -> None:
    f = fake("no_library.yaml")
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        f.nvmlInit()
    with pytest.raises(DiscoveryError):
        discover(f, split_count=10, is_nvml_error=is_err)


def test_timelines_and_process_utilization() -> None:
    f = fake("h100x8.yaml")
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in f.nvmlDeviceGetComputeRunningProcesses(h)] == [4242]
    f.advance(10)
    procs = {p.pid: p.usedGpuMemory for p in f.nvmlDeviceGetComputeRunningProcesses(h)}
    assert procs == {4242: 20480 * 2**20, 4243: 4096 * 2**20}
    assert {s.pid: s.smUtil for s in f.nvmlDeviceGetProcessUtilization(h, 0)} == {4242: 65, 4243: 10}
    f.advance(5)
    assert [p.pid for p in f.nvmlDeviceGetComputeRunningProcesses(h)] == [4242]
    with pytest.raises(pynvml.NVMLError_NotFound):
        f.nvmlDeviceGetProcessUtilization(f.nvmlDeviceGetHandleByIndex(5), 0)


def monitor(f: FakeNvml, recovery_s: float = 30.0) -> tuple[HealthMonitor, HealthBoard, list[str]]:
    gpus, handles = discover(f, split_count=10, is_nvml_error=is_err)
    board = HealthBoard(handles)
    m = HealthMonitor(f, board, handles, probe_interval_s=0, recovery_s=recovery_s, clock=lambda: f.now)
    m.register()
    return m, board, [g.uuid for g in gpus]


def test_critical_xid_marks_unhealthy_ignored_xid_does_not_and_recovery() -> None:
    f = fake("xid.yaml")
    m, board, uuids = monitor(f)
    f.advance(1)
    m.step(timeout_ms=1)  # XID 13 on GPU 1: application error
    assert board.get(uuids[1]).healthy
    f.advance(1)
    m.step(timeout_ms=1)
    assert not board.get(uuids[3]).healthy and "79" in board.get(uuids[3]).reason
    assert all(board.get(u).healthy for u in uuids[:3])
    f.advance(29)
    m.step(timeout_ms=1)
    assert not board.get(uuids[3]).healthy
    f.advance(2)
    m.step(timeout_ms=1)
    assert board.get(uuids[3]).healthy


@pytest.mark.parametrize("xid", sorted(backend.IGNORED_XIDS))
def test_every_application_xid_is_ignored(xid: int) -> None:
    f = fake("xid.yaml")
    m, board, uuids = monitor(f)
    f.inject_xid(0, xid)
    m.step(timeout_ms=1)
    assert board.get(uuids[0]).healthy


def test_lost_gpu_goes_unhealthy_and_back_without_raising() -> None:
    f = fake("gpu_lost.yaml")
    m, board, uuids = monitor(f)
    m.step(timeout_ms=1)
    assert board.get(uuids[1]).healthy
    f.advance(5)
    m.step(timeout_ms=1)
    assert not board.get(uuids[1]).healthy and board.get(uuids[0]).healthy
    assert "lost" in board.get(uuids[1]).reason.lower()
    f.advance(15)
    m.step(timeout_ms=1)
    assert board.get(uuids[1]).healthy


def test_nvml_errors_everywhere_never_escape_the_loop() -> None:
    f = fake("xid.yaml")
    m, board, uuids = monitor(f)
    f.inject_error("*", "UNKNOWN")
    for _ in range(3):
        m.step(timeout_ms=1)
    assert not any(board.get(u).healthy for u in uuids)
    f.clear_errors()
    m.step(timeout_ms=1)
    assert all(board.get(u).healthy for u in uuids)
