"""The paper's replay protocol: per-seed shuffle, inflation to 130 % of GPU capacity, node tie-break order."""

from __future__ import annotations

import random
from collections.abc import Sequence

from vgpu.replay.trace import PodRow

INFLATE_TO = 1.3


def arrivals(pods: Sequence[PodRow], seed: int, capacity_milli: int, inflate_to: float = INFLATE_TO) -> list[PodRow]:
    """The arrival sequence of one seed.

    Pods sorted by name are shuffled with `seed`; then pods drawn uniformly with replacement from the
    original (name-sorted) list are appended until cumulative GPU demand reaches `inflate_to` x capacity.
    The original pods are always all kept, even when they alone exceed the target.
    """
    rng = random.Random(seed)
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    rng.shuffle(order)
    target = inflate_to * capacity_milli
    demand = sum(p.gpu_demand_milli for p in order)
    if demand < target and not any(p.gpu_demand_milli for p in base):
        raise ValueError("the trace asks for no GPU at all: inflation would never stop")
    while demand < target:
        extra = base[rng.randrange(len(base))]
        order.append(extra)
        demand += extra.gpu_demand_milli
    return order


def node_order(names: Sequence[str], seed: int) -> list[str]:
    """A fixed random node order per seed; ties in score go to the node that comes first."""
    order = sorted(names)
    random.Random(f"nodes-{seed}").shuffle(order)
    return order
