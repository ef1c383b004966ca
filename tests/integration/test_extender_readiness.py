"""Readiness means kube-scheduler's calls connect: the health port's /readyz waits for the verbs' port."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import yaml

from kube_vgpu_dev.processes import free_port
from scheduler_extender.app import create_health_app
from scheduler_extender.main import build_parser, build_service
from scheduler_extender.service import ExtenderService
from scheduler_extender.settings import SCHEMA, read_text

with warnings.catch_warnings():  # starlette 1.x nudges towards httpx2; httpx is what we ship (as the other tests)
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

CLUSTER = {
    "version": "v1",
    "nodes": [{"name": "n1", "gpuTemplate": {"count": 1, "model": "H100-80GB", "memoryMiB": 81920}}],
}


def _service(tmp_path: Path) -> ExtenderService:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    args = build_parser().parse_args(["--source", "file", "--cluster-file", str(cluster)])
    service, _source, _election = build_service(SCHEMA.load_args(args, {}, read_text))
    return service


def test_readyz_waits_for_the_verbs_port_after_the_state_is_synced(tmp_path: Path) -> None:
    service = _service(tmp_path)
    listening = threading.Event()
    client = TestClient(create_health_app(service, listening.is_set))
    assert service.ready.is_set()
    r = client.get("/readyz")
    assert r.status_code == 503 and "not listening" in r.text
    listening.set()
    assert client.get("/readyz").text == "ok"
    assert client.get("/healthz").text == "ok"  # liveness never waited on it


def test_an_extender_whose_verbs_port_is_taken_exits_non_zero_and_says_so(tmp_path: Path) -> None:
    """main runs uvicorn's Server itself (to read `started` for /readyz): a server that cannot bind must still end
    the process with uvicorn's startup-failure code, never 0, and the health thread must not keep it alive."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "scheduler_extender.main",
                "--address",
                "127.0.0.1",
                "--port",
                str(port),
                "--health-port",
                str(free_port()),
                "--source",
                "file",
                "--cluster-file",
                str(cluster),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=Path(__file__).resolve().parents[2],
        )
    assert proc.returncode == 3, proc.stderr
    assert "address already in use" in proc.stderr  # uvicorn's own line names the cause
