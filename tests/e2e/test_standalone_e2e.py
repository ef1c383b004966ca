"""Standalone hosts on loopback, as the llm-d router sees them without Kubernetes: two `vgpu-standalone-node`
processes (each its own fake-NVML host, its own 127.0.0.x address, its endpoints from a local file) write
their file-discovery files into a shared folder, `vgpu discovery merge` makes the router's one file, and
each endpoint of it is scraped the way the router's dcgm-data-source does in file-discovery mode
(`<endpoint address>:<feed port>/metrics`, no node address) and read the way dcgm-extractor does (samples
whose `pod` is the endpoint name, max, /100). Every endpoint must get its own value."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_telemetry_exporter import extractor_gpu_utilization

GPU = {"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559}

# host A: two GPUs; one endpoint owns GPU 0 by GPU, a second runs on GPU 1 as a Slurm job (cgroup)
# host B: one GPU shared by two endpoints told apart by PID
HOSTS: dict[str, dict[str, Any]] = {
    "a": {
        "address": "127.0.0.2",
        "gpus": 2,
        "processes": [(0, 4101, 30, "/system.slice/vllm-a.service"), (1, 4102, 18, "/slurm/uid_1000/job_7/step_0")],
        "endpoints": [
            {"name": "a-prefill", "port": 8000, "gpus": [0], "cores": 60, "role": "prefill", "model": "llama"},
            {
                "name": "a-decode",
                "port": 8001,
                "gpus": [1],
                "cores": 20,
                "role": "decode",
                "model": "llama",
                "cgroup": "/slurm/uid_1000/job_7",
            },
        ],
        "expect": {"a-prefill": 0.5, "a-decode": 0.9},
    },
    "b": {
        "address": "127.0.0.3",
        "gpus": 1,
        "processes": [(0, 5101, 10, "/"), (0, 5102, 35, "/")],
        "endpoints": [
            {"name": "b-0", "port": 8000, "gpus": [0], "cores": 40, "role": "decode", "pids": [5101]},
            {"name": "b-1", "port": 8001, "gpus": [0], "cores": 50, "role": "decode", "pids": [5102]},
        ],
        "expect": {"b-0": 0.25, "b-1": 0.7},
    },
}


def _free_on_both(addresses: list[str], preferred: int = 9402) -> int:
    """The router's default feed port when both loopback addresses have it free, else one that both have."""
    for port in [preferred, *range(19402, 19502)]:
        ok = True
        for addr in addresses:
            with socket.socket() as s:
                try:
                    s.bind((addr, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no port free on every loopback address")


def _host_files(tmp: Path, name: str, host: dict[str, Any]) -> tuple[Path, Path, Path]:
    scenario = {
        "gpus": [{**GPU, "count": host["gpus"]}],
        "processes": [
            {"gpu": g, "pid": pid, "timeline": [{"t": 0, "memoryMiB": 2000, "sm": sm}]}
            for g, pid, sm, _ in host["processes"]
        ],
    }
    base = tmp / name
    (base / "proc").mkdir(parents=True)
    for _, pid, _, cg in host["processes"]:
        (base / "proc" / str(pid)).mkdir()
        (base / "proc" / str(pid) / "cgroup").write_text(f"0::{cg}\n")
    (base / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    eps = [{**e, "address": host["address"]} for e in host["endpoints"]]
    (base / "endpoints.yaml").write_text(yaml.safe_dump({"endpoints": eps}))
    return base / "scenario.yaml", base / "endpoints.yaml", base / "proc"


@contextlib.contextmanager
def _hosts(tmp: Path, shared: Path, port: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, host in HOSTS.items():
            scenario, endpoints, proc_root = _host_files(tmp, name, host)
            cmd = [
                *(sys.executable, "-m", "device_plugin.standalone.main"),
                *("--endpoints", str(endpoints), "--fake-nvml", str(scenario), "--proc-root", str(proc_root)),
                *("--host", host["address"], "--epp-port", str(port), "--metrics-port", "0"),
                *("--node-name", f"host-{name}", "--discovery-file", str(shared / f"host-{name}.yaml")),
                *("--interval-s", "0.2", "--log-level", "warning"),
            ]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def _scrape(address: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=30) as r:  # slow is not wrong
        return str(r.read().decode())


def _wait(check: Any, what: str, procs: list[subprocess.Popen[bytes]], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                _out, err = p.communicate()
                pytest.fail(f"a host exited ({p.returncode}): {err.decode()[-2000:]}")
        try:
            result = check()
            if result:
                return result
        except (OSError, ValueError, KeyError, AssertionError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s (last: {last})")


def test_two_standalone_hosts_merged_file_and_a_value_per_endpoint(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    addresses = [h["address"] for h in HOSTS.values()]
    port = _free_on_both(addresses)
    merged = tmp_path / "router" / "endpoints.yaml"
    with _hosts(tmp_path, shared, port) as procs:
        _wait(lambda: all((shared / f"host-{n}.yaml").exists() for n in HOSTS), "both hosts' files", procs)
        merge = subprocess.run(
            [sys.executable, "-m", "vgpu_cli.main", "discovery", "merge", str(shared), "--out", str(merged)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert merge.returncode == 0, merge.stderr
        doc = json.loads(merged.read_text())
        entries = {e["name"]: e for e in doc["endpoints"]}
        expect = {k: v for h in HOSTS.values() for k, v in h["expect"].items()}
        assert sorted(entries) == sorted(expect)
        for name, e in entries.items():
            host = next(h for h in HOSTS.values() if name in h["expect"])
            assert e["address"] == host["address"] and isinstance(e["port"], str)
            assert e["labels"]["llm-d.ai/role"] in ("prefill", "decode")

        def values() -> dict[str, float | None]:
            # what the router does per endpoint in file-discovery mode: GET <address>:<port>/metrics, extract
            got = {n: extractor_gpu_utilization(_scrape(e["address"], port), n) for n, e in entries.items()}
            assert all(got[n] == pytest.approx(v) for n, v in expect.items()), got
            return got

        got = _wait(values, "every endpoint's value", procs)
        print(f"\nstandalone e2e: feed port {port}; per-endpoint GPUUtilization as the router reads it: {got}")
        assert len({round(v or 0, 6) for v in got.values()}) == len(got)  # each its own value
        # an endpoint is not visible at the other host's address: the router must scrape the right host
        assert extractor_gpu_utilization(_scrape("127.0.0.3", port), "a-prefill") is None
