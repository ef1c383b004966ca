"""`vgpu validate`: request-level what-if of a deployment (docs/validate.md).

Simulates a bundled scenario (or a trace file on a scenario's deployment) request by request, prints
the layered report (latency and SLO, allocation, queuing, cache, communication), the verdict naming
the layer to fix first and the what-if that shows it. Exit code 1 when the SLO is missed.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vgpu.perf.bench import configs
from vgpu.perf.params import GPUS, H200, MODELS, PerfParams
from vgpu.perf.workload import cluster
from vgpu.whatif import routing, traces
from vgpu.whatif.placed import place_pool
from vgpu.whatif.report import Report
from vgpu.whatif.scenarios import PLACEMENT_CASES, SCENARIOS, PlacementCase, Scenario
from vgpu.whatif.verdict import Verdict, diagnose
from vgpu.whatif.workload import Request, generate
from vgpu_cli.common import EXIT_FAILED, EXIT_OK, CliError, Subparsers


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "validate",
        help="request-level what-if: which layer (allocation, queuing, cache, communication) misses the SLO",
        description=(
            "Simulates every request of a workload on a prefill/decode deployment: routing, queuing, prefill on "
            "the slice's SM share, KV transfer by locality, decode steps and per-instance prefix caches. Reports "
            "TTFT/TPOT and SLO attainment, then each layer separately, and names the layer to fix first with "
            "the what-if that shows it. Exit code 1 when the SLO is missed."
        ),
    )
    p.add_argument("scenario", nargs="?", help=f"bundled scenario: {', '.join(SCENARIOS)}")
    p.add_argument("--list", action="store_true", help="list the bundled scenarios and exit")
    p.add_argument(
        "--placement",
        metavar="CASE",
        help=f"place a deployment with the planner under each pd-bench configuration and simulate each: {', '.join(PLACEMENT_CASES)}",
    )
    p.add_argument("--routing", choices=routing.POLICIES, help="routing policy (default: the scenario's)")
    p.add_argument("--seed", type=int, help="workload seed (default: the scenario's)")
    p.add_argument("--rate", type=float, help="requests per second (default: the scenario's)")
    p.add_argument("--duration", type=float, help="trace length in seconds (default: the scenario's)")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help=f"trace to replay on the scenario's deployment: JSON lines ({traces.JSONL_FIELDS}) or an Azure LLM inference CSV ({traces.AZURE_HEADER})",
    )
    p.add_argument("--ttft-slo", type=float, help="TTFT SLO in seconds (default: the scenario's)")
    p.add_argument("--tpot-slo", type=float, help="TPOT SLO in seconds (default: the scenario's)")
    p.add_argument("--layerwise-kv", action="store_true", help="model layer-wise KV transfer (5-8 ms visible)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument(
        "--plot", metavar="FILE", help="write a PNG of the layers, now and after the what-if (needs matplotlib)"
    )
    own = p.add_argument_group(
        "your deployment (--deployment): pods placed by the planner on a cluster file, then simulated per model pool"
    )
    own.add_argument("--deployment", metavar="PODS.yaml", help="Kubernetes Pod YAML of the model pools' pods")
    own.add_argument(
        "--cluster",
        metavar="CLUSTER.yaml",
        help="cluster file (docs/cluster-file.md; default the bundled demo cluster)",
    )
    own.add_argument("--config", default="default", help="placement configuration (pd-bench's; default: ours)")
    p.add_argument("--write-trace", metavar="FILE", help="write the workload as a JSON-lines trace and exit")
    live = p.add_argument_group("live cluster (--prometheus): the same report from metrics over a window")
    live.add_argument("--prometheus", metavar="URL", help="read the layers from this Prometheus instead of simulating")
    live.add_argument("--window", default="10m", help="window to read, e.g. 90s, 10m, 1h (default 10m)")
    live.add_argument("--namespace", help="only the pods of this namespace")
    live.add_argument("--model", help=f"the served model, for the capacity model: {', '.join(MODELS)}")
    live.add_argument("--gpu", default="H200", help=f"GPU of the nodes: {', '.join(GPUS)} (default H200)")
    live.add_argument("--engine", choices=("vllm", "sglang"), default="vllm", help="serving engine's metric names")
    live.add_argument("--step", type=float, default=15.0, help="seconds between gauge samples (default 15)")
    live.add_argument("--at", type=float, help="end of the window, unix seconds (default now)")
    p.set_defaults(func=run)


def load_trace(path: str) -> list[Request]:
    """Read a trace file in either format (vgpu.whatif.traces); errors name the file and line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"--trace {path}: {exc.strerror}") from None
    try:
        return traces.parse(text)
    except ValueError as exc:
        raise CliError(f"--trace {path} {exc}") from None


def _scenario(args: argparse.Namespace) -> Scenario:
    if args.scenario not in SCENARIOS:
        raise CliError(f"scenario {args.scenario!r} is unknown; bundled: {', '.join(SCENARIOS)} (see --list)")
    s = SCENARIOS[args.scenario]
    work = replace(
        s.workload, **{k: v for k, v in (("rate", args.rate), ("duration_s", args.duration)) if v is not None}
    )
    slos = replace(s.slos, **{k: v for k, v in (("ttft_s", args.ttft_slo), ("tpot_s", args.tpot_slo)) if v is not None})
    try:
        work.check()
        slos.check()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return replace(
        s, workload=work, slos=slos, policy=args.routing or s.policy, seed=s.seed if args.seed is None else args.seed
    )


ROWS: tuple[tuple[str, str, str], ...] = (
    ("latency", "TTFT p50 / p99", "ttft"),
    ("", "TPOT p50 / p99", "tpot"),
    ("", "SLO attainment (TTFT / TPOT / both)", "slo"),
    ("allocation", "prefill load (oracle hits) / decode load", "load"),
    ("", "busiest prefill slice / decode KV use mean, peak", "busy"),
    ("queuing", "prefill wait mean / p99", "pwait"),
    ("", "decode admission wait mean / p99", "dwait"),
    ("", "waiting while a peer was idle", "peer"),
    ("cache", "prefix hit rate / oracle router", "hit"),
    ("communication", "KV transfer share of TTFT (mean)", "kv"),
)


def _cell(r: Report, what: str) -> str:
    ms = 1000.0
    cells = {
        "ttft": f"{r.ttft_p50_s * ms:.0f} / {r.ttft_p99_s * ms:.0f} ms",
        "tpot": f"{r.tpot_p50_s * ms:.1f} / {r.tpot_p99_s * ms:.1f} ms",
        "slo": f"{r.ttft_attainment:.0%} / {r.tpot_attainment:.0%} / {r.slo_attainment:.0%}",
        "load": f"{r.prefill_load:.2f} / {r.decode_load:.2f}",
        "busy": f"{r.prefill_busy_max:.0%} / {r.decode_kv_mean:.0%}, {r.decode_kv_peak:.0%}",
        "pwait": f"{r.prefill_wait_mean_s * ms:.0f} / {r.prefill_wait_p99_s * ms:.0f} ms",
        "dwait": f"{r.decode_wait_mean_s * ms:.0f} / {r.decode_wait_p99_s * ms:.0f} ms",
        "peer": f"{r.wait_peer_idle_share:.0%}",
        "hit": f"{r.hit_rate:.0%} / "
        + ("n/a" if r.oracle_hit_rate != r.oracle_hit_rate else f"{r.oracle_hit_rate:.0%}"),
        "kv": f"{r.kv_share_of_ttft:.0%} ({r.kv_mean_s * ms:.0f} ms)",
    }
    return cells[what]


def render(s: Scenario, rep: Report, verdict: Verdict) -> str:
    fix = verdict.fix
    head = ["LAYER", "METRIC", "NOW"] + (["WHAT-IF"] if fix else [])
    rows = [head]
    for layer, metric, what in ROWS:
        rows.append([layer, metric, _cell(rep, what)] + ([_cell(fix.report, what)] if fix else []))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    pool = f"{rep.prefill_instances} prefill + {rep.decode_instances} decode slices of {s.pool.model.name} on {s.pool.gpu.name}"
    lines = [
        f"scenario {s.name}: {s.summary}",
        f"{pool}; routing {s.policy}; {rep.requests} requests at {rep.offered_rps:.1f} req/s; "
        f"SLO TTFT {s.slos.ttft_s * 1000:.0f} ms, TPOT {s.slos.tpot_s * 1000:.0f} ms for {s.slos.target:.0%} of requests",
        "",
        *table,
        "",
        "VERDICT  " + verdict.text(rep),
    ]
    if fix:
        lines.append(f"WHAT-IF  {fix.change}" + (f" (routing {fix.policy})" if fix.policy != s.policy else ""))
    return "\n".join(lines) + "\n"


def as_json(s: Scenario, rep: Report, verdict: Verdict) -> dict[str, Any]:
    fix = verdict.fix
    return {
        "scenario": s.name,
        "routing": s.policy,
        "slos": {"ttftSeconds": s.slos.ttft_s, "tpotSeconds": s.slos.tpot_s, "target": s.slos.target},
        "report": rep.as_dict(),
        "verdict": {"layer": verdict.layer, "cause": verdict.cause, "text": verdict.text(rep)},
        "whatIf": None
        if fix is None
        else {"change": fix.change, "routing": fix.policy, "report": fix.report.as_dict()},
    }


PLOT_BARS = (
    ("slo_attainment", "SLO attainment"),
    ("prefill_load", "prefill load"),
    ("decode_load", "decode load"),
    ("wait_peer_idle_share", "wait, peer idle"),
    ("hit_rate", "prefix hit rate"),
    ("oracle_hit_rate", "oracle hit rate"),
    ("kv_share_of_ttft", "KV share of TTFT"),
)


def plot(rep: Report, verdict: Verdict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib (pip install matplotlib)") from None
    reports = [("now", rep)] + ([("what-if", verdict.fix.report)] if verdict.fix else [])
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(reports)
    for k, (label, r) in enumerate(reports):
        d = r.as_dict()
        ax.bar([i + k * width for i in range(len(PLOT_BARS))], [d[key] for key, _ in PLOT_BARS], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(PLOT_BARS))], [t for _, t in PLOT_BARS], fontsize=8)
    ax.axhline(1.0, color="grey", linewidth=0.6)
    ax.set_title(verdict.text(rep)[:110], fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def compare_placements(case: PlacementCase, params: PerfParams) -> list[dict[str, Any]]:
    """One row per configuration: where the planner put the slices and what the requests saw."""
    requests = generate(case.workload, case.seed)
    rows: list[dict[str, Any]] = []
    for c in configs():
        pl = place_pool(case.target, cluster(case.nodes), c, H200, params, case.neighbours)
        row: dict[str, Any] = {"config": c.name, "note": c.note, "unplaced": list(pl.unplaced)}
        row["slices"] = [
            {"name": i.name, "role": i.role, "gpu": i.gpu, "node": i.node, "smShare": round(i.sm_share, 3),
             "slowdown": round(i.slowdown, 3)}
            for i in pl.pool.instances
        ]  # fmt: skip
        if pl.pool.role("prefill") and pl.pool.role("decode"):
            rep, verdict = diagnose(pl.pool, requests, case.policy, case.slos, params)
            row |= {"report": rep.as_dict(), "verdict": verdict.text(rep), "layer": verdict.layer}
        rows.append(row)
    return rows


def render_placements(case: PlacementCase, rows: list[dict[str, Any]]) -> str:
    head = ["CONFIG", "P/D", "SLOWED", "SLO", "TTFT p50/p99 ms", "TPOT p99 ms", "VERDICT"]
    table = [head]
    for r in rows:
        rep = r.get("report")
        n_p = sum(x["role"] == "prefill" for x in r["slices"])
        slowed = sum(x["slowdown"] >= 1.5 for x in r["slices"])
        if rep is None:
            table.append([r["config"], f"{n_p}/{len(r['slices']) - n_p}", str(slowed), "-", "-", "-", "not placed"])
            continue
        table.append(
            [
                r["config"],
                f"{n_p}/{len(r['slices']) - n_p}",
                str(slowed),
                f"{rep['slo_attainment']:.0%}",
                f"{rep['ttft_p50_s'] * 1000:.0f} / {rep['ttft_p99_s'] * 1000:.0f}",
                f"{rep['tpot_p99_s'] * 1000:.1f}",
                r["layer"] if rep["slo_met"] is False else "SLO met",
            ]
        )
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip() for t in table]
    notes = [f"{r['config']}: {r['verdict']}" for r in rows if r.get("report") and not r["report"]["slo_met"]]
    return f"placement case {case.name}: {case.summary}\n\n" + "\n".join([*lines, "", *notes]).rstrip() + "\n"


def run(args: argparse.Namespace) -> int:
    if args.prometheus is not None:
        from vgpu_cli import validate_live

        return validate_live.run(args)
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.name:18} planted: {s.planted:13} {s.summary}")
        for c in PLACEMENT_CASES.values():
            print(f"{c.name:18} --placement         {c.summary}")
        return EXIT_OK
    if args.placement is not None:
        if args.placement not in PLACEMENT_CASES:
            raise CliError(f"--placement {args.placement!r} is unknown; bundled: {', '.join(PLACEMENT_CASES)}")
        case = PLACEMENT_CASES[args.placement]
        rows = compare_placements(case, PerfParams(layerwise_kv=args.layerwise_kv))
        if args.json:
            print(json.dumps({"case": case.name, "rows": rows}, indent=1))
        else:
            print(render_placements(case, rows), end="")
        return EXIT_OK
    if args.cluster is not None and args.deployment is None:
        raise CliError("--cluster needs --deployment PODS.yaml (the pods to place on it)")
    if args.deployment is not None:
        from vgpu_cli import validate_deploy

        s = _scenario(argparse.Namespace(**{**vars(args), "scenario": args.scenario or "healthy"}))
        requests = load_trace(args.trace) if args.trace else generate(s.workload, s.seed)
        return validate_deploy.run(args, s, requests)
    if args.scenario is None:
        raise CliError(f"name a scenario ({', '.join(SCENARIOS)}) or use --list")
    s = _scenario(args)
    requests = load_trace(args.trace) if args.trace else generate(s.workload, s.seed)
    if args.write_trace:
        Path(args.write_trace).write_text(traces.dump_jsonl(requests))
        print(f"wrote {len(requests)} requests to {args.write_trace}")
        return EXIT_OK
    params = PerfParams(layerwise_kv=args.layerwise_kv)
    start = time.process_time()
    rep, verdict = diagnose(s.pool, requests, s.policy, s.slos, params)
    cpu = time.process_time() - start
    if args.json:
        print(json.dumps({**as_json(s, rep, verdict), "cpuSeconds": round(cpu, 3)}, indent=1))
    else:
        print(render(s, rep, verdict), end="")
    if args.plot:
        plot(rep, verdict, args.plot)
    return EXIT_OK if rep.slo_met else EXIT_FAILED
