"""`vgpu pd-bench`: role-aware P/D packing measured with the performance model (docs/pd-packing.md).

Generates llm-d-style P/D workloads (`vgpu.perf.workload`), plays them through the planner under each
compared configuration (`vgpu.perf.bench`), evaluates the model at every checkpoint for each s_sat and
prints a table; optionally writes JSON and a plot.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from vgpu.perf import bench
from vgpu.perf.params import PerfParams
from vgpu.perf.workload import generate
from vgpu_cli.common import EXIT_OK, CliError, Subparsers
from vgpu_cli.replay import parse_seeds

COLUMNS = (
    ("goodput_rps", "goodput", "{:.1f}"),
    ("vs_hami", "x hami", "{:.2f}"),
    ("ttft_attainment", "TTFT ok", "{:.1%}"),
    ("tpot_attainment", "TPOT ok", "{:.1%}"),
    ("pair_node", "P/D node", "{:.1%}"),
    ("pair_node_capacity", "P/D cap", "{:.1%}"),
    ("pairable", "pairable", "{:.1%}"),
    ("pair_gpu", "P/D gpu", "{:.1%}"),
    ("prefill_sm_oversubscribed", "SM over", "{:.1f}"),
    ("bw_overcommitted", "BW over", "{:.1f}"),
    ("gpus_used", "GPUs", "{:.1f}"),
    ("unallocated_pct", "unalloc", "{:.1f}%"),
)


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "pd-bench",
        help="compare role-aware P/D packing with HAMi, binpack, spread on a modelled llm-d workload",
        description=(
            "Plays generated llm-d prefill/decode deployments (scale-ups and -downs on 8-GPU H200 nodes) "
            "through the extender's planner under HAMi's defaults, plain binpack, plain spread, our packing "
            "policy without role rules and our default, then reports modelled goodput, SLO attainment, P/D "
            "pairing, SM/bandwidth oversubscription, GPUs used and unallocated share per s_sat."
        ),
    )
    p.add_argument("--seeds", default="42-46", help="workload seeds, e.g. 42-46 (default: %(default)s)")
    p.add_argument("--s-sat", default="0.2,0.35,0.5", help="decode saturation SM shares (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=8, help="8-GPU nodes, 4 per rack (default: %(default)s)")
    p.add_argument("--deployments", type=int, default=10, help="P/D deployments (default: %(default)s)")
    p.add_argument("--fill", type=float, default=0.6, help="initial demand / capacity (default: %(default)s)")
    p.add_argument("--layerwise-kv", action="store_true", help="model layer-wise KV transfer (5-8 ms visible)")
    p.add_argument("--out", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE", help="write a PNG plot (needs matplotlib)")
    p.set_defaults(func=run)


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--s-sat {text!r}: expected e.g. 0.2,0.35,0.5") from None


def measure(
    seeds: list[int], s_sats: list[float], params: PerfParams, *, nodes: int, deployments: int, fill: float
) -> dict[str, Any]:
    """Mean over seeds of every metric, per configuration and s_sat; goodput also as a ratio to HAMi's."""
    configs = bench.configs()
    per: dict[str, dict[float, list[dict[str, float]]]] = {c.name: {s: [] for s in s_sats} for c in configs}
    for seed in seeds:
        work = generate(seed, nodes=nodes, deployments=deployments, fill=fill)
        runs = {c.name: bench.run(work, c, seed, s_sats, params) for c in configs}
        for name, r in runs.items():
            for s in s_sats:
                row = dict(r.metrics[s])
                base = runs["hami"].metrics[s]["goodput_rps"]
                row["vs_hami"] = row["goodput_rps"] / base if base else float("inf")
                row["unallocated_pct"] = 100 * r.pending_share
                row["pending_pods"] = r.pending_pods
                per[name][s].append(row)
    out: dict[str, Any] = {"seeds": seeds, "params": {k: getattr(params, k) for k in params.__slots__}, "results": []}
    for c in configs:
        for s in s_sats:
            rows = per[c.name][s]
            mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
            out["results"].append(
                {"config": c.name, "note": c.note, "s_sat": s, **mean, "min_vs_hami": min(r["vs_hami"] for r in rows)}
            )
    return out


def render(data: dict[str, Any]) -> str:
    head = ["s_sat", "config", *(title for _, title, _ in COLUMNS)]
    lines = [head]
    for r in data["results"]:
        lines.append([f"{r['s_sat']:g}", r["config"], *(fmt.format(r[key]) for key, _, fmt in COLUMNS)])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in lines) + "\n"


def plot(data: dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib (pip install matplotlib)") from None
    rows = data["results"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    s_sats = sorted({r["s_sat"] for r in rows})
    panels = (
        ("goodput_rps", "goodput (req/s within SLO)"),
        ("pair_node", "P/D same-node pairing (all prefills)"),
        ("pair_node_capacity", "P/D pairing where capacity allows"),
        ("gpus_used", "GPUs used"),
        ("bw_overcommitted", "bandwidth-overcommitted GPUs"),
        ("prefill_sm_oversubscribed", "prefill GPUs with unpartitioned SMs"),
    )
    cols = 3
    fig, grid = plt.subplots(-(-len(panels) // cols), cols, figsize=(4.4 * cols, 3.2 * -(-len(panels) // cols)))
    axes = list(grid.flat)
    width = 0.8 / len(configs)
    for ax, (key, title) in zip(axes, panels, strict=False):
        for i, c in enumerate(configs):
            ys = [next(r[key] for r in rows if r["config"] == c and r["s_sat"] == s) for s in s_sats]
            ax.bar([j + i * width for j in range(len(s_sats))], ys, width, label=c)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(s_sats))], [f"s_sat={s:g}" for s in s_sats])
        ax.set_title(title, fontsize=10)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(configs), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    s_sats = _float_list(args.s_sat)
    if args.nodes < 1 or args.deployments < 1 or not 0 < args.fill <= 1:
        raise CliError("--nodes and --deployments must be >= 1, --fill in (0, 1]")
    params = PerfParams(layerwise_kv=args.layerwise_kv)
    start = time.monotonic()
    data = measure(seeds, s_sats, params, nodes=args.nodes, deployments=args.deployments, fill=args.fill)
    data["wall_seconds"] = round(time.monotonic() - start, 2)
    print(render(data), end="")
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    if args.plot:
        plot(data, args.plot)
    return EXIT_OK
