"""The extender and the webhook under hostile HTTP clients, as real processes on loopback.

Re-runs the rows of the robustness table for both services, each with its outcome, against a same-run baseline:
  extender: pod fields of the wrong type; a 50 MB /filter body of small objects; a body of small objects just under
  the cap (the worst case that is parsed: peak RSS vs the manifests' 1 GiB limit); 50 MB of unknown node names and a
  full list of them under the cap; a 200 MB body; 6 x 8 MB and 10 x 1.3 MB valid pods (RSS growth: the parse cache
  keeps digests, not pods); a 12,001-character quantity;
  webhook: 10 MB and 50 MB AdmissionReviews, a review of small objects just under its cap (peak RSS vs its 256 Mi
  limit), wrong types, the long quantity, a container command line of 1 MiB of near-miss role flags (vgpu.roles'
  forward scans, against the regexes they replaced on the same text);
  both: N slow connections sending their headers a byte a second for --slow-seconds (closed by the servers?),
  and /healthz p99 while every attack runs (target <= 100 ms).
Peak RSS is sampled from /proc/PID/status every 10 ms. Stops by itself; about 35 s with the defaults.

    python benchmarks/http_robustness.py [--slow-connections 400] [--slow-seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler_extender.app import json_values  # noqa: E402
from vgpu.quantity import QuantityError, parse_int_quantity  # noqa: E402
from vgpu.roles import MAX_SCAN_CHARS, flag_in_text, kv_role_in_text  # noqa: E402
from webhook.certs import write_dev_certs  # noqa: E402

EXTENDER_LIMIT_MIB = 1024  # deploy/manifests/extender.yaml
WEBHOOK_LIMIT_MIB = 256  # deploy/webhook/deployment.yaml
EXTENDER_CAP = 16 * 1024 * 1024  # scheduler_extender.app.MAX_BODY, the default --max-body-bytes
WEBHOOK_CAP = 8 * 1024 * 1024  # webhook.server.MAX_BODY, the default max_body_bytes
MAX_VALUES = 200_000  # the default --max-json-values / max_json_values of both
CLUSTER = {
    "version": "v1",
    "nodes": [
        {"name": f"gpu-{i}", "gpuTemplate": {"count": 8, "model": "H100-80GB", "memoryMiB": 81920}} for i in range(50)
    ],
}
NODES = [f"gpu-{i}" for i in range(50)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod(name: str = "p", *, gpumem: str = "20000", pad: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "llm", "uid": str(uuid.uuid4())}
    if pad:
        meta["annotations"] = {f"note-{i}": "x" * 1000 for i in range(pad // 1000)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [
                {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": gpumem}}}
            ]
        },
    }


def review(obj: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "llm",
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": obj,
        },
    }


class Rss:
    """Peak and current resident memory of one process, sampled from /proc every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def now(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, self.now())

    def reset(self) -> None:
        self.peak = self.now()

    def stop(self) -> None:
        self._stop.set()


_PROBE = """
import ssl, sys, time, httpx
url, ca = sys.argv[1], sys.argv[2]
verify = ssl.create_default_context(cafile=ca) if ca else False
while True:
    started = time.perf_counter()
    try:
        httpx.get(url, verify=verify, timeout=5)
        took = time.perf_counter() - started
    except httpx.HTTPError:
        took = 5.0
    print(took, flush=True)
    time.sleep(0.005)
"""


class Prober:
    """GET /healthz every 5 ms on a fresh connection from a process of its own (so this one's work cannot delay
    it), the latency of each kept (a failure counts as 5 s)."""

    def __init__(self, url: str, ca: str = "") -> None:
        self.samples: list[float] = []
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE, url, ca], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.samples.append(float(line))

    def since(self, mark: int) -> str:
        got = sorted(self.samples[mark:])
        if not got:
            return "/healthz: no probe ended within the row"
        p99 = got[min(len(got) - 1, int(len(got) * 0.99))]
        return f"/healthz p99 {p99 * 1000:.1f} ms over {len(got)} probes"

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(5)


def stream(port: int, path: str, body_chunk: bytes, total: int, *, tls: bool = False, declared: bool = False) -> str:
    """Send `total` bytes (repeating `body_chunk`, chunked unless `declared`) until the server answers: its status,
    the bytes sent by then and the seconds taken."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock: socket.socket = raw
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        sock = ctx.wrap_socket(raw)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {total}\r\n" if declared else "Transfer-Encoding: chunked\r\n"
    sock.sendall((head + "\r\n").encode())
    sent, started, answer = 0, time.perf_counter(), b""
    try:
        while sent < total:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError, ssl.SSLWantReadError):
                answer = sock.recv(64)
            sock.setblocking(True)
            if answer:
                break
            offset = sent % len(body_chunk)
            piece = body_chunk[offset : offset + min(2**20, total - sent)]
            sock.sendall(piece if declared else f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
        if not answer:
            if not declared:
                sock.sendall(b"0\r\n\r\n")
            sock.settimeout(60)
            answer = sock.recv(64)
    except OSError:
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            answer = sock.recv(64)
    finally:
        sock.close()
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "closed"
    return f"HTTP {status} after {sent / 1e6:.1f} MB sent, {time.perf_counter() - started:.2f} s"


async def _slow(port: int, tls: bool, seconds: float, closed: list[float]) -> None:
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except OSError:
        closed.append(0.0)
        return
    header = b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000
    try:
        for byte in header:
            if time.monotonic() - started > seconds:
                return
            writer.write(bytes([byte]))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                    closed.append(time.monotonic() - started)
                    return
    except OSError:
        closed.append(time.monotonic() - started)
    finally:
        writer.close()


def slowloris(port: int, *, tls: bool, n: int, seconds: float) -> str:
    closed: list[float] = []

    async def run() -> None:
        await asyncio.gather(*(_slow(port, tls, seconds, closed) for _ in range(n)))

    asyncio.run(run())
    last = f", the last after {max(closed):.1f} s" if closed else ""
    return f"{len(closed)} of {n} closed by the server within {seconds:.0f} s{last}"


@contextlib.contextmanager
def process(argv: list[str], probe: str, verify: Any = False) -> Iterator[subprocess.Popen[bytes]]:
    log = tempfile.NamedTemporaryFile(prefix="http-robustness-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[2]} exited: {Path(log.name).read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(probe, verify=verify, timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[2]} did not start")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        Path(log.name).unlink(missing_ok=True)


def parser_time() -> str:
    """How long vgpu.quantity takes to refuse the 12,001-character quantity (the slowest of 100)."""
    worst = 0.0
    for _ in range(100):
        started = time.perf_counter()
        with contextlib.suppress(QuantityError):
            parse_int_quantity("1" * 12_001)
        worst = max(worst, time.perf_counter() - started)
    return f"refused by the parser in at most {worst * 1e6:.0f} us"


# A command line whose every flag and key is a near miss: the work a role scan must do is all of it.
ROLE_TEXT = ("--kv-transfer-config= " * 4 + "kv_role : 'kv_ ") * 12_000
REPLACED_FLAG = re.compile(r"--kv-transfer-config(?:=|\s+)('([^']*)'|\"((?:[^\"\\]|\\.)*)\"|(\S+))")
REPLACED_KV = re.compile(r"""["']?kv_role["']?\s*:\s*["']?(kv_\w+)""")


def role_scan_time() -> str:
    """vgpu.roles' scans over the text they read (MAX_SCAN_CHARS of it) vs the regexes they replaced (best of 20)."""

    def best(run: Callable[[], object]) -> float:
        times = []
        for _ in range(20):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times)

    text = ROLE_TEXT[:MAX_SCAN_CHARS]
    scan = best(lambda: (flag_in_text(text, "--kv-transfer-config"), kv_role_in_text(text)))
    regex = best(lambda: (REPLACED_FLAG.search(text), REPLACED_KV.search(text)))
    return f"the scans {scan * 1000:.1f} ms for {len(text) // 1024} KiB (the replaced regexes {regex * 1000:.1f} ms)"


def row(
    what: str, outcome: str, rss: Rss | None = None, limit: int = 0, probe: Prober | None = None, mark: int = 0
) -> None:
    extra = f"; peak RSS {rss.peak} MiB of {limit} MiB" if rss is not None else ""
    extra += f"; {probe.since(mark)}" if probe is not None else ""
    print(f"  {what:<44} {outcome}{extra}", flush=True)


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    r = call()
    return r, time.perf_counter() - started


def extender_rows(tmp: Path, args: argparse.Namespace) -> None:
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    port, health = free_port(), free_port()
    argv = [sys.executable, "-m", "scheduler_extender.main", "--address", "127.0.0.1", "--port", str(port)]
    argv += ["--health-port", str(health), "--source", "file", "--cluster-file", str(cluster), "--log-level", "error"]
    url = f"http://127.0.0.1:{port}"
    with process(argv, f"http://127.0.0.1:{health}/healthz") as proc, httpx.Client(base_url=url, timeout=60) as c:
        rss, probe = Rss(proc.pid), Prober(f"http://127.0.0.1:{health}/healthz")
        print("extender (limit 1 GiB; --max-body-bytes 16 MiB, --max-json-values 200000, --max-node-names 15000)")
        lat = []
        for i in range(30):
            _, t = timed(lambda i=i: c.post("/filter", json={"Pod": pod(f"base-{i}"), "NodeNames": NODES}))
            lat.append(t)
        idle = rss.now()
        row(
            "baseline: a valid /filter over 50 nodes",
            f"median {statistics.median(lat) * 1000:.1f} ms; idle RSS {idle} MiB",
        )

        def attack(what: str, run: Callable[[], str], limit: int = EXTENDER_LIMIT_MIB) -> None:
            rss.reset()
            mark = len(probe.samples)
            outcome = run()
            time.sleep(0.2)  # a probe the attack held up ends in this row
            row(what, outcome, rss, limit, probe, mark)

        def wrong_types() -> str:
            bodies: list[Any] = [
                {"spec": {"containers": {}}},
                {"metadata": []},
                {"spec": {"containers": [{"resources": {"limits": [1]}}]}},
                {"metadata": {"labels": {"a": 1}}},
                {"spec": {"containers": [{"args": [None]}]}},
                {"metadata": {"annotations": {"vgpu.io/node-policy": {}}}},
                {"spec": {"containers": ["x"]}},
                {"status": {"phase": 3}},
            ]
            codes: dict[int, int] = {}
            for body in bodies * 10:
                code = c.post("/filter", json={"Pod": body, "NodeNames": NODES}).status_code
                codes[code] = codes.get(code, 0) + 1
            return ", ".join(f"{n} x HTTP {k}" for k, n in sorted(codes.items()))

        attack("pod fields of the wrong type (80 bodies)", wrong_types)
        small = b"[" + b"{}," * 100_000 + b"{}]"
        attack("50 MB /filter body of small objects", lambda: stream(port, "/filter", small, 50_000_000))

        def under_cap() -> str:
            head = b'{"Pod":' + json.dumps(pod("under")).encode() + b',"NodeNames":[],"Nodes":{"items":[{"x":['
            pad = EXTENDER_CAP - len(head) - 3 * (MAX_VALUES // 2) - 100
            body = head + b"{}," * (MAX_VALUES // 2 - 100) + b'"' + b"0" * pad + b'"]}]}}'
            r, t = timed(lambda: c.post("/filter", content=body))
            return f"HTTP {r.status_code} in {t:.2f} s ({len(body) / 2**20:.1f} MiB, {json_values(body):,} values)"

        attack("just under both caps (16 MiB, 200,000 values)", under_cap)
        attack(
            "16 MiB of tiny objects (over the values cap)",
            lambda: stream(port, "/filter", small, EXTENDER_CAP - 1000, declared=True),
        )
        names = (
            b'{"Pod":' + json.dumps(pod("ghosts")).encode() + b',"NodeNames":[' + b'"ghost-node-name-x",' * 2_500_000
        )
        attack("50 MB of unknown node names", lambda: stream(port, "/filter", names, 50_000_000))

        def capped_names() -> str:
            ghosts = [f"ghost-{i:05d}-" + "x" * 240 for i in range(15_000)]
            r, t = timed(lambda: c.post("/filter", json={"Pod": pod("ghosts"), "NodeNames": ghosts}))
            return f"HTTP {r.status_code} in {t:.2f} s, answer {len(r.content) / 1e6:.1f} MB"

        attack("15,000 unknown 253-char names (the cap)", capped_names)
        attack("200 MB body", lambda: stream(port, "/filter", small, 200_000_000, declared=False))

        def big_pods(n: int, size: int) -> Callable[[], str]:
            def run() -> str:
                before = rss.now()
                codes = [
                    c.post("/filter", json={"Pod": pod(f"big-{n}-{i}", pad=size), "NodeNames": NODES}).status_code
                    for i in range(n)
                ]
                time.sleep(0.5)
                return f"{codes.count(200)} x HTTP 200; RSS {before} -> {rss.now()} MiB after"

            return run

        attack("6 x 8 MB valid pods", big_pods(6, 8_000_000))
        attack("10 x 1.3 MB valid pods", big_pods(10, 1_300_000))

        def long_quantity() -> str:
            r, t = timed(lambda: c.post("/filter", json={"Pod": pod("q", gpumem="1" * 12_001), "NodeNames": NODES}))
            why = next(iter(r.json()["FailedAndUnresolvableNodes"].values()), "")
            return f"HTTP {r.status_code} in {t * 1000:.1f} ms round trip, {parser_time()}: ...{why[-40:]}"

        attack("a 12,001-character quantity", long_quantity)
        attack(
            f"{args.slow_connections} slow connections for {args.slow_seconds:.0f} s",
            lambda: slowloris(port, tls=False, n=args.slow_connections, seconds=args.slow_seconds),
        )
        probe.stop()
        rss.stop()


def webhook_rows(tmp: Path, args: argparse.Namespace) -> None:
    pki = write_dev_certs(tmp / "pki", ("localhost", "127.0.0.1"))
    port = free_port()
    argv = [sys.executable, "-m", "webhook.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert-file", str(pki.cert), "--key-file", str(pki.key), "--log-level", "error"]
    argv += ["--inventory-source", "static", "--max-gpu-memory-mib", "81920", "--max-gpus-per-node", "8"]
    url = f"https://127.0.0.1:{port}"
    verify = ssl.create_default_context(cafile=str(pki.ca_cert))
    with process(argv, f"{url}/healthz", verify) as proc, httpx.Client(base_url=url, verify=verify, timeout=60) as c:
        rss, probe = Rss(proc.pid), Prober(f"{url}/healthz", str(pki.ca_cert))
        print("webhook (limit 256 Mi; max_body_bytes 8 MiB, max_json_values 200000)")
        lat = []
        for i in range(30):
            _, t = timed(lambda i=i: c.post("/mutate", json=review(pod(f"base-{i}"))))
            lat.append(t)
        row("baseline: a valid /mutate", f"median {statistics.median(lat) * 1000:.1f} ms; idle RSS {rss.now()} MiB")

        def attack(what: str, run: Callable[[], str]) -> None:
            rss.reset()
            mark = len(probe.samples)
            outcome = run()
            time.sleep(0.2)  # a probe the attack held up ends in this row
            row(what, outcome, rss, WEBHOOK_LIMIT_MIB, probe, mark)

        for mb in (10, 50):
            body = json.dumps(review(pod("huge", pad=mb * 1_000_000))).encode()
            attack(
                f"{mb} MB AdmissionReview",
                lambda body=body: stream(port, "/mutate", body, len(body), tls=True, declared=True),
            )

        def under_cap() -> str:
            body = json.dumps(review(pod("under"))).encode()
            pad = WEBHOOK_CAP - len(body) - 3 * (MAX_VALUES // 2) - 100
            fill = b"{}," * (MAX_VALUES // 2 - 1000) + b'"' + b"0" * pad + b'"'
            body = body.replace(b'"spec": {', b'"spec": {"x": [' + fill + b"], ", 1)
            r, t = timed(lambda: c.post("/mutate", content=body))
            return f"HTTP {r.status_code} in {t:.2f} s ({len(body) / 2**20:.1f} MiB, {json_values(body):,} values)"

        attack("just under both caps (8 MiB, 200,000 values)", under_cap)
        small = b"[" + b"{}," * 100_000 + b"{}]"
        attack(
            "8 MiB of tiny objects (over the values cap)",
            lambda: stream(port, "/mutate", small, WEBHOOK_CAP - 1000, tls=True, declared=True),
        )

        def wrong_types() -> str:
            bodies: list[Any] = [
                {"spec": {"containers": {}}},
                {"metadata": []},
                {"spec": {"containers": [{"resources": {"limits": [1]}}]}},
            ]
            codes: dict[str, int] = {}
            for body in bodies * 10:
                r = c.post("/mutate", json=review(body))
                key = f"HTTP {r.status_code}" + (
                    f" denied {r.json()['response']['status']['code']}" if r.status_code == 200 else ""
                )
                codes[key] = codes.get(key, 0) + 1
            return ", ".join(f"{n} x {k}" for k, n in sorted(codes.items()))

        attack("pod fields of the wrong type (30 reviews)", wrong_types)

        def long_quantity() -> str:
            r, t = timed(lambda: c.post("/mutate", json=review(pod("q", gpumem="1" * 12_001))))
            message = r.json()["response"]["status"]["message"]
            return f"HTTP {r.status_code} in {t * 1000:.1f} ms round trip, {parser_time()}: ...{message[-40:]}"

        attack("a 12,001-character quantity", long_quantity)

        def near_miss_flags() -> str:
            body = pod("roles")
            body["spec"]["containers"][0]["command"] = ["sh", "-c", ROLE_TEXT]
            r, t = timed(lambda: c.post("/mutate", json=review(body)))
            return f"HTTP {r.status_code} in {t * 1000:.1f} ms round trip; {role_scan_time()}"

        attack(f"{len(ROLE_TEXT) / 2**20:.1f} MiB of near-miss role flags", near_miss_flags)
        attack(
            f"{args.slow_connections} slow TLS connections for {args.slow_seconds:.0f} s",
            lambda: slowloris(port, tls=True, n=args.slow_connections, seconds=args.slow_seconds),
        )
        probe.stop()
        rss.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow-connections", type=int, default=400)
    parser.add_argument(
        "--slow-seconds", type=float, default=20.0, help="how long each slow client keeps trying (read deadline: 10 s)"
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="http-robustness-") as tmp:
        extender_rows(Path(tmp), args)
        webhook_rows(Path(tmp), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
