"""`vgpu validate --prometheus`: the five bundled scenarios replayed in real time as vLLM metric series (one
exporter per scenario, each its own namespace; tests/e2e/vllm_replay.py) scraped every second by the real
Prometheus CI builds; the live verdict read back through Prometheus's HTTP API names the same layer as the
offline simulation of the same requests."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.test_prometheus_dashboard import free_port
from tests.e2e.vllm_replay import Replay
from vgpu.perf.params import PerfParams
from vgpu.whatif import traces
from vgpu.whatif.scenarios import SCENARIOS
from vgpu.whatif.sim import simulate
from vgpu.whatif.verdict import diagnose
from vgpu.whatif.workload import generate
from vgpu_cli.main import main

PARAMS = PerfParams()
REPLAYED = {"few-decode": 60.0, "uneven-slices": 60.0, "healthy": 60.0, "round-robin-chat": 120.0, "cross-rack": 120.0}


def serve(replay: Replay, clock: dict[str, float]) -> ThreadingHTTPServer:
    """Serves `replay` at the time since clock["start"] (before it: nothing has happened yet)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = replay.text(time.time() - clock["start"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _scraped_since(url: str, job: str, when: float, timeout: float = 60.0) -> None:
    """Wait until Prometheus holds a scrape of `job` taken at or after `when` (unix time). A target's scrapes are
    stored in order, so every scrape of the window before it is in too; a fixed wait after the window (3 s, once)
    misses the last one when a loaded machine answers or stores a scrape late."""
    deadline = time.monotonic() + timeout
    latest = None
    while True:
        r = httpx.get(f"{url}/api/v1/query", params={"query": f'timestamp(up{{job="{job}"}})'}, timeout=30).json()
        stamps = [float(s["value"][1]) for s in r["data"]["result"]] if r.get("status") == "success" else []
        latest = max(stamps, default=None)
        if latest is not None and latest >= when:
            return
        assert time.monotonic() < deadline, f"no scrape of {job} at or after {when:.1f} within {timeout} s: {latest}"
        time.sleep(0.5)


@pytest.fixture
def replayed(tmp_path: Path, prometheus_bin: str) -> Iterator[tuple[str, float, dict[str, tuple[str, Path]]]]:
    """(Prometheus URL, replay start, scenario -> (offline layer, trace file))."""
    offline: dict[str, tuple[str, Path]] = {}
    replays: dict[str, Replay] = {}
    for name, duration in REPLAYED.items():
        s = SCENARIOS[name]
        reqs = generate(replace(s.workload, duration_s=duration), s.seed)
        _, verdict = diagnose(s.pool, reqs, s.policy, s.slos, PARAMS)
        trace = tmp_path / f"{name}.jsonl"
        trace.write_text(traces.dump_jsonl(reqs))
        offline[name] = (verdict.layer, trace)
        replays[name] = Replay(name, s.pool, reqs, simulate(s.pool, reqs, s.policy, PARAMS), PARAMS)
    clock = {"start": float("inf")}  # the replay starts once Prometheus has scraped its zeros
    servers = {name: serve(rp, clock) for name, rp in replays.items()}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{srv.server_port}"]}], "honor_labels": True}
            for name, srv in servers.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
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
        # The replay starts once Prometheus holds a scrape of every exporter (its zeros: the clock is not started yet).
        # A fixed 3 s after /-/ready was once enough; a loaded machine may take longer to the first scrape.
        first = time.time()
        for name in servers:
            _scraped_since(url, name, first - 3600)
        clock["start"] = time.time() + 1
        yield url, clock["start"], offline
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        for srv in servers.values():
            srv.shutdown()


def test_live_verdict_through_prometheus_names_the_offline_layer(
    replayed: tuple[str, float, dict[str, tuple[str, Path]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, start, offline = replayed
    results: dict[str, dict[str, object]] = {}
    for name in sorted(REPLAYED, key=REPLAYED.__getitem__):
        end = start + REPLAYED[name] + 2
        time.sleep(max(0.0, end - time.time()))
        _scraped_since(url, name, end)  # the last scrape of the window is in
        s = SCENARIOS[name]
        layer, trace = offline[name]
        argv = ["validate", "--prometheus", url, "--window", f"{round(end - start)}s", "--namespace", name,
                "--model", s.pool.model.name, "--routing", s.policy, "--step", "1", "--at", str(end),
                "--trace", str(trace), "--json", "--ttft-slo", str(s.slos.ttft_s), "--tpot-slo", str(s.slos.tpot_s)]  # fmt: skip
        code = main(argv)
        out = json.loads(capsys.readouterr().out)
        results[name] = out
        r = out["report"]
        with capsys.disabled():  # the figures docs/validate.md quotes
            print(f"{name}: live {out['verdict']['text']} | requests {r['requests']}, SLO {r['slo_attainment']:.0%}, "
                  f"decode load {r['decode_load']:.2f}, prefill load {r['prefill_load']:.2f}, peer-idle "
                  f"{r['wait_peer_idle_share']:.0%}, hit {r['hit_rate']:.0%} / oracle {r['oracle_hit_rate']:.0%}")  # fmt: skip
        assert out["verdict"]["layer"] == layer == s.planted, (name, out)
        assert code == (0 if s.planted == "none" else 1)  # exit 1: the SLO is missed
    few, chat, uneven = (results[n]["report"] for n in ("few-decode", "round-robin-chat", "uneven-slices"))
    assert isinstance(few, dict) and isinstance(chat, dict) and isinstance(uneven, dict)
    assert few["decode_load"] >= 1.0 and few["requests"] > 500
    assert chat["oracle_hit_rate"] - chat["hit_rate"] > 0.15 and chat["prefill_load"] < 0.95
    assert uneven["wait_peer_idle_share"] > 0.5
    far = results["cross-rack"]["report"]
    assert isinstance(far, dict) and far["kv_share_of_ttft"] >= 0.25
    # the text report reads the same window
    assert main(["validate", "--prometheus", url, "--window", "62s", "--namespace", "few-decode", "--model",
                 "llama-8b", "--routing", "llm-d", "--step", "1", "--at", str(start + 62)]) == 1  # fmt: skip
    text = capsys.readouterr().out
    assert "fix allocation first" in text and "decode slice" in text and "MEASURED" in text
