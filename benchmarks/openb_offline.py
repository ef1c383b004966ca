"""Offline reference for the openb replay: how much a packing that knows every arrival leaves unallocated.

    python benchmarks/openb_offline.py [--traces default gpushare60 ...] [--seeds 42-51] [--json]

For each seed, the arrivals of the replay protocol up to x = 100 (cumulative demand at most the cluster's GPU
capacity) are packed offline: whole-card pods on empty GPUs, shared slices largest first into the fullest GPU
they fit (best-fit decreasing); the idle GPU share is printed next to `default`'s recorded result
(docs/img/openb_runs.json). CPU, memory, GPU models and node boundaries are ignored, so this is a reference for
how much the sharing traces leave to placement, not a lower bound (best fit is not optimal: on gpushare100 the
online policy does better). docs/packing.md quotes it.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgpu.placement.gpushare import MILLI  # noqa: E402
from vgpu.replay import engine, trace  # noqa: E402
from vgpu.replay.protocol import arrivals  # noqa: E402
from vgpu.replay.trace import PodRow  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "openb"
RECORD = ROOT / "docs" / "img" / "openb_runs.json"
TRACES = ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100", "multigpu20", "multigpu30")


def offline_idle_pct(pods: Sequence[PodRow], capacity_milli: int) -> float:
    """Idle GPU % after packing `pods` (in arrival order, cut where demand would pass capacity) best-fit
    decreasing onto capacity_milli / 1000 GPUs; whole-card demand the empty GPUs cannot hold counts as idle too
    (it arrived but found no room)."""
    gpus = capacity_milli // MILLI
    taken, whole, shared = 0, 0, []
    for p in pods:
        if taken + p.gpu_demand_milli > capacity_milli:
            break
        taken += p.gpu_demand_milli
        if p.num_gpu and p.gpu_milli >= MILLI:
            whole += p.num_gpu
        elif p.num_gpu:
            shared.append(p.gpu_milli)
    holes: list[int] = []  # free milli of the GPUs holding slices, sorted
    for s in sorted(shared, reverse=True):
        i = bisect.bisect_left(holes, s)
        if i < len(holes):
            bisect.insort(holes, holes.pop(i) - s)
        else:
            bisect.insort(holes, MILLI - s)
    idle = sum(holes) / MILLI + max(0, gpus - len(holes) - whole)
    return 100 * idle / gpus


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=TRACES)
    ap.add_argument("--seeds", default="42-51", help="inclusive range, e.g. 42-51 (default)")
    ap.add_argument("--json", action="store_true", help="one JSON object per trace instead of a table")
    args = ap.parse_args(argv)
    seeds = _seeds(args.seeds)
    with (DATA / "openb_node_list_gpu_node.csv").open() as f:
        nodes = [n for n in trace.parse_nodes(csv.DictReader(f)) if n.gpus > 0]
    cap = engine.capacity_milli(nodes)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else []
    online = {
        (r["trace"], r["seed"]): r["unallocated_pct"]["100"]
        for r in record
        if r["policy"] == "default" and r["mode"] == "best"
    }
    if not args.json:
        print("| trace | offline best-fit decreasing (mean, min-max) | default (recorded) |")
        print("|---|---|---|")
    for name in args.traces:
        with (DATA / f"openb_pod_list_{name}.csv").open() as f:
            pods = trace.parse_pods(csv.DictReader(f))
        per_seed = [offline_idle_pct(arrivals(pods, s, cap), cap) for s in seeds]
        ours = [online[(name, s)] for s in seeds if (name, s) in online]
        mean = statistics.mean(per_seed)
        if args.json:
            print(json.dumps({"trace": name, "seeds": seeds, "offline_pct": per_seed, "default_pct": ours}))
        else:
            rec = f"{statistics.mean(ours):.2f} ({len(ours)} seeds)" if ours else "-"
            print(f"| {name} | {mean:.2f} ({min(per_seed):.2f}-{max(per_seed):.2f}) | {rec} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
