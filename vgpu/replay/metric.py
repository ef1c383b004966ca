"""The paper's metric: unallocated GPU % against arrived workload % (of cluster GPU capacity)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

X_MAX = 130


def unallocated_curve(
    arrived: Sequence[int], allocated: Sequence[int], capacity_milli: int, x_max: int = X_MAX
) -> dict[int, float]:
    """`unallocated(x) = 100 - mean(100 * allocated / capacity)` over the events (one per arrived pod,
    failed ones included) whose `round(100 * arrived / capacity) == x`; x without events is absent."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for arr, alloc in zip(arrived, allocated, strict=True):
        x = round(100 * arr / capacity_milli)
        if 0 <= x <= x_max:
            sums[x] = sums.get(x, 0.0) + 100 * alloc / capacity_milli
            counts[x] = counts.get(x, 0) + 1
    return {x: 100 - sums[x] / counts[x] for x in sorted(sums)}


def summarize(curves: Sequence[dict[int, float]], x_max: int = X_MAX) -> dict[str, dict[str, object]]:
    """Per x (as a string, for JSON): median, mean, sd, quartiles and the per-seed values over seeds."""
    out: dict[str, dict[str, object]] = {}
    for x in range(x_max + 1):
        vals = [c[x] for c in curves if x in c]
        if not vals:
            continue
        q = statistics.quantiles(vals, n=4, method="inclusive") if len(vals) > 1 else [vals[0]] * 3
        out[str(x)] = {
            "median": statistics.median(vals),
            "mean": statistics.fmean(vals),
            "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "q1": q[0],
            "q3": q[2],
            "per_seed": vals,
        }
    return out
