"""The GPU check (hack/gpu-check.py) where there is no GPU: every check SKIPs with its reason, and its pieces run
against the fakes — the fake NVML as the "real" backend, a fake libcuda for the ctypes CUDA client (built with
the system C compiler when there is one), the fake nvidia-cuda-mps-control for the MPS steps."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from device_plugin.nvml import real
from device_plugin.nvml.discovery import discover
from device_plugin.testing.fake_nvml import FakeNvml
from tests.mps_fake import cleanup, fake_paths

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "gpu" / "cuda_client.py"
SCENARIO = {
    "driver": "550.54.15",
    "gpus": [{"model": "NVIDIA L4", "memoryMiB": 23034, "count": 2}],
    "processes": [{"gpu": 0, "pid": 4242, "timeline": [{"t": 0, "memoryMiB": 1324, "sm": 20}]}],
}


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "hack" / "gpu-check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_check = _load()


def _has_driver() -> bool:
    try:
        real.load().nvmlInit()
    except Exception:
        return False
    return True


class Lines:
    def __init__(self) -> None:
        self.report = gpu_check.Report()

    def of(self, name: str) -> tuple[str, str]:
        [(status, text)] = [(s, t) for s, n, t in self.report.lines if n == name]
        return status, text


def fake_nvml() -> tuple[FakeNvml, Any, Any]:
    nvml = FakeNvml(SCENARIO)
    gpus, handles = discover(nvml, split_count=10, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
    return nvml, gpus, handles


@pytest.mark.skipif(_has_driver(), reason="an NVIDIA driver is here: the script runs the real checks")
def test_without_a_driver_every_check_skips_with_the_reason() -> None:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gpu-check.py")], capture_output=True, text=True, timeout=120, check=False
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"SKIP {n}" for n in gpu_check.NAMES]
    assert all("no NVIDIA driver here (NVMLError_LibraryNotFound" in line for line in lines)
    assert time.monotonic() - t0 < 60


def test_backend_shapes_pass_for_the_same_shapes_and_name_the_call_that_differs() -> None:
    nvml, gpus, handles = fake_nvml()
    nvml.nvmlInit()
    lines = Lines()
    gpu_check.check_backend(lines.report, nvml, gpus, handles)
    status, text = lines.of("nvml-backend")
    assert status == "PASS" and "2 GPU(s) NVIDIA L4 23034 MiB, driver 550.54.15" in text

    class NoUsed(FakeNvml):  # a backend whose memory info lacks a field the plugin reads
        def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
            m = super().nvmlDeviceGetMemoryInfo(handle)
            return type("Mem", (), {"total": m.total, "free": m.free})()

    broken = NoUsed(SCENARIO)
    broken.nvmlInit()
    lines = Lines()
    gpu_check.check_backend(lines.report, broken, gpus, handles)
    status, text = lines.of("nvml-backend")
    assert status == "FAIL" and "nvmlDeviceGetMemoryInfo: real" in text and "'used'" in text


def test_watchdog_attribution_puts_the_process_in_its_slice(tmp_path: Path) -> None:
    nvml, gpus, handles = fake_nvml()
    lines = Lines()
    gpu_check.check_watchdog(lines.report, nvml, gpus, handles, tmp_path, 4242, 1024)
    status, text = lines.of("watchdog-attribution")
    assert status == "PASS" and "pid 4242 -> gpu-check/client[main] on GPU 0: 1324 MiB attributed" in text
    lines = Lines()
    gpu_check.check_watchdog(lines.report, nvml, gpus, handles, tmp_path / "other", 999, 1024)  # not on the GPU
    assert lines.of("watchdog-attribution")[0] == "FAIL"


# --- the ctypes CUDA client ---------------------------------------------------------------------------------


def _client(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CLIENT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "err"),
    [
        (["--alloc-mib", "0"], "need 1 <= --step-mib <= --alloc-mib"),
        (["--alloc-mib", "64", "--step-mib", "128"], "need 1 <= --step-mib <= --alloc-mib"),
        (["--alloc-mib", "64", "--hold-s", "-1"], "--hold-s and --device must be >= 0"),
        ([], "--alloc-mib"),
    ],
)
def test_client_bad_arguments_exit_2_naming_them(args: list[str], err: str) -> None:
    p = _client(*args)
    assert p.returncode == 2 and err in p.stderr


def test_client_without_a_driver_says_so_in_its_json() -> None:
    p = _client("--alloc-mib", "64", "--lib", "/nonexistent/libcuda.so.1")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert not out["ok"] and out["error"].startswith("cannot load /nonexistent/libcuda.so.1")


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake libcuda")
    d = tmp_path_factory.mktemp("cuda")
    lib = d / "libcuda.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "tests" / "data" / "cuda" / "fake_libcuda.c")],
        check=True,
        timeout=60,
    )
    yield d


def test_client_allocates_up_to_its_target(fake_libcuda: Path) -> None:
    out = json.loads(
        _client("--alloc-mib", "512", "--step-mib", "64", "--lib", str(fake_libcuda / "libcuda.so.1")).stdout
    )
    assert out == {"ok": True, "pid": out["pid"], "total_mib": 1024, "free_mib": 1024, "allocated_mib": 512,
                   "stopped_by": "target"}  # fmt: skip


def test_client_under_an_mps_limit_sees_it_and_stops_at_it(fake_libcuda: Path) -> None:
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=256M"}
    p = _client("--alloc-mib", "512", "--step-mib", "64", "--lib", str(fake_libcuda / "libcuda.so.1"), env=env)
    out = json.loads(p.stdout)
    assert (out["total_mib"], out["allocated_mib"], out["stopped_by"]) == (256, 256, "CUDA_ERROR_OUT_OF_MEMORY")


def test_client_names_the_cuda_error_when_cuda_cannot_start(fake_libcuda: Path) -> None:
    env = {"FAKE_CUDA_NO_DEVICE": "1"}
    p = _client("--alloc-mib", "64", "--lib", str(fake_libcuda / "libcuda.so.1"), env=env)
    assert p.returncode == 1
    assert json.loads(p.stdout)["error"] == "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"


# --- the MPS steps against the fakes ------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="the MPS steps run as root only (as on a GPU machine)")
def test_mps_steps_pass_against_the_fakes(fake_libcuda: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole MPS sequence with our MpsDaemon, the fake control binary on PATH, the fake NVML, and a client
    whose libcuda (the fake) honours the CUDA_MPS_PINNED_DEVICE_MEM_LIMIT our Allocate env sets."""
    paths = fake_paths(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_libcuda))
    monkeypatch.setenv("FAKE_CUDA_TOTAL_MIB", "23034")  # the card's; the MPS limit is what must bind
    nvml, gpus, handles = fake_nvml()
    nvml.compute_modes[1] = 2
    lines = Lines()
    work = tmp_path / "work"
    work.mkdir()
    try:
        gpu_check.check_mps(lines.report, nvml, gpus, handles, work)
    finally:
        cleanup(fake_paths(work))  # the check's pipe folder is under work
        cleanup(paths)
    assert [n for _, n, _ in lines.report.lines] == ["mps-daemon", "mps-client-limit", "mps-restart", "mps-stop"]
    assert {s for s, _, _ in lines.report.lines} == {"PASS"}, lines.report.lines
    assert lines.of("mps-client-limit")[1] == (
        "limit 4096 MiB (0=4096M): CUDA reports total 4096 MiB, held 4096 MiB of a 8192 MiB try, stopped by "
        "CUDA_ERROR_OUT_OF_MEMORY"
    )
    assert lines.of("mps-restart")[1].startswith("lost and restarted in ")
    assert nvml.compute_modes == {0: 0, 1: 2}
