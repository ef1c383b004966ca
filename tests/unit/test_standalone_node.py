"""The standalone node: the endpoints file (checks naming endpoint and field), attribution by PID, cgroup and
GPU through the real watchdog on a fake NVML, the feed per endpoint and this host's discovery file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from device_plugin.nvml import real
from device_plugin.standalone import config as cfg
from device_plugin.standalone.endpoints import EndpointsError, cgroup_of, parse
from device_plugin.standalone.node import build
from device_plugin.telemetry.epp import epp_registry
from device_plugin.testing.fake_nvml import FakeNvml
from vgpu.devices import GpuDevice

from .test_telemetry_exporter import extractor_gpu_utilization

GPUS = [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": 2}]


def _gpus() -> tuple[GpuDevice, ...]:
    from device_plugin.nvml.discovery import discover

    nvml = FakeNvml({"gpus": GPUS})
    devices, _ = discover(nvml, split_count=1, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
    return devices


def _ep(**kw: Any) -> dict[str, Any]:
    return {"name": "e", "address": "10.0.0.2", "port": 8000, "gpus": [0], **kw}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_ep(gpus=[5]), "endpoint 'e'.gpus: no GPU 5 on this host; it has 0 (GPU-"),
        (_ep(address="node-1"), "endpoint 'e'.address: 'node-1' is not an IP address"),
        (_ep(role="leader"), "endpoint 'e'.role: 'leader' is not a role; one of prefill, decode"),
        (_ep(cores=120), "endpoint 'e'.cores: must be an integer 0..100, got 120"),
        (_ep(pids=[1], cgroup="/a"), "endpoint 'e': give pids or cgroup, not both"),
        (_ep(cgroup="system.slice"), "endpoint 'e'.cgroup: an absolute cgroup path"),
        (_ep(memoryMiB=10**6), "endpoint 'e'.memoryMiB: must be an integer 1..81559"),
        (_ep(gpu=[0]), "endpoints[0]: unknown field 'gpu'"),
    ],
)
def test_a_wrong_endpoint_is_named_with_its_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(EndpointsError) as err:
        parse({"endpoints": [entry]}, _gpus())
    assert message in str(err.value)


def test_two_by_gpu_endpoints_on_one_gpu_must_say_how_to_tell_them_apart() -> None:
    with pytest.raises(EndpointsError, match="both take GPU 0 by GPU; give them pids or cgroup"):
        parse({"endpoints": [_ep(name="a"), _ep(name="b")]}, _gpus())
    eps = parse({"endpoints": [_ep(name="a"), _ep(name="b", pids=[7])]}, _gpus())
    assert [e.attribution for e in eps] == ["gpu", "pid"]


def test_cgroup_of_reads_v2_and_v1() -> None:
    assert cgroup_of("0::/system.slice/vllm.service\n") == "/system.slice/vllm.service"
    assert cgroup_of("12:memory:/slurm/uid_1/job_7\n11:cpu:/slurm/uid_1/job_7\n") == "/slurm/uid_1/job_7"


SCENARIO: dict[str, Any] = {
    "gpus": GPUS,
    "processes": [
        {"gpu": 0, "pid": 101, "timeline": [{"t": 0, "memoryMiB": 1000, "sm": 20}]},  # by pid: a-pid
        {"gpu": 0, "pid": 102, "timeline": [{"t": 0, "memoryMiB": 1000, "sm": 45}]},  # by cgroup: a-job
        {"gpu": 1, "pid": 103, "timeline": [{"t": 0, "memoryMiB": 1000, "sm": 60}]},  # by GPU: a-gpu1
        {"gpu": 0, "pid": 104, "timeline": [{"t": 0, "memoryMiB": 500, "sm": 5}]},  # nobody's: GPU 0 has no by-GPU
    ],
}
ENDPOINTS: dict[str, Any] = {
    "endpoints": [
        {"name": "a-pid", "address": "10.0.0.2", "port": 8000, "gpus": [0], "cores": 40, "pids": [101]},
        {
            "name": "a-job",
            "address": "10.0.0.2",
            "port": 8001,
            "gpus": [0],
            "cores": 50,
            "cgroup": "/slurm/uid_1000/job_42",
            "role": "prefill",
            "model": "llama",
        },
        {"name": "a-gpu1", "address": "10.0.0.2", "port": 8002, "gpus": [1], "cores": 100, "role": "decode"},
        {"name": "a-idle", "address": "10.0.0.2", "port": 8003, "gpus": [0], "cores": 10, "pids": [999]},
    ]
}


def _write(tmp_path: Path) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    for pid, cg in ((101, "/user.slice"), (102, "/slurm/uid_1000/job_42/step_0/task_0"), (103, "/"), (104, "/x")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{cg}\n")
    eps = tmp_path / "endpoints.yaml"
    eps.write_text(yaml.safe_dump(ENDPOINTS))
    return proc, eps


def test_each_endpoint_gets_its_own_value_and_the_discovery_file_lists_them(tmp_path: Path) -> None:
    proc, eps = _write(tmp_path)
    disc = tmp_path / "shared" / "host-a.yaml"
    nvml = FakeNvml(SCENARIO)
    node = build(
        nvml=nvml,
        endpoints=str(eps),
        node="host-a",
        is_nvml_error=real.NVMLError,
        proc_root=str(proc),
        discovery_file=str(disc),
    )
    snap = node.watchdog.cycle()
    text = generate_latest(epp_registry(node.watchdog.snapshot)).decode()
    assert extractor_gpu_utilization(text, "a-pid") == pytest.approx(0.50)  # 20 / 40
    assert extractor_gpu_utilization(text, "a-job") == pytest.approx(0.90)  # 45 / 50
    assert extractor_gpu_utilization(text, "a-gpu1") == pytest.approx(0.60)  # 60 / 100
    assert extractor_gpu_utilization(text, "a-idle") == 0.0
    assert snap.gpus[0].unattributed_memory == 500 * 2**20  # pid 104: nobody's
    doc = json.loads(disc.read_text())
    by_name = {e["name"]: e for e in doc["endpoints"]}
    assert sorted(by_name) == ["a-gpu1", "a-idle", "a-job", "a-pid"]
    assert by_name["a-job"]["port"] == "8001" and by_name["a-job"]["address"] == "10.0.0.2"
    assert by_name["a-job"]["labels"]["llm-d.ai/role"] == "prefill"
    assert by_name["a-job"]["labels"]["llm-d.ai/model"] == "llama"
    assert by_name["a-gpu1"]["labels"]["vgpu.io/gpu"] == snap.gpus[1].device.uuid


def test_an_edited_file_is_picked_up_and_a_bad_edit_keeps_the_last_good_one(tmp_path: Path) -> None:
    proc, eps = _write(tmp_path)
    node = build(
        nvml=FakeNvml(SCENARIO), endpoints=str(eps), node="h", is_nvml_error=real.NVMLError, proc_root=str(proc)
    )
    node.watchdog.pods_refresh_s = 0.0
    node.watchdog.cycle()
    eps.write_text(yaml.safe_dump({"endpoints": ENDPOINTS["endpoints"][:2]}) + "\n")
    node.watchdog.cycle()
    assert {s.id.pod for s in node.watchdog.snapshot().held} == {"a-pid", "a-job"}
    eps.write_text("endpoints:\n- {name: broken}\n")
    node.watchdog.cycle()
    assert {s.id.pod for s in node.watchdog.snapshot().held} == {"a-pid", "a-job"}


def test_settings_require_the_endpoints_file() -> None:
    with pytest.raises(ValueError, match="endpoints is required"):
        cfg.load([], {})
    assert cfg.load(["--endpoints", "/etc/vgpu/endpoints.yaml", "--host", "127.0.0.2"], {}).host == "127.0.0.2"


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "standalone"


def test_shipped_examples_load() -> None:
    from device_plugin.nvml.discovery import discover
    from vgpu_cli.main import build_parser

    nvml = FakeNvml.from_file(Path(__file__).resolve().parents[1] / "data" / "nvml" / "h100x8.yaml")
    gpus, _ = discover(nvml, split_count=1, is_nvml_error=lambda e: isinstance(e, real.NVMLError))
    eps = parse(yaml.safe_load((DEPLOY / "endpoints.example.yaml").read_text()), gpus)
    assert [e.attribution for e in eps] == ["gpu", "cgroup", "cgroup", "pid"]
    conf = cfg.SCHEMA.build(cfg.SCHEMA.from_yaml((DEPLOY / "standalone.example.yaml").read_text(), "example"))
    assert conf.endpoints == "/etc/vgpu/endpoints.yaml" and conf.epp_port == 9402
    assert cfg.problems(conf) == []
    for unit, parser in (
        ("vgpu-standalone-node.service", cfg.SCHEMA.parser()),
        ("vgpu-discovery-merge.service", build_parser()),
    ):
        exec_start = next(line for line in (DEPLOY / unit).read_text().splitlines() if line.startswith("ExecStart="))
        parser.parse_args(exec_start.split()[1:])  # every flag exists (argparse exits on an unknown one)
