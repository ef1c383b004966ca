"""Resumable openb replays: one JSON per (trace, policy, mode, seed), then a table of mean ± sd at chosen x.

    python benchmarks/openb_runs.py run --trace default --policy fgd --policy bestfit --seeds 42-51
    python benchmarks/openb_runs.py table --x 95,100,130
    python benchmarks/openb_runs.py compare --policy default --base fgd --seeds 42-51  # paired, per trace
    python benchmarks/openb_runs.py run --trace default --policy default --percentage 0 --percentage 10  # kube's window
    python benchmarks/openb_runs.py plot --trace default --out docs/img/openb_default.png [--json FILE]
    python benchmarks/openb_runs.py export --out docs/img/openb_runs.json   # every run, one list
    python benchmarks/openb_runs.py import --json docs/img/openb_runs.json  # seed the dir with those runs

Each finished run is written at once under `--dir` (default benchmarks/results/runs), and a run whose
file exists is skipped, so a long campaign on a shared machine can be stopped and resumed without losing
work. `vgpu replay` stays the user-facing command; this is the campaign tool behind docs/packing.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from vgpu.replay import engine, metric, trace
from vgpu_cli.replay import _read_csv, parse_seeds
from vgpu_cli.replay import plot as plot_curves

DATA = Path(__file__).parent / "data" / "openb"
RUNS = Path(__file__).parent / "results" / "runs"


def _path(out: Path, trace_name: str, policy: str, mode: str, seed: int) -> Path:
    return out / f"{trace_name}__{policy}__{mode}__{seed}.json"


def mode_label(mode: str, percentage: int | None) -> str:
    """The run's mode as its file and its table name it: `best`, or `best@p0` for kube-scheduler's window at
    percentageOfNodesToScore 0 (adaptive), `best@p10` at 10 %."""
    return mode if percentage is None else f"{mode}@p{percentage}"


def trace_label(trace_name: str, scale: int) -> str:
    """`default`, or `default-x4` for the cluster four times over (the protocol then inflates to 130 % of that)."""
    return trace_name if scale == 1 else f"{trace_name}-x{scale}"


def scaled(nodes: list[trace.NodeRow], scale: int) -> list[trace.NodeRow]:
    """The openb cluster `scale` times over, each copy's nodes named apart: a bigger cluster of the same mix, for
    what kube-scheduler's node sampling does where its adaptive percentage is lower (10 % at 5,000 nodes)."""
    if scale == 1:
        return nodes
    return [dataclasses.replace(n, name=f"{n.name}-{k}") for k in range(scale) for n in nodes]


def _one(job: tuple[str, str, engine.Mode, int, str, int | None, int]) -> str:
    trace_name, policy, mode, seed, out, percentage, scale = job
    nodes = scaled(trace.parse_nodes(_read_csv(str(DATA / "openb_node_list_gpu_node.csv"))), scale)
    pods = trace.parse_pods(_read_csv(str(DATA / f"openb_pod_list_{trace_name}.csv")))
    r = engine.replay(nodes, pods, policy, seed, mode=mode, percentage=percentage)
    curve = metric.unallocated_curve(r.arrived, r.allocated, r.capacity_milli)
    label = mode_label(mode, percentage)
    trace_name = trace_label(trace_name, scale)
    doc = {
        "trace": trace_name,
        "policy": policy,
        "mode": label,
        "seed": seed,
        "pods": r.pods,
        "failed": r.failed,
        "seconds": round(r.wall_seconds, 2),
        "names_per_pod": round(r.names_per_pod, 1),
        "unallocated_pct": {str(x): round(v, 4) for x, v in curve.items()},
    }
    target = _path(Path(out), trace_name, policy, label, seed)
    target.write_text(json.dumps(doc) + "\n")
    u = curve.get(100)
    return (
        f"{trace_name} {policy} {label} seed {seed}: {u if u is None else round(u, 2)} "
        f"({r.wall_seconds:.0f} s, {r.names_per_pod:.0f} names a pod)"
    )


def run(args: argparse.Namespace) -> None:
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(args.seeds)
    percentages: list[int | None] = [None] if not args.percentage else [None if x < 0 else x for x in args.percentage]
    for x in percentages:
        if x is not None and (problem := engine.percentage_problem(x)):
            raise SystemExit(f"--percentage {x}: -1 (every node), or {problem}")
    if args.scale < 1:
        raise SystemExit(f"--scale {args.scale}: allowed 1 (the openb cluster) or more copies of it")
    jobs = [
        (t, p, m, s, str(out), x, args.scale)
        for s in seeds
        for t in args.trace
        for p in args.policy
        for m in args.mode or ["best"]
        for x in percentages
        if not _path(out, trace_label(t, args.scale), p, mode_label(m, x), s).exists()
    ]
    workers = max(1, min(2, args.workers, len(jobs)))
    if workers == 1:
        for j in jobs:
            print(_one(j), flush=True)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for line in pool.imap_unordered(_one, jobs, chunksize=1):
            print(line, flush=True)


def load(out: Path) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for f in sorted(out.glob("*.json")):
        doc = json.loads(f.read_text())
        groups[(doc["trace"], doc["policy"], doc["mode"])].append(doc)
    return groups


def table(args: argparse.Namespace) -> None:
    xs = [x.strip() for x in args.x.split(",")]
    print("| trace | policy | mode | seeds | " + " | ".join(f"x={x} mean ± sd" for x in xs) + " | s/run |")
    print("|---" * (5 + len(xs)) + "|")
    for (t, p, m), docs in sorted(load(Path(args.dir)).items()):
        docs.sort(key=lambda d: d["seed"])
        cells = []
        for x in xs:
            vals = [d["unallocated_pct"][x] for d in docs if x in d["unallocated_pct"]]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells.append(f"{statistics.fmean(vals):.2f} ± {sd:.2f}" if vals else "n/a")
        seeds = ",".join(str(d["seed"]) for d in docs)
        secs = statistics.fmean(d["seconds"] for d in docs)
        print(f"| {t} | {p} | {m} | {len(docs)} ({seeds}) | " + " | ".join(cells) + f" | {secs:.0f} |")


def paired(
    groups: dict[tuple[str, str, str], list[dict[str, Any]]],
    policy: str,
    base: str,
    *,
    mode: str = "best",
    x: str = "100",
    seeds: set[int] | None = None,
) -> list[dict[str, Any]]:
    """`policy` minus `base` at x, seed by seed, per trace that has both: single runs move by 0.1-0.3 point
    under any policy change, so only differences on the same seeds say which policy is better."""
    rows = []
    for trace_name in sorted({t for (t, _p, _m) in groups}):
        a = {d["seed"]: d for d in groups.get((trace_name, policy, mode), [])}
        b = {d["seed"]: d for d in groups.get((trace_name, base, mode), [])}
        common = sorted(
            s
            for s in a.keys() & b.keys()
            if (seeds is None or s in seeds) and x in a[s]["unallocated_pct"] and x in b[s]["unallocated_pct"]
        )
        if not common:
            continue
        diffs = [a[s]["unallocated_pct"][x] - b[s]["unallocated_pct"][x] for s in common]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        rows.append(
            {
                "trace": trace_name,
                "seeds": common,
                "diffs": diffs,
                "mean": statistics.fmean(diffs),
                "se": se,
                "lower": sum(d < -5e-4 for d in diffs),
                "higher": sum(d > 5e-4 for d in diffs),
            }
        )
    return rows


def compare(args: argparse.Namespace) -> None:
    groups = load(Path(args.dir))
    seeds = set(parse_seeds(args.seeds)) if args.seeds else None
    rows = paired(groups, args.policy, args.base, mode=args.mode, x=args.x, seeds=seeds)
    if not rows:
        have = sorted({p for (_t, p, m) in groups if m == args.mode})
        raise SystemExit(
            f"no seed has runs of both {args.policy!r} and {args.base!r} in mode {args.mode!r} at x = {args.x}"
            f" under {args.dir}; policies with runs in that mode: {', '.join(have) or 'none'}"
        )
    print(
        f"{args.policy} minus {args.base}, unallocated % at x = {args.x}, mode {args.mode} (negative: {args.policy} better)"
    )
    print("| trace | pairs | mean diff ± SE | lower / equal / higher | per seed |")
    print("|---|---|---|---|---|")
    for r in rows:
        n = len(r["diffs"])
        per = " ".join(f"{d:+.2f}" for d in r["diffs"])
        span = f"{n} ({r['seeds'][0]}-{r['seeds'][-1]})"
        print(
            f"| {r['trace']} | {span} | {r['mean']:+.3f} ± {r['se']:.3f} | "
            f"{r['lower']} / {n - r['lower'] - r['higher']} / {r['higher']} | {per} |"
        )


def plot(args: argparse.Namespace) -> None:
    """The `vgpu replay` summary (and plot) of every (policy, mode) run on one trace, best mode first."""
    results: list[dict[str, Any]] = []
    groups = load(Path(args.dir))
    for (t, p, m), docs in sorted(groups.items(), key=lambda kv: (kv[0][2] != "best", kv[0][1], kv[0][2])):
        if t != args.trace or (args.policy and p not in args.policy) or m not in (args.mode or ["best"]):
            continue
        if args.seeds:
            keep = set(parse_seeds(args.seeds))
            docs = [d for d in docs if d["seed"] in keep]
        if not docs:
            continue
        docs.sort(key=lambda d: d["seed"])
        curves = [{int(x): v for x, v in d["unallocated_pct"].items()} for d in docs]
        secs = sum(d["seconds"] for d in docs)
        results.append(
            {
                "policy": p,
                "mode": m,
                "seeds": [d["seed"] for d in docs],
                "run_seconds": [d["seconds"] for d in docs],
                "pods_per_second": round(sum(d["pods"] for d in docs) / secs, 1) if secs else None,
                "pods": [d["pods"] for d in docs],
                "failed": [d["failed"] for d in docs],
                "unallocated_pct": metric.summarize(curves),
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    seeds = sorted({int(s) for r in results for s in r["seeds"]})
    plot_curves(results, args.out, f"openb {args.trace} trace, seeds {seeds[0]}-{seeds[-1]}")


def export(args: argparse.Namespace) -> None:
    """Every run of the directory as one JSON list (the record behind docs/packing.md)."""
    docs = [d for group in load(Path(args.dir)).values() for d in group]
    docs.sort(key=lambda d: (d["trace"], d["policy"], d["mode"], d["seed"]))
    Path(args.out).write_text(json.dumps(docs, separators=(",", ":")) + "\n")
    print(f"{len(docs)} runs -> {args.out}")


def import_runs(args: argparse.Namespace) -> None:
    """Write the runs of an exported list into the directory, keeping any run already there."""
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    added = 0
    for d in json.loads(Path(args.json).read_text()):
        target = _path(out, d["trace"], d["policy"], d["mode"], d["seed"])
        if not target.exists():
            target.write_text(json.dumps(d) + "\n")
            added += 1
    print(f"{added} runs added to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    r = sub.add_parser("run")
    r.add_argument("--trace", action="append", required=True)
    r.add_argument("--policy", action="append", required=True)
    r.add_argument("--mode", action="append", choices=engine.MODES)
    r.add_argument("--seeds", default="42-51")
    r.add_argument("--workers", type=int, default=1)
    r.add_argument(
        "--percentage",
        action="append",
        type=int,
        help="kube-scheduler's percentageOfNodesToScore: the planner is asked per pod only about the nodes "
        "kube-scheduler would send (0: its adaptive default; -1: every node, the default); repeatable",
    )
    r.add_argument("--scale", type=int, default=1, help="the openb cluster this many times over (default 1)")
    r.add_argument("--dir", default=str(RUNS))
    r.set_defaults(func=run)
    t = sub.add_parser("table")
    t.add_argument("--x", default="100")
    t.add_argument("--dir", default=str(RUNS))
    t.set_defaults(func=table)
    c = sub.add_parser("compare", help="paired differences of two policies on the same seeds, per trace")
    c.add_argument("--policy", required=True, help="the policy under test")
    c.add_argument("--base", required=True, help="what it is compared against")
    c.add_argument("--mode", default="best", help="a mode of engine.MODES, or its window label (best@p0)")
    c.add_argument("--x", default="100", help="arrived workload %% to compare at (default 100)")
    c.add_argument("--seeds", help="only these seeds, e.g. 42-51 (default: every seed both have)")
    c.add_argument("--dir", default=str(RUNS))
    c.set_defaults(func=compare)
    g = sub.add_parser("plot")
    g.add_argument("--trace", default="default")
    g.add_argument("--policy", action="append")
    g.add_argument("--mode", action="append", choices=engine.MODES, help="modes to include (default: best)")
    g.add_argument("--out", required=True)
    g.add_argument("--json")
    g.add_argument("--seeds", help="only these seeds, e.g. 42-51 (default: every seed collected)")
    g.add_argument("--dir", default=str(RUNS))
    g.set_defaults(func=plot)
    e = sub.add_parser("export")
    e.add_argument("--out", required=True)
    e.add_argument("--dir", default=str(RUNS))
    e.set_defaults(func=export)
    i = sub.add_parser("import")
    i.add_argument("--json", required=True)
    i.add_argument("--dir", default=str(RUNS))
    i.set_defaults(func=import_runs)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
