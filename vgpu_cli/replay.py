"""`vgpu replay`: the openb trace replay of the FGD paper (USENIX ATC'23) through our own planner.

Reads the CSVs, runs every (policy, mode, seed) in up to two worker processes, writes the JSON summary
and optionally the plot. The protocol, the mapping and the metric live in `vgpu.replay` (pure).
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgpu.placement import registry
from vgpu.replay import engine, metric, trace
from vgpu_cli.common import EXIT_OK, CliError, Subparsers

MAX_WORKERS = 2


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `42`, or a comma list of either."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise CliError(f"--seeds {text!r}: expected e.g. 42-51, 42 or 42,45") from None
    if not out:
        raise CliError("--seeds: no seed given")
    return out


def _read_csv(path: str) -> list[dict[str, str]]:
    try:
        with Path(path).open(newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None


def _job(
    args: tuple[list[trace.NodeRow], list[trace.PodRow], str, engine.Mode, int, int | None, int | None],
) -> engine.RunResult:
    nodes, pods, policy, mode, seed, limit, percentage = args
    return engine.replay(nodes, pods, policy, seed, mode=mode, pods_limit=limit, percentage=percentage)


def summarize(runs: Sequence[engine.RunResult], wall: float) -> dict[str, Any]:
    first = runs[0]
    curves = [metric.unallocated_curve(r.arrived, r.allocated, r.capacity_milli) for r in runs]
    pods = sum(r.pods for r in runs)
    cpu = sum(r.wall_seconds for r in runs)
    return {
        "policy": first.policy,
        "mode": first.mode,
        "seeds": [r.seed for r in runs],
        "wall_seconds": round(wall, 2),
        "run_seconds": [round(r.wall_seconds, 2) for r in runs],
        "pods_per_second": round(pods / cpu, 1) if cpu else None,
        "pods": [r.pods for r in runs],
        "failed": [r.failed for r in runs],
        "capacity_gpus": first.capacity_milli / trace.MILLI,
        "percentage_of_nodes_to_score": first.percentage,
        "names_per_pod": round(sum(r.names_per_pod for r in runs) / len(runs), 1),
        "unallocated_pct": metric.summarize(curves),
    }


def plot(results: Sequence[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(range(metric.X_MAX + 1))
    ax.plot(xs, [max(0, 100 - x) for x in xs], color="black", linestyle=":", linewidth=1, label="ideal")
    for res in results:
        pts = sorted((int(x), v) for x, v in res["unallocated_pct"].items())
        label = res["policy"] if res["mode"] == "best" else f"{res['policy']} ({res['mode']})"
        ax.plot([x for x, _ in pts], [v["median"] for _, v in pts], linewidth=1.4, label=label)
        ax.fill_between([x for x, _ in pts], [v["q1"] for _, v in pts], [v["q3"] for _, v in pts], alpha=0.2)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("unallocated GPU (%)")
    ax.set_title(title)
    ax.set_xlim(0, metric.X_MAX)
    ax.set_ylim(0, 100)
    inset = ax.inset_axes((0.52, 0.42, 0.45, 0.4))
    for line in ax.get_lines():
        inset.plot(line.get_xdata(), line.get_ydata(), color=line.get_color(), linestyle=line.get_linestyle())
    inset.set_xlim(85, metric.X_MAX)
    inset.set_ylim(0, 20)
    inset.grid(alpha=0.3)
    ax.legend(loc="upper right" if len(results) < 4 else "lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    policies: list[str] = args.policy or ["default"]
    unknown = [p for p in policies if p not in registry.names()]
    if unknown:
        raise CliError(f"unknown policy {unknown[0]!r}; known: {', '.join(registry.names())}")
    modes: list[engine.Mode] = args.mode or ["best"]
    seeds = parse_seeds(args.seeds)
    if args.pods_limit is not None and args.pods_limit < 1:
        raise CliError("--pods-limit must be >= 1")
    percentage = args.percentage_of_nodes_to_score
    if percentage is not None and (problem := engine.percentage_problem(percentage)):
        raise CliError(f"--percentage-of-nodes-to-score {percentage}: {problem}")
    try:
        nodes = trace.parse_nodes(_read_csv(args.nodes))
        pods = trace.parse_pods(_read_csv(args.pods))
    except (KeyError, ValueError) as exc:
        raise CliError(f"malformed trace: {exc}") from None
    if not any(n.gpus for n in nodes) or not pods:
        raise CliError("the node list has no GPU node or the pod list is empty")
    combos = [(p, m) for p in policies for m in modes]
    jobs = [(nodes, pods, p, m, s, args.pods_limit, percentage) for p, m in combos for s in seeds]
    workers = max(1, min(MAX_WORKERS, args.workers, len(jobs)))
    started = time.perf_counter()
    if workers == 1:
        runs = [_job(j) for j in jobs]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            runs = pool.map(_job, jobs, chunksize=1)
    wall = time.perf_counter() - started
    results = []
    for p, m in combos:
        mine = [r for r in runs if r.policy == p and r.mode == m]
        results.append(summarize(mine, wall))
    for res in results:
        at = res["unallocated_pct"].get("100")
        val = f"{at['mean']:.2f} ± {at['sd']:.2f} (median {at['median']:.2f})" if at else "n/a (x=100 not reached)"
        print(
            f"{res['policy']:>15} {res['mode']:>10}  unallocated@100%: {val}  "
            f"seeds {len(res['seeds'])}  {res['pods_per_second']} pods/s per core"
        )
    print(f"wall {wall:.1f} s with {workers} worker(s)")
    doc: Any = results[0] if len(results) == 1 else results
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot, f"{Path(args.pods).stem} on {Path(args.nodes).stem}, seeds {args.seeds}")
    return EXIT_OK


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay an openb trace (FGD paper protocol) and measure unallocated GPU per policy",
        description=(
            "Replays an Alibaba openb pod list onto an openb node list through the extender's own planner, "
            "following the FGD paper's protocol (shuffle per seed, inflate to 130%% of GPU capacity, failed "
            "pods dropped) and reports unallocated GPU %% against arrived workload %%. See docs/packing.md."
        ),
    )
    p.add_argument("--nodes", required=True, metavar="CSV", help="openb node list (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", required=True, metavar="CSV", help="openb pod list (gpu_spec optional)")
    p.add_argument("--policy", action="append", metavar="NAME", help="placement policy, repeatable (default: default)")
    p.add_argument(
        "--mode",
        action="append",
        choices=engine.MODES,
        help="how the node is picked: best fine score (default), kube-scheduler prioritize buckets, narrow filter",
    )
    p.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 (default), 42 or 42,45")
    p.add_argument("--pods-limit", type=int, metavar="N", help="stop after N arrivals (quick runs)")
    p.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        metavar="P",
        help="ask the planner only about the nodes kube-scheduler would send /filter with this "
        "percentageOfNodesToScore (0: its adaptive default); default: every node, as the paper",
    )
    p.add_argument("--workers", type=int, default=MAX_WORKERS, help="worker processes, at most 2 (default: 2)")
    p.add_argument("--out", metavar="FILE.json", help="write the summary: one object, or a list for several")
    p.add_argument("--plot", metavar="FILE.png", help="plot unallocated GPU %% vs arrived %% with the ideal line")
    p.set_defaults(func=run)
