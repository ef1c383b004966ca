"""Routing policies: which instance of a role gets a request. Pure functions of what a router sees.

- round-robin: the next instance in turn (a Kubernetes Service).
- load-aware: the fewest pending prompt tokens (prefill) or the lowest KV use (decode).
- prefix-aware: the instance holding the longest cached prefix, else load-aware (affinity only).
- llm-d: the weighted sum of llm-d's scorers, best score wins: prefix-cache-scorer 3, queue-scorer 2,
  kv-cache-utilization-scorer 2 (llm-d's inference-scheduling guide, EndpointPickerConfig of the
  well-lit path; scorer formulas from gateway-api-inference-extension's queue and kv-cache-utilization
  scorers: queue (max - q) / (max - min), kv 1 - usage, prefix matched share of the prompt).
Ties go to the first instance after a rotating start, as max-score-picker picks among ties at random.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Policy = Literal["round-robin", "load-aware", "prefix-aware", "llm-d"]
POLICIES: tuple[Policy, ...] = ("round-robin", "load-aware", "prefix-aware", "llm-d")
LLMD_WEIGHTS = {"prefix": 3.0, "queue": 2.0, "kv": 2.0}


def check(policy: str) -> Policy:
    if policy not in POLICIES:
        raise ValueError(f"routing policy {policy!r} is unknown; allowed: {', '.join(POLICIES)}")
    return policy


def _queue_scores(waiting: Sequence[float]) -> list[float]:
    hi, lo = max(waiting), min(waiting)
    if hi == lo:
        return [1.0] * len(waiting)
    return [(hi - q) / (hi - lo) for q in waiting]


def _best(scores: Sequence[float], start: int) -> int:
    n = len(scores)
    best = start % n
    for k in range(1, n):
        i = (start + k) % n
        if scores[i] > scores[best]:
            best = i
    return best


def pick(
    policy: Policy,
    turn: int,
    waiting: Sequence[float],
    load: Sequence[float],
    kv_util: Sequence[float],
    hit_share: Sequence[float] | None = None,
) -> int:
    """Index of the chosen instance. `turn` counts the router's decisions (round-robin and ties);
    `waiting` requests queued, `load` pending work (lower is better), `kv_util` KV use in 0..1,
    `hit_share` the share of the prompt each holds in its prefix cache (None for decode choices)."""
    n = len(waiting)
    if policy == "round-robin" or n == 1:
        return turn % n
    if policy == "prefix-aware" and hit_share is not None and max(hit_share) > 0:
        return _best(hit_share, turn)
    if policy in ("load-aware", "prefix-aware"):
        return _best([-x for x in load], turn)
    queue = _queue_scores(waiting)
    w = LLMD_WEIGHTS
    scores = [w["queue"] * queue[i] + w["kv"] * (1.0 - kv_util[i]) for i in range(n)]
    if hit_share is not None:
        scores = [s + w["prefix"] * h for s, h in zip(scores, hit_share, strict=True)]
    return _best(scores, turn)
