"""Latency of the real HTTPS webhook at a steady rate: p50/p99 per AdmissionReview (target p99 <= 10 ms).

Starts `vgpu-webhook serve` as a separate process on loopback (its own interpreter, so the load generator
does not share its GIL), with dev certificates, then sends AdmissionReviews built from the pod corpus
(tests/data/pods: mutated, refused and untouched pods) on keep-alive TLS connections, open loop: request
i is due at t0 + i/rate, and its latency is measured from that due time, so a slow server cannot hide
behind a slowed-down client. A `/healthz` round trip at a lower rate over the same kind of connection,
measured in the same run, is the baseline: the TLS + HTTP + client cost without any admission work.

    python benchmarks/webhook_latency.py [--rate 200] [--duration 10] [--connections 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from webhook import certs  # noqa: E402
from webhook.testing import load_corpus, make_review  # noqa: E402

MAX_DURATION_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_server(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    paths = certs.write_dev_certs(tmp, ("localhost", "127.0.0.1"))
    argv = [sys.executable, "-m", "webhook.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert-file", str(paths.cert), "--key-file", str(paths.key), "--log-level", "warning"]
    argv += ["--inventory-source", "static", "--max-gpu-memory-mib", "81559", "--max-gpus-per-node", "8"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_WEBHOOK_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(argv, env=env, cwd=REPO)
    ctx = _context(paths.ca_cert)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("webhook server did not start")


def _context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    return ctx


def _bodies() -> list[bytes]:
    _, pods = load_corpus(REPO / "tests" / "data" / "pods")
    return [json.dumps(make_review(pod)).encode() for pod in pods.values()]


def _run_stream(
    port: int,
    ctx: ssl.SSLContext,
    *,
    method: str,
    path: str,
    bodies: list[bytes] | None,
    rate: float,
    duration: float,
    connections: int,
    t0: float,
) -> tuple[list[float], list[float], int]:
    """Open-loop stream; returns (latency from due time, service time, errors), in seconds."""
    total = int(rate * duration)
    latencies: list[float] = []
    service: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def worker(k: int) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        mine_l: list[float] = []
        mine_s: list[float] = []
        for i in range(k, total, connections):
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter()
            try:
                body = bodies[i % len(bodies)] if bodies else None
                conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    raise RuntimeError(resp.status)
            except Exception:
                errors[0] += 1
                conn.close()
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
                continue
            done = time.perf_counter()
            mine_l.append(done - due)
            mine_s.append(done - sent)
        conn.close()
        with lock:
            latencies.extend(mine_l)
            service.extend(mine_s)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, service, errors[0]


def _server_side(port: int, ctx: ssl.SSLContext) -> str:
    """Time inside the handler (decide + encode), from the server's own histogram."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    buckets: dict[str, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith('vgpu_webhook_review_seconds_bucket{endpoint="mutate"'):
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
        elif line.startswith('vgpu_webhook_review_seconds_sum{endpoint="mutate"'):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith('vgpu_webhook_review_seconds_count{endpoint="mutate"'):
            count = float(line.rsplit(" ", 1)[1])
    if not count:
        return "server-side: no samples"
    shares = "  ".join(
        f"<={float(le) * 1000:g} ms: {n / count:.1%}"
        for le, n in buckets.items()
        if le in ("0.001", "0.002", "0.005", "0.01")
    )
    return f"{'server-side decide+encode':<28} n={int(count):>6} mean={total / count * 1000:.3f} ms  {shares}"


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] * 1000 if values else float("nan")


def _row(name: str, values: list[float], errors: int) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{name:<28} n={len(values):>6} errors={errors:<3} p50={_pct(values, 50):7.3f} ms  p90={_pct(values, 90):7.3f} ms"
        f"  p99={_pct(values, 99):7.3f} ms  max={max(ms) if ms else float('nan'):7.3f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="AdmissionReviews per second")
    parser.add_argument("--baseline-rate", type=float, default=50.0, help="/healthz requests per second")
    parser.add_argument("--duration", type=float, default=10.0, help=f"seconds (at most {MAX_DURATION_S:.0f})")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections for the reviews")
    parser.add_argument("--target-p99-ms", type=float, default=10.0)
    args = parser.parse_args()
    duration = min(args.duration, MAX_DURATION_S)
    bodies = _bodies()
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        proc = _start_server(Path(tmp), port)
        try:
            ctx = _context(Path(tmp) / "ca.crt")
            # Warm-up: imports, first handshakes, pydantic caches.
            _run_stream(
                port,
                ctx,
                method="POST",
                path="/mutate?timeout=10s",
                bodies=bodies,
                rate=100,
                duration=1.0,
                connections=args.connections,
                t0=time.perf_counter(),
            )
            t0 = time.perf_counter() + 0.1
            results: dict[str, tuple[list[float], list[float], int]] = {}

            def run(name: str, **kw: object) -> None:
                results[name] = _run_stream(port, ctx, t0=t0, duration=duration, **kw)  # type: ignore[arg-type]

            streams = [
                threading.Thread(
                    target=run,
                    args=("review",),
                    kwargs={
                        "method": "POST",
                        "path": "/mutate?timeout=10s",
                        "bodies": bodies,
                        "rate": args.rate,
                        "connections": args.connections,
                    },
                ),
                threading.Thread(
                    target=run,
                    args=("healthz",),
                    kwargs={
                        "method": "GET",
                        "path": "/healthz",
                        "bodies": None,
                        "rate": args.baseline_rate,
                        "connections": 1,
                    },
                ),
            ]
            for s in streams:
                s.start()
            for s in streams:
                s.join()
            server_side = _server_side(port, ctx)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    lat, svc, err = results["review"]
    base_lat, _, base_err = results["healthz"]
    print(
        f"webhook latency: {args.rate:.0f} reviews/s for {duration:.0f} s over {args.connections} TLS keep-alive "
        f"connections, {len(bodies)} corpus pods (loopback, server in its own process)"
    )
    print(_row("/mutate (from due time)", lat, err))
    print(_row("/mutate (service time)", svc, err))
    print(_row("/healthz baseline", base_lat, base_err))
    print(server_side)
    p99 = _pct(lat, 99)
    verdict = "OK" if p99 <= args.target_p99_ms and err == 0 else "MISSED"
    print(
        f"p99 per review {p99:.3f} ms vs target {args.target_p99_ms:.1f} ms: {verdict} "
        f"(admission work over baseline at p50: {_pct(lat, 50) - _pct(base_lat, 50):.3f} ms)"
    )
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
