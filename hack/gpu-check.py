#!/usr/bin/env python3
"""The checks that need a real NVIDIA GPU, ready to run: `make gpu-check` (or .venv/bin/python hack/gpu-check.py).

One line per check, `PASS|FAIL|SKIP <check>: <figure or reason>`; exit 1 if any check FAILs. Needs the repo and
its virtualenv only (pynvml, pytest); the CUDA client (tests/gpu/cuda_client.py) talks to the driver through
ctypes. Root is needed for the MPS checks (compute mode) and the cgroup cap; without it those SKIP. On a machine
without an NVIDIA driver every check SKIPs with the reason. Bounded to well under 5 minutes (each step has a
timeout); it leaves the GPUs in the compute mode it found them in.

    nvml-backend          the real pynvml backend returns what the fake (device_plugin.testing.fake_nvml) returns,
                          call by call, in shape (attributes and types)
    gpu-tests             tests/gpu (pytest -m gpu) on this machine
    cuda-client           a plain CUDA client sees the card and allocates
    watchdog-attribution  the watchdog, reading real NVML, puts the client's process and memory in its slice
    mps-daemon            our MpsDaemon brings nvidia-cuda-mps-control up (EXCLUSIVE_PROCESS, defaults, probe)
    mps-client-limit      a client under our Allocate env (MPS) sees and cannot exceed its slice's memory
    mps-restart           the daemon quit behind our back is noticed and restarted
    mps-stop              quit, compute modes restored
    nvml-cgroup-cap       a client in a cgroup capped by nvmlDeviceSetMemoryLimits_v1 (driver r615+) stops at it
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from device_plugin.envs import EnvSettings, container_slice  # noqa: E402
from device_plugin.health import HealthBoard  # noqa: E402
from device_plugin.mps.control import MpsControl, MpsPaths  # noqa: E402
from device_plugin.mps.daemon import MpsDaemon, MpsDaemonSettings  # noqa: E402
from device_plugin.nvml import real  # noqa: E402
from device_plugin.nvml.backend import NvmlBackend  # noqa: E402
from device_plugin.nvml.discovery import discover  # noqa: E402
from device_plugin.pods import PodRecord  # noqa: E402
from device_plugin.testing.fake_nvml import FakeNvml  # noqa: E402
from device_plugin.testing.pods import MemoryPods  # noqa: E402
from device_plugin.watchdog.actions import Enforcer  # noqa: E402
from device_plugin.watchdog.cgroup import CgroupResolver  # noqa: E402
from device_plugin.watchdog.ladder import LadderConfig, parse_steps  # noqa: E402
from device_plugin.watchdog.sampling import NvmlSampler  # noqa: E402
from device_plugin.watchdog.watchdog import Watchdog  # noqa: E402
from vgpu import annotations as ann  # noqa: E402
from vgpu.devices import GpuDevice  # noqa: E402

CLIENT = ROOT / "tests" / "gpu" / "cuda_client.py"
MIB = 1 << 20
POD_UID = "0d5c4a8e-7a52-4c55-9a8e-3c1a2b4d5e6f"
CONTAINER_ID = "ab" * 32
NAMES = (
    "nvml-backend",
    "gpu-tests",
    "cuda-client",
    "watchdog-attribution",
    "mps-daemon",
    "mps-client-limit",
    "mps-restart",
    "mps-stop",
    "nvml-cgroup-cap",
)


class Report:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str]] = []

    def __call__(self, status: str, name: str, text: str) -> None:
        self.lines.append((status, name, text))
        print(f"{status} {name}: {text}", flush=True)

    def skip_rest(self, reason: str) -> None:
        done = {n for _, n, _ in self.lines}
        for name in NAMES:
            if name not in done:
                self("SKIP", name, reason)

    @property
    def failed(self) -> bool:
        return any(s == "FAIL" for s, _, _ in self.lines)


# --- shapes: what the real backend returns vs the fake ------------------------------------------------------


def shape(v: Any) -> Any:
    """Types and attribute names, recursively (values differ between the real card and the fake's)."""
    if isinstance(v, bool) or v is None:
        return type(v).__name__
    if isinstance(v, int):
        return "int"
    if isinstance(v, (str, bytes)):
        return "str"  # pynvml returns str since 11.5; the plugin decodes bytes too (discovery._norm_bus)
    if isinstance(v, (list, tuple)):
        return [shape(v[0])] if v else []
    return {a: shape(getattr(v, a)) for a in dir(v) if not a.startswith("_") and not callable(getattr(v, a))}


def compare(a: Any, b: Any) -> bool:
    """a (real) has at least b's (fake's) attributes with the same shapes; empty lists match any list."""
    if isinstance(b, dict):
        return isinstance(a, dict) and all(k in a and compare(a[k], v) for k, v in b.items())
    if isinstance(b, list):
        return isinstance(a, list) and (not a or not b or compare(a[0], b[0]))
    return bool(a == b)


CALLS: list[tuple[str, Callable[[NvmlBackend, object], Any]]] = [
    ("nvmlSystemGetDriverVersion", lambda n, h: n.nvmlSystemGetDriverVersion()),
    ("nvmlDeviceGetCount", lambda n, h: n.nvmlDeviceGetCount()),
    ("nvmlDeviceGetIndex", lambda n, h: n.nvmlDeviceGetIndex(h)),
    ("nvmlDeviceGetUUID", lambda n, h: n.nvmlDeviceGetUUID(h)),
    ("nvmlDeviceGetName", lambda n, h: n.nvmlDeviceGetName(h)),
    ("nvmlDeviceGetMemoryInfo", lambda n, h: n.nvmlDeviceGetMemoryInfo(h)),
    ("nvmlDeviceGetPciInfo", lambda n, h: n.nvmlDeviceGetPciInfo(h).busId),
    ("nvmlDeviceGetComputeRunningProcesses", lambda n, h: n.nvmlDeviceGetComputeRunningProcesses(h)),
    ("nvmlDeviceGetUtilizationRates", lambda n, h: n.nvmlDeviceGetUtilizationRates(h)),
    ("nvmlDeviceGetComputeMode", lambda n, h: n.nvmlDeviceGetComputeMode(h)),
]


def check_backend(report: Report, nvml: NvmlBackend, gpus: tuple[GpuDevice, ...], handles: dict[str, object]) -> None:
    g = gpus[0]
    fake = FakeNvml(
        {
            "driver": nvml.nvmlSystemGetDriverVersion(),
            "gpus": [{"model": x.model, "memoryMiB": x.memory_mib} for x in gpus],
            "processes": [{"gpu": 0, "pid": 4242, "timeline": [{"t": 0, "memoryMiB": 100, "sm": 5}]}],
        }
    )
    fake.nvmlInit()
    fh = fake.nvmlDeviceGetHandleByIndex(0)
    bad: list[str] = []
    for name, call in CALLS:
        try:
            r, f = shape(call(nvml, handles[g.uuid])), shape(call(fake, fh))
        except Exception as exc:
            bad.append(f"{name} raised {exc!r}")
            continue
        if not compare(r, f):
            bad.append(f"{name}: real {r} vs fake {f}")
    fake_gpus, _ = discover(fake, split_count=10, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
    if [(x.model, x.memory_mib, x.split_count) for x in fake_gpus] != [(x.model, x.memory_mib, 10) for x in gpus]:
        bad.append("discovery through the fake does not give the real GPUs' model/memory")
    text = f"{len(gpus)} GPU(s) {g.model} {g.memory_mib} MiB, driver {nvml.nvmlSystemGetDriverVersion()}"
    if bad:
        report("FAIL", "nvml-backend", f"{text}; " + "; ".join(bad))
    else:
        report("PASS", "nvml-backend", f"{text}; {len(CALLS)} calls return the fake's shapes")


def check_gpu_tests(report: Report) -> None:
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/gpu"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        report("FAIL", "gpu-tests", "tests/gpu took over 120 s")
        return
    summary = (p.stdout.strip().splitlines() or ["no output"])[-1]
    report("PASS" if p.returncode == 0 else "FAIL", "gpu-tests", f"tests/gpu: {summary}")


# --- the CUDA client ----------------------------------------------------------------------------------------


class Client:
    """tests/gpu/cuda_client.py in a subprocess; `result` is its JSON line."""

    def __init__(self, env: dict[str, str], alloc_mib: int, *, step_mib: int = 64, hold_s: float = 0.0) -> None:
        self.proc = subprocess.Popen(
            [
                *(sys.executable, str(CLIENT)),
                *("--alloc-mib", str(alloc_mib), "--step-mib", str(step_mib), "--hold-s", str(hold_s)),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        try:
            self.result: dict[str, Any] = json.loads(line)
        except ValueError:
            self.proc.wait(30)
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.result = {"ok": False, "error": f"no JSON from the client: {line!r} {err[-300:]!r}"}

    def wait(self) -> None:
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def client_env(uuid: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "CUDA_VISIBLE_DEVICES"))}
    env["CUDA_VISIBLE_DEVICES"] = uuid  # what NVIDIA_VISIBLE_DEVICES gives a container, on a bare host
    env.update(extra or {})
    return env


def check_plain_client_and_watchdog(
    report: Report, nvml: NvmlBackend, gpus: tuple[GpuDevice, ...], handles: dict[str, object], work: Path
) -> None:
    g = gpus[0]
    target = min(1024, g.memory_mib // 8)
    client = Client(client_env(g.uuid), target, hold_s=20)
    r = client.result
    try:
        if not r.get("ok") or r.get("allocated_mib") != target:
            report("FAIL", "cuda-client", f"{r}")
            report("SKIP", "watchdog-attribution", "the CUDA client did not run")
            return
        report(
            "PASS",
            "cuda-client",
            f"CUDA total {r['total_mib']} MiB (NVML {g.memory_mib} MiB), held {r['allocated_mib']} MiB",
        )
        check_watchdog(report, nvml, gpus, handles, work, int(r["pid"]), target)
    finally:
        client.proc.terminate()
        client.wait()


def check_watchdog(
    report: Report,
    nvml: NvmlBackend,
    gpus: tuple[GpuDevice, ...],
    handles: dict[str, object],
    work: Path,
    pid: int,
    held_mib: int,
) -> None:
    """The check runs outside a pod, so the client's /proc/<pid>/cgroup is given in a kubepods layout (systemd
    driver, containerd) under a private proc root; NVML's process list and memory are the real ones."""
    g = gpus[0]
    proc = work / "proc" / str(pid)
    proc.mkdir(parents=True)
    uid = POD_UID.replace("-", "_")
    (proc / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
        f"cri-containerd-{CONTAINER_ID}.scope\n"
    )
    pods = MemoryPods()
    assignment = ann.Assignment(
        node="gpu-check",
        containers=(ann.ContainerAssignment("main", (ann.DeviceSlice(g.uuid, g.index, held_mib * 2, 50),)),),
    )
    pods.add(
        PodRecord(
            namespace="gpu-check",
            name="client",
            uid=POD_UID,
            node="gpu-check",
            phase="Running",
            bind_phase=ann.BindPhase.ALLOCATED,
            assignment=assignment,
            container_ids=((CONTAINER_ID, "main"),),
        )
    )
    dog = Watchdog(
        node="gpu-check",
        gpus=gpus,
        sampler=NvmlSampler(nvml, handles),
        pods=pods,
        resolver=CgroupResolver(str(work / "proc")),
        enforcer=Enforcer(None, dry_run=True),
        ladder=LadderConfig(steps=parse_steps("event")),  # dry run: nothing is enforced
    )
    deadline = time.monotonic() + 15
    while True:
        snap = dog.cycle()
        mine = [s for s in snap.slices if s.slice.id.pod == "client" and s.slice.id.uuid == g.uuid]
        if (mine and mine[0].processes) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not mine or mine[0].processes != 1 or mine[0].memory_used < held_mib * MIB:
        seen = [(p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handles[g.uuid])]
        report("FAIL", "watchdog-attribution", f"slice {mine[0] if mine else None}; NVML processes {seen}")
        return
    report(
        "PASS",
        "watchdog-attribution",
        f"pid {pid} -> gpu-check/client[main] on GPU {g.index}: {mine[0].memory_used // MIB} MiB attributed "
        f"(client holds {held_mib} MiB + its context), 1 process",
    )


# --- MPS ---------------------------------------------------------------------------------------------------


def mps_binary() -> str | None:
    return shutil.which("nvidia-cuda-mps-control") or next(
        (
            p
            for p in ("/usr/bin/nvidia-cuda-mps-control", "/usr/local/bin/nvidia-cuda-mps-control")
            if os.path.exists(p)
        ),
        None,
    )


def check_mps(
    report: Report, nvml: NvmlBackend, gpus: tuple[GpuDevice, ...], handles: dict[str, object], work: Path
) -> None:
    binary = mps_binary()
    if os.geteuid() != 0:
        for n in ("mps-daemon", "mps-client-limit", "mps-restart", "mps-stop"):
            report("SKIP", n, "not root: the MPS daemon's compute mode needs root")
        return
    if binary is None:
        for n in ("mps-daemon", "mps-client-limit", "mps-restart", "mps-stop"):
            report("SKIP", n, "nvidia-cuda-mps-control not found (the driver's utilities are not installed)")
        return
    paths = MpsPaths(binary=binary, pipe_dir=str(work / "pipe"), log_dir=str(work / "log"), shm_dir=str(work / "shm"))
    board = HealthBoard(g.uuid for g in gpus)
    before = {u: nvml.nvmlDeviceGetComputeMode(h) for u, h in handles.items()}
    daemon = MpsDaemon(MpsControl(paths), nvml, handles, board, MpsDaemonSettings(probe_interval_s=1))
    t0 = time.monotonic()
    try:
        while not daemon.status().up and time.monotonic() - t0 < 30:
            wait = daemon.step()
            if not daemon.status().up:
                time.sleep(min(wait, 2))
        s = daemon.status()
        if not s.up:
            report("FAIL", "mps-daemon", f"not up after 30 s: {s.reason}")
            for n in ("mps-client-limit", "mps-restart"):
                report("SKIP", n, "the MPS daemon is not up")
            return
        modes = {nvml.nvmlDeviceGetComputeMode(h) for h in handles.values()}
        report(
            "PASS",
            "mps-daemon",
            f"up in {time.monotonic() - t0:.1f} s, compute mode {sorted(modes)} (3 = EXCLUSIVE_PROCESS) on "
            f"{len(handles)} GPU(s), board healthy: {all(h.healthy for h in board.snapshot()[1].values())}",
        )
        check_mps_client(report, gpus[0], paths)
        t1 = time.monotonic()
        daemon.control.send("quit")  # as if it died: the watcher must notice and bring it back
        while daemon.status().starts < 2 and time.monotonic() - t1 < 30:
            time.sleep(min(daemon.step(), 1))
        s = daemon.status()
        if s.up and s.restarts == 1:
            report(
                "PASS", "mps-restart", f"lost and restarted in {time.monotonic() - t1:.1f} s (failures {s.failures})"
            )
        else:
            report("FAIL", "mps-restart", f"status after 30 s: {s}")
    finally:
        daemon.stop()
        after = {u: nvml.nvmlDeviceGetComputeMode(h) for u, h in handles.items()}
        quit_ok = (
            subprocess.run(
                [binary],
                input="get_server_list\n",
                env=paths.env(os.environ),
                capture_output=True,
                text=True,
                check=False,
            ).returncode
            != 0
        )
        if after == before and quit_ok:
            report("PASS", "mps-stop", f"daemon quit, compute modes back to {sorted(set(after.values()))}")
        else:
            report("FAIL", "mps-stop", f"compute modes {after} (were {before}); daemon gone: {quit_ok}")


def check_mps_client(report: Report, g: GpuDevice, paths: MpsPaths) -> None:
    limit = min(4096, g.memory_mib // 4)
    c = ann.ContainerAssignment("main", (ann.DeviceSlice(g.uuid, g.index, limit, 50),))
    envs = container_slice(
        c,
        namespace="gpu-check",
        pod="client",
        pod_uid=POD_UID,
        index=0,
        settings=EnvSettings(mps=True, mps_pipe_dir=paths.pipe_dir, mps_log_dir=paths.log_dir),
    ).envs
    mps_env = {k: v for k, v in envs.items() if k.startswith("CUDA_MPS_")}
    client = Client(client_env(g.uuid, mps_env), limit * 2, step_mib=128)
    client.wait()
    r = client.result
    figure = (
        f"limit {limit} MiB ({mps_env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}): CUDA reports total "
        f"{r.get('total_mib')} MiB, held {r.get('allocated_mib')} MiB of a {limit * 2} MiB try, stopped by "
        f"{r.get('stopped_by')}"
    )
    ok = (
        r.get("ok")
        and r.get("allocated_mib", limit + 1) <= limit
        and r.get("stopped_by") == "CUDA_ERROR_OUT_OF_MEMORY"
        and r.get("total_mib", limit + 1) <= limit * 1.01
    )
    report("PASS" if ok else "FAIL", "mps-client-limit", figure if r.get("ok") else f"{r}")


# --- NVML cgroup cap (driver r615+) -------------------------------------------------------------------------


def check_cgroup_cap(report: Report, nvml: NvmlBackend, g: GpuDevice, handle: object) -> None:
    name = "nvml-cgroup-cap"
    driver = nvml.nvmlSystemGetDriverVersion()
    if int(driver.split(".")[0]) < 615:
        report("SKIP", name, f"driver {driver} < r615: no nvmlDeviceSetMemoryLimits_v1")
        return
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        report("SKIP", name, "needs root and cgroup v2 at /sys/fs/cgroup")
        return
    limit = min(2048, g.memory_mib // 8)
    cg = Path(f"/sys/fs/cgroup/kube-vgpu-gpu-check-{os.getpid()}")
    try:
        cg.mkdir()
    except OSError as exc:
        report("SKIP", name, f"cannot create a cgroup: {exc}")
        return
    try:
        try:
            nvml.nvmlDeviceSetMemoryLimits_v1(handle, real.memory_limits(str(cg), limit * MIB, limit * MIB))
        except Exception as exc:
            report("SKIP", name, f"nvmlDeviceSetMemoryLimits_v1 refused: {exc!r}")
            return
        env = client_env(g.uuid)
        proc = subprocess.run(
            [
                *("sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$0" "$@"', sys.executable, str(CLIENT)),
                *("--alloc-mib", str(limit * 2), "--step-mib", "128"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        try:
            r = json.loads(proc.stdout.splitlines()[0])
        except (IndexError, ValueError):
            report("FAIL", name, f"client gave no JSON: {proc.stdout[-200:]!r} {proc.stderr[-200:]!r}")
            return
        ok = r.get("ok") and r.get("allocated_mib", limit + 1) <= limit
        report(
            "PASS" if ok else "FAIL",
            name,
            f"cap {limit} MiB on {cg.name}: CUDA reports total {r.get('total_mib')} MiB, held "
            f"{r.get('allocated_mib')} MiB of a {limit * 2} MiB try, stopped by {r.get('stopped_by')}",
        )
    finally:
        with contextlib.suppress(OSError):  # the client has exited; a cgroup with a process left stays
            cg.rmdir()


def main() -> int:
    report = Report()
    started = time.monotonic()
    nvml = real.load()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        report.skip_rest(f"no NVIDIA driver here ({type(exc).__name__}: {exc})")
        return 0
    try:
        gpus, handles = discover(nvml, split_count=10, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
        if not gpus:
            report.skip_rest("the NVIDIA driver reports no GPU")
            return 0
        check_backend(report, nvml, gpus, handles)
        check_gpu_tests(report)
        with tempfile.TemporaryDirectory(prefix="vgpu-gpu-check-") as tmp:
            work = Path(tmp)
            check_plain_client_and_watchdog(report, nvml, gpus, handles, work)
            check_mps(report, nvml, gpus, handles, work)
        check_cgroup_cap(report, nvml, gpus[0], handles[gpus[0].uuid])
    except Exception as exc:  # a check that crashed is a failure with its reason, and the rest still report
        report("FAIL", "gpu-check", f"crashed: {exc!r}")
        report.skip_rest("the check crashed before this step")
    finally:
        nvml.nvmlShutdown()
    print(f"gpu-check: {len(report.lines)} checks in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
