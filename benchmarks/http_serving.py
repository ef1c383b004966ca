"""The extender's HTTP serving cost, per parser and event loop, each against the others in one run.

Starts the real `vgpu-extender` (file source, --nodes x 8 GPUs, pinned to one core with taskset where there is one)
once per combination of HTTP parser (h11, httptools: vgpu_http.guard) and event loop (asyncio, uvloop), over plain
HTTP and, with --tls, over HTTPS, and times on one keep-alive connection to each:
  GET /healthz (the bare round trip), and
  /filter + /prioritize of a pod asking for no GPU (HTTP + JSON of the names, no placement work: the no-GPU floor
  that benchmarks/extender_latency.py's ratio target divides by) at 500 and at --nodes names.
Reported per combination: wall p50 and the server's CPU per request or pair (all its threads, /proc; exact over
many calls), and each one's ratio to h11 + uvloop (what the extender served with before: uvicorn's loop "auto"
picks uvloop where installed) and to h11 + asyncio (what the webhook's threaded server ran). All four servers run
at once and serve blocks of calls in turn, so a load that comes and goes on a shared machine falls on all alike.

    python benchmarks/http_serving.py [--nodes 5000] [--rounds 30] [--tls] [--json out.json]
    python benchmarks/http_serving.py serve PARSER LOOP -- EXTENDER-ARGS...   (the server process it starts)
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from extender_latency import ServerCpu, make_cluster, make_pod  # noqa: E402

from kube_vgpu_dev.processes import free_port  # noqa: E402

COMBINATIONS = (("h11", "uvloop"), ("h11", "asyncio"), ("httptools", "asyncio"), ("httptools", "uvloop"))
BEFORE = ("h11", "uvloop")
Combo = tuple[str, str]


def serve(parser: str, loop: str, extender_args: list[str]) -> int:
    """Run the extender with this parser and loop (vgpu_http.serving.DEFAULT is read when the server is built)."""
    from scheduler_extender.main import main
    from vgpu_http import serving

    serving.DEFAULT = serving.Choice(parser, loop)
    return main(extender_args)


class Client:
    """One keep-alive HTTP/1.1 connection with orjson bodies (as lean as kube-scheduler's Go client)."""

    def __init__(self, port: int, tls: bool) -> None:
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            self.conn: http.client.HTTPConnection = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
        else:
            self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body, headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {data[:200]!r}")
        return data

    def pair(self, pod: dict[str, Any], names: list[str]) -> None:
        f = orjson.loads(self.call("POST", "/filter", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})))
        self.call("POST", "/prioritize", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": f["NodeNames"]}))


@contextlib.contextmanager
def extender(parser: str, loop: str, cluster: Path, tls: tuple[Path, Path] | None) -> Iterator[int]:
    port = free_port()
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    args = ["--address", "127.0.0.1", "--port", str(port), "--source", "file", "--cluster-file", str(cluster)]
    if tls is not None:
        args += ["--tls-cert-file", str(tls[0]), "--tls-key-file", str(tls[1])]
    cmd = [*pin, sys.executable, __file__, "serve", parser, loop, "--", *args]
    log = tempfile.NamedTemporaryFile(prefix="http-serving-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"extender exited: {Path(log.name).read_text()[-2000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException, RuntimeError):
                Client(port, tls is not None).call("GET", "/healthz")
                break
            if time.monotonic() > deadline:
                raise RuntimeError("extender did not start")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        Path(log.name).unlink(missing_ok=True)


def interleaved(
    clients: dict[Combo, Client], cpus: dict[Combo, ServerCpu], names: list[str], args: argparse.Namespace
) -> dict[Combo, dict[str, float]]:
    """Wall p50 (ms) and server CPU (ms) per /healthz and per no-GPU pair at 500 and at all names, for every
    combination, in blocks taken in turn (each round starting with the next one), so that the load of a shared
    machine falls on all of them alike. A server idles between its blocks: its CPU over a phase is its calls'."""
    rng = random.Random(1)
    out: dict[Combo, dict[str, float]] = {c: {} for c in clients}
    for client in clients.values():  # warm: imports, first parses, the no-GPU path
        for _ in range(50):
            client.call("GET", "/healthz")
        for i in range(5):
            client.pair(make_pod(3 * 10**6 + i, rng, gpu=False), names)
    combos = list(clients)
    phases = (
        ("healthz", 0, args.healthz_block),
        ("pair_500", 500, args.pairs_500_block),
        ("pair_all", len(names), args.pairs_all_block),
    )
    for key, size, block in phases:
        walls: dict[Combo, list[float]] = {c: [] for c in combos}
        cpu0 = {c: cpus[c].seconds() for c in combos}
        for r in range(args.rounds):
            for c in combos[r % len(combos) :] + combos[: r % len(combos)]:
                for i in range(block):
                    if size:
                        at = (r * block + i) * size % len(names)
                        asked = (names[at:] + names[:at])[:size]
                        pod = make_pod(4 * 10**6 + i, rng, gpu=False)
                        t = time.perf_counter()
                        clients[c].pair(pod, asked)
                    else:
                        t = time.perf_counter()
                        clients[c].call("GET", "/healthz")
                    walls[c].append(time.perf_counter() - t)
        for c in combos:
            out[c][f"{key}_cpu_ms"] = (cpus[c].seconds() - cpu0[c]) / len(walls[c]) * 1000
            out[c][f"{key}_p50_ms"] = statistics.median(walls[c]) * 1000
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        parser, loop, sep, *rest = sys.argv[2:]
        assert sep == "--", sys.argv
        return serve(parser, loop, rest)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=30, help="blocks each combination serves, in turn, per phase")
    ap.add_argument("--healthz-block", type=int, default=100, help="GET /healthz calls in a block")
    ap.add_argument("--pairs-500-block", type=int, default=10, help="no-GPU filter+prioritize pairs at 500 names")
    ap.add_argument("--pairs-all-block", type=int, default=4, help="no-GPU filter+prioritize pairs at --nodes names")
    ap.add_argument("--tls", action="store_true", help="also over HTTPS (what kube-scheduler uses in a cluster)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.nodes <= 500:
        ap.error(f"--nodes {args.nodes}: must be over 500 (the pairs are timed at 500 names and at all of them)")
    if shutil.which("taskset"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {1})  # the client off the servers' core, where there is a second
    transports = [False, True] if args.tls else [False]
    summary: dict[tuple[str, str, bool], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Path(tmp) / "cluster.json"
        doc = make_cluster(args.nodes, args.gpus, random.Random(7))
        cluster.write_text(json.dumps(doc))
        names = [n["name"] for n in doc["nodes"]]
        pki = None
        if args.tls:
            from webhook.certs import write_dev_certs

            paths = write_dev_certs(Path(tmp) / "pki", ("localhost", "127.0.0.1"))
            pki = (paths.cert, paths.key)
        for tls in transports:
            with contextlib.ExitStack() as stack:
                clients: dict[Combo, Client] = {}
                cpus: dict[Combo, ServerCpu] = {}
                for parser, loop in COMBINATIONS:
                    # one path per server, so each one's CPU is found by its own cluster file argument
                    own = Path(tmp) / f"cluster-{parser}-{loop}-{int(tls)}.json"
                    own.symlink_to(cluster)
                    port = stack.enter_context(extender(parser, loop, own, pki if tls else None))
                    clients[(parser, loop)] = Client(port, tls)
                    stack.callback(clients[(parser, loop)].conn.close)
                    cpus[(parser, loop)] = ServerCpu(str(own))
                for (parser, loop), res in interleaved(clients, cpus, names, args).items():
                    summary[(parser, loop, tls)] = res
    print(
        f"HTTP serving: extender, {args.nodes} nodes x {args.gpus} GPUs, servers pinned to one core, "
        f"{args.rounds} interleaved blocks each (CPU: the server's, per request or filter+prioritize pair)"
    )
    for tls in transports:
        before = summary[(*BEFORE, tls)]
        plain = summary[("h11", "asyncio", tls)]
        for parser, loop in COMBINATIONS:
            s = summary[(parser, loop, tls)]
            ratio = "  ".join(
                f"{k.removesuffix('_cpu_ms')} {_ratio(s[k], before[k])}/{_ratio(s[k], plain[k])}"
                for k in s
                if "cpu" in k
            )
            print(f"  {'https' if tls else 'http '} {parser:>9} + {loop:<7} {_line(s)}")
            print(f"  {'':5} {'':>9}   {'':<7} CPU vs h11+uvloop / vs h11+asyncio: {ratio}")
    if args.json:
        out = {f"{p}+{lp}{'+tls' if t else ''}": v for (p, lp, t), v in summary.items()}
        args.json.write_text(json.dumps({"nodes": args.nodes, "rounds": args.rounds, "results": out}, indent=2))
    return 0


def _ratio(value: float, base: float) -> str:
    """`value` / `base`; "n/a" when the base read 0 (fewer calls than one /proc tick of CPU, 10 ms)."""
    return f"{value / base:.2f}x" if base else "n/a"


def _line(s: dict[str, float]) -> str:
    return "  ".join(
        f"{what} p50 {s[f'{key}_p50_ms']:6.3f} ms cpu {s[f'{key}_cpu_ms']:6.3f} ms"
        for what, key in (("healthz", "healthz"), ("pair@500", "pair_500"), ("pair@all", "pair_all"))
    )


if __name__ == "__main__":
    sys.exit(main())
