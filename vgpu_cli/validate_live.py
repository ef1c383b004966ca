"""`vgpu validate --prometheus URL`: the layered report and verdict from a live cluster (docs/validate.md).

A thin adapter: queries Prometheus's HTTP API (/api/v1/query for increase() over the window,
/api/v1/query_range for the gauges sampled at each step) and hands the numbers to vgpu.whatif.live, which
builds the same Report the simulation gives; the verdict is vgpu.whatif.verdict.judge, the same rules.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from typing import Any

import httpx

from vgpu.perf.params import GPUS, MODELS, PerfParams
from vgpu.whatif import live, routing
from vgpu.whatif.live import Engine, Histogram, Slice, Window
from vgpu.whatif.report import Report, Slos
from vgpu.whatif.sim import kv_capacity_tokens
from vgpu.whatif.verdict import Verdict, judge, met
from vgpu_cli.common import EXIT_FAILED, EXIT_OK, CliError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$")


def parse_window(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise CliError(f"--window {text!r}: give a positive duration with a unit, e.g. 90s, 10m, 1h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


class Prom:
    """Prometheus HTTP API at `url`, every query evaluated at `at` (unix seconds)."""

    def __init__(self, url: str, at: float, timeout: float = 10.0) -> None:
        self.url, self.at = url.rstrip("/"), at
        self.http = httpx.Client(timeout=timeout)

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            r = self.http.get(f"{self.url}{path}", params=params)
            body = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise CliError(f"--prometheus {self.url}: {exc}") from None
        if body.get("status") != "success":
            raise CliError(f"--prometheus {self.url}: {params.get('query')}: {body.get('error', body)}")
        return list(body["data"]["result"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": expr, "time": self.at})

    def scalar(self, expr: str) -> float:
        res = self.query(expr)
        return float(res[0]["value"][1]) if res else math.nan

    def range(self, expr: str, seconds: float, step: float) -> list[dict[str, Any]]:
        return self._get(
            "/api/v1/query_range", {"query": expr, "start": self.at - seconds, "end": self.at, "step": step}
        )


def _sel(namespace: str | None, role: str | None = None) -> str:
    parts = ([f'namespace="{namespace}"'] if namespace else []) + ([f'role="{role}"'] if role else [])
    return "{" + ",".join(parts) + "}"


def histogram(prom: Prom, names: tuple[str, ...], sel: str, w: str) -> Histogram:
    """The window's increase of the first of `names` that has data, summed over the selected pods."""
    for name in names:
        rows = prom.query(f"sum by (le) (increase({name}_bucket{sel}[{w}]))")
        if not rows:
            continue
        buckets = sorted((float(r["metric"]["le"]), float(r["value"][1])) for r in rows)
        total = prom.scalar(f"sum(increase({name}_sum{sel}[{w}]))")
        count = prom.scalar(f"sum(increase({name}_count{sel}[{w}]))")
        return Histogram(tuple(buckets), 0.0 if math.isnan(total) else total, 0.0 if math.isnan(count) else count)
    return Histogram()


def counter(prom: Prom, names: tuple[str, ...], sel: str, w: str) -> float:
    for name in names:
        v = prom.scalar(f"sum(increase({name}{sel}[{w}]))")
        if not math.isnan(v):
            return v
    return math.nan


def gauges(prom: Prom, names: tuple[str, ...], sel: str, seconds: float, step: float) -> dict[str, list[float]]:
    """Per pod, the gauge at each step of the window (a step without a sample reads 0)."""
    for name in names:
        rows = prom.range(f"{name}{sel}", seconds, step)
        if not rows:
            continue
        steps = sorted({float(t) for r in rows for t, _ in r["values"]})
        out: dict[str, list[float]] = {}
        for r in rows:
            have = {float(t): float(v) for t, v in r["values"]}
            pod = r["metric"].get("pod", "")
            out[pod] = [
                a + b for a, b in zip(out.get(pod, [0.0] * len(steps)), (have.get(t, 0.0) for t in steps), strict=True)
            ]
        return out
    return {}


def slices(prom: Prom, namespace: str | None) -> list[Slice]:
    sel = _sel(namespace)
    mem = {r["metric"].get("pod", ""): float(r["value"][1]) for r in prom.query(f"{live.SLICE_MEMORY}{sel}")}
    out: list[Slice] = []
    for r in prom.query(f"{live.SLICE_SM}{sel}"):
        m = r["metric"]
        role = m.get("role", "")
        if role not in ("prefill", "decode"):
            continue
        pod = m.get("pod", "")
        out.append(
            Slice(pod, role, float(r["value"][1]), mem.get(pod, 0.0) / 1e9, m.get("UUID", pod), m.get("Hostname", ""))
        )
    return out


def ttft(prom: Prom, names: tuple[str, ...], namespace: str | None, w: str) -> Histogram:
    """The router's end-to-end TTFT where it exports one, else the engine's on the decode pods."""
    h = histogram(prom, (live.ROUTER_TTFT,), _sel(namespace), w)
    return h if h.count > 0 else histogram(prom, names, _sel(namespace, "decode"), w)


def read_window(prom: Prom, engine: Engine, namespace: str | None, seconds: float, step: float) -> Window:
    names = live.NAMES[engine]
    w = f"{round(seconds)}s"
    pre, dec = _sel(namespace, "prefill"), _sel(namespace, "decode")
    return Window(
        seconds=seconds,
        arrivals=counter(prom, (live.ROUTER_REQUESTS,), _sel(namespace), w),
        ttft=ttft(prom, names["ttft"], namespace, w),
        tpot=histogram(prom, names["tpot"], dec, w),
        prefill_queue=histogram(prom, names["queue"], pre, w),
        decode_queue=histogram(prom, names["queue"], dec, w),
        kv_xfer=histogram(prom, names["kv_xfer"], dec, w),
        prompt_tokens=histogram(prom, names["prompt"], dec, w),
        output_tokens=histogram(prom, names["output"], dec, w),
        prefix_queries=counter(prom, names["prefix_queries"], pre, w),
        prefix_hits=counter(prom, names["prefix_hits"], pre, w),
        running=gauges(prom, names["running"], _sel(namespace), seconds, step),
        waiting=gauges(prom, names["waiting"], _sel(namespace), seconds, step),
        kv_usage=gauges(prom, names["kv_usage"], _sel(namespace), seconds, step),
    )


def run(args: argparse.Namespace) -> int:
    from vgpu_cli.validate import ROWS, _cell, load_trace

    if args.model not in MODELS:
        raise CliError(f"--model {args.model!r}: live mode needs the served model; known: {', '.join(MODELS)}")
    if args.gpu not in GPUS:
        raise CliError(f"--gpu {args.gpu!r} is unknown; known: {', '.join(GPUS)}")
    if args.routing is None:
        raise CliError(
            f"live mode needs --routing: the policy the cluster's router uses ({', '.join(routing.POLICIES)})"
        )
    seconds = parse_window(args.window)
    slos = Slos(args.ttft_slo or 0.5, args.tpot_slo or 0.03)
    try:
        slos.check()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    params = PerfParams(layerwise_kv=args.layerwise_kv)
    prom = Prom(args.prometheus, args.at if args.at is not None else time.time())
    found = slices(prom, args.namespace)
    if not found:
        where = f" in namespace {args.namespace}" if args.namespace else ""
        raise CliError(
            f"no {live.SLICE_SM} series with role prefill or decode{where} at {args.prometheus}: "
            "the live mode needs our node exporter scraped (docs/telemetry.md)"
        )
    try:
        pool = live.pool_from_slices(MODELS[args.model], GPUS[args.gpu], found)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    window = read_window(prom, args.engine, args.namespace, seconds, args.step)
    if window.ttft.count <= 0:
        raise CliError(f"no TTFT observations on decode pods in the last {args.window}: nothing was served")
    oracle = math.nan
    if args.trace:
        cache = sum(kv_capacity_tokens(pool, i, params) for i in pool.role("prefill"))
        oracle = live.oracle_hit_rate(load_trace(args.trace), cache)
    rep = live.build(pool, window, slos, params, oracle)
    f = judge(rep, pool, args.routing)
    verdict = met(rep, slos) if f is None else Verdict(f.layer, f.cause, None, f.change)
    if args.json:
        print(json.dumps(as_json(args, rep, verdict), indent=1))
    else:
        head = (
            f"live: {rep.prefill_instances} prefill + {rep.decode_instances} decode pods of {args.model} on "
            f"{args.gpu}{' in ' + args.namespace if args.namespace else ''}; routing {args.routing}; "
            f"{rep.requests} requests at {rep.offered_rps:.1f} req/s over {args.window}; "
            f"SLO TTFT {slos.ttft_s * 1000:.0f} ms, TPOT {slos.tpot_s * 1000:.0f} ms for {slos.target:.0%}"
        )
        rows = [["LAYER", "METRIC", "MEASURED"]] + [[a, b, _cell(rep, c)] for a, b, c in ROWS]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        table = ["  ".join(c.ljust(wd) for c, wd in zip(r, widths, strict=True)).rstrip() for r in rows]
        print("\n".join([head, "", *table, "", "VERDICT  " + verdict.text(rep)]))
    return EXIT_OK if rep.slo_met else EXIT_FAILED


def as_json(args: argparse.Namespace, rep: Report, verdict: Verdict) -> dict[str, Any]:
    d = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rep.as_dict().items()}
    return {
        "live": {"prometheus": args.prometheus, "window": args.window, "namespace": args.namespace},
        "routing": args.routing,
        "report": d,
        "verdict": {"layer": verdict.layer, "cause": verdict.cause, "text": verdict.text(rep)},
        "whatIf": None if not verdict.suggested else {"change": verdict.suggested},
    }
