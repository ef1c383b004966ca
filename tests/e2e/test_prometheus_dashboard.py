"""A real Prometheus (hack/build-prometheus.sh, built before the tests start) scrapes our exporters on a fake-NVML node: the node exporter,
the EPP feed and the extender's allocation view. Every query of the Grafana dashboard must return data.

No Kubernetes control plane is needed: the node runs on device_plugin.testing.node_sim and the extender's
metrics are served from a ClusterState holding the same node and assignments.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from device_plugin.telemetry.epp import epp_registry
from device_plugin.telemetry.exporter import node_registry
from device_plugin.telemetry.serve import serve
from device_plugin.testing.node_sim import RecordingKube, build
from device_plugin.watchdog.actions import Enforcer
from device_plugin.watchdog.cgroup import CgroupResolver
from device_plugin.watchdog.hardlimit import HardLimiter
from device_plugin.watchdog.ladder import LadderConfig, Step
from device_plugin.watchdog.sampling import NvmlSampler
from device_plugin.watchdog.watchdog import Watchdog
from kube_vgpu_dev.processes import free_port
from scheduler_extender.metrics import ExtenderMetrics
from tests.unit.test_watchdog_cycle import SCENARIO

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "kube-vgpu-dashboard.json"
# Grafana variables -> values Prometheus understands (all nodes, a rate window a few scrapes long).
GRAFANA_VARS = {"$__rate_interval": "30s", "$Hostname": ".*", "${Hostname}": ".*"}


def dashboard_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target, rows included, plus the template variables' metrics."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        m = re.match(r"label_values\((\w+),\s*(\w+)\)", var.get("definition", ""))
        if m:
            out.append((f"variable {var['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def substitute(expr: str) -> str:
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr!r}"
    return expr


@pytest.fixture
def exporters(tmp_path: Path) -> Iterator[dict[str, int]]:
    scenario = {**SCENARIO, "driver": "615.71.09", "memoryLimits": "supported"}
    sim = build(scenario, tmp_path / "proc")
    wd = Watchdog(
        node=sim.node,
        gpus=sim.gpus,
        sampler=NvmlSampler(sim.nvml, sim.handles),
        pods=sim.pods,
        resolver=CgroupResolver(str(sim.proc_root)),
        enforcer=Enforcer(RecordingKube()),
        ladder=LadderConfig(steps=(Step.EVENT, Step.ANNOTATE, Step.EVICT), sm_window_s=3, escalate_after_s=2),
        limiter=HardLimiter(sim.nvml, sim.handles),
        clock=lambda: sim.nvml.now,
    )
    ext = ExtenderMetrics(sim.cluster_state())
    stop = threading.Event()

    def node_loop() -> None:  # accelerated time: 1 simulated second per 0.2 s
        while not stop.wait(0.2):
            wd.cycle()
            sim.nvml.advance(1.0)

    def extender_traffic() -> None:  # the extender's verbs as kube-scheduler would drive them
        while not stop.wait(0.2):
            ext.latency.labels("filter").observe(0.002)
            ext.latency.labels("prioritize").observe(0.001)
            ext.bound(0.004)
            ext.filter_failure("no-fit")

    threads = [threading.Thread(target=f, daemon=True) for f in (node_loop, extender_traffic)]
    wd.cycle()
    for t in threads:
        t.start()
    servers = [
        serve(node_registry(wd.snapshot), host="127.0.0.1", port=0),
        serve(epp_registry(wd.snapshot), host="127.0.0.1", port=0),
        serve(ext.registry, host="127.0.0.1", port=0),
    ]
    try:
        yield {"vgpu-node": servers[0].port, "vgpu-epp": servers[1].port, "vgpu-extender": servers[2].port}
    finally:
        stop.set()
        for t in threads:
            t.join()
        for s in servers:
            s.close()


@pytest.fixture
def prometheus(tmp_path: Path, exporters: dict[str, int], prometheus_bin: str) -> Iterator[str]:
    binary = prometheus_bin  # built before the tests started (tests/e2e/conftest.py), not in this test's timeout
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], "honor_labels": True}
            for job, port in exporters.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()  # a slow answer is not a wrong one
    assert r["status"] == "success", f"{expr}: {r}"
    return list(r["data"]["result"])


def test_every_dashboard_query_returns_data(prometheus: str) -> None:
    dash = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dash)
    assert len(queries) >= 30
    deadline = time.monotonic() + 90
    while True:  # targets up, and enough scrapes for rate/increase windows and the ladder to climb
        up = query(prometheus, "up")
        ready = len(up) == 3 and all(s["value"][1] == "1" for s in up)
        missing = [(title, e) for title, e in queries if not query(prometheus, substitute(e))] if ready else queries
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert missing == [], f"dashboard queries without data: {missing}"
    # the EPP feed seen through Prometheus: max per pod / 100 == the extractor's GPUUtilization
    sat = {
        r["metric"]["pod"]: float(r["value"][1])
        for r in query(prometheus, substitute(queries_by_title(dash, "Slice saturation seen by the endpoint picker")))
    }
    assert sat["sm-hog"] == 1.0 and sat["mem-hog"] == pytest.approx(20 / 30)


def queries_by_title(dash: dict[str, Any], title: str) -> str:
    return next(e for t, e in dashboard_queries(dash) if t == title)
