"""Router feed scrape cost: what the llm-d router's polling costs the node daemon, rendered per scrape vs once
per watchdog snapshot.

The router's dcgm-data-source polls every endpoint once per tick (--refresh-metrics-interval, 50 ms by
default) and, in Kubernetes, every endpoint of a node polls the same URL (<node IP>:9402): a node with E
endpoints is scraped E x 20 times a second, while the data changes once per watchdog cycle (1 s). Same-run
baseline: prometheus_client's make_wsgi_app (generate_latest on every request, what serve() did before);
measured: CachedExposition (rendered once per snapshot). Both are called as WSGI apps in-process (server-side
CPU only, no sockets), then each is served over real HTTP once to check the bodies are the same.

    python benchmarks/router_feed_scrape.py [--gpus 8] [--procs 20] [--scrapes 2000] [--tick-ms 50]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import make_wsgi_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from watchdog_overhead import scenario

from device_plugin.telemetry.epp import epp_registry
from device_plugin.telemetry.serve import CachedExposition, serve
from device_plugin.testing.node_sim import RecordingKube, build
from device_plugin.watchdog.actions import Enforcer
from device_plugin.watchdog.cgroup import CgroupResolver
from device_plugin.watchdog.ladder import LadderConfig
from device_plugin.watchdog.sampling import NvmlSampler
from device_plugin.watchdog.watchdog import Watchdog


def call(app: Callable[..., Any]) -> bytes:
    out: list[bytes] = []
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "wsgi.input": None}
    for chunk in app(env, lambda status, headers: None):
        out.append(chunk)
    return b"".join(out)


def cpu_per_scrape(app: Callable[..., Any], n: int, new_snapshot_every: int, cycle: Callable[[], None]) -> float:
    """CPU seconds per request; a watchdog cycle (not counted) every `new_snapshot_every` requests."""
    total = 0.0
    for i in range(n):
        if i % new_snapshot_every == 0:
            cycle()
        t = time.process_time()
        call(app)
        total += time.process_time() - t
    return total / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=20)
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--tick-ms", type=float, default=50.0, help="the router's --refresh-metrics-interval")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the scenario's memory hogs log dry-run actions every cycle
    with tempfile.TemporaryDirectory() as tmp:
        sim = build(scenario(args.gpus, args.procs), Path(tmp) / "proc")
        wd = Watchdog(
            node=sim.node,
            gpus=sim.gpus,
            sampler=NvmlSampler(sim.nvml, sim.handles),
            pods=sim.pods,
            resolver=CgroupResolver(str(sim.proc_root)),
            enforcer=Enforcer(RecordingKube(), dry_run=True),
            ladder=LadderConfig(),
            clock=lambda: sim.nvml.now,
        )

        def cycle() -> None:
            sim.nvml.advance(1.0)
            wd.cycle()

        cycle()
        endpoints = len({(s.id.namespace, s.id.pod) for s in wd.snapshot().held})
        per_second = endpoints * 1000.0 / args.tick_ms  # scrapes of this node's feed per second
        per_snapshot = max(1, round(per_second))  # scrapes between two watchdog cycles at 1 Hz
        baseline_app = make_wsgi_app(epp_registry(wd.snapshot))
        cached_app = CachedExposition(epp_registry(wd.snapshot), wd.snapshot)
        baseline = cpu_per_scrape(baseline_app, args.scrapes, per_snapshot, cycle)
        # at least three snapshots, so each render is shared by as many scrapes as the router makes per cycle
        cached = cpu_per_scrape(cached_app, max(args.scrapes, 3 * per_snapshot), per_snapshot, cycle)
        # real HTTP once each: the same exposition either way
        bodies = []
        for version in (None, wd.snapshot):
            srv = serve(epp_registry(wd.snapshot), host="127.0.0.1", port=0, version=version)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=5) as r:
                    bodies.append(r.read())
            finally:
                srv.close()
        same = bodies[0] == bodies[1] and bodies[0].count(b"DCGM_FI_DEV_GPU_UTIL{") == endpoints
    result = {
        "endpoints_on_node": endpoints,
        "router_scrapes_per_s": round(per_second),
        "baseline_ms_per_scrape": round(baseline * 1e3, 3),
        "cached_ms_per_scrape": round(cached * 1e3, 4),
        "speedup": round(baseline / cached, 1) if cached else None,
        "baseline_cores_at_tick": round(baseline * per_second, 2),
        "cached_cores_at_tick": round(cached * per_second, 3),
        "renders": cached_app.renders,
        "http_bodies_ok": same,
    }
    print(json.dumps(result))
    print(
        f"{endpoints} endpoints, router tick {args.tick_ms:g} ms -> {per_second:.0f} scrapes/s of this node's feed: "
        f"per scrape {baseline * 1e3:.3f} ms rendered each time vs {cached * 1e3:.4f} ms cached "
        f"({result['speedup']}x); {baseline * per_second:.2f} vs {cached * per_second:.3f} cores"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
