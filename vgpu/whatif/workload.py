"""Request workloads with prefix structure: shared system prompts and multi-turn sessions. Pure.

A request's prompt may start with prefixes another request left in a prefill instance's cache: the
system prompt it shares with others, and in a multi-turn chat the previous turn's prompt (the KV of
the previous answer lives on the decode instance, not the prefill one, so only the prompt is reusable
there). `prefixes` lists them shortest first as (key, tokens including the shorter ones).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    arrival: float  # seconds from the start of the trace
    prompt: int  # tokens
    output: int  # tokens
    prefixes: tuple[tuple[str, int], ...]  # (cache key, tokens), shortest first; each <= prompt
    key: str  # the key this request's own prompt is cached under (the next turn's longest prefix)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A generated chat workload: sessions of `turns` (mean, geometric) turns arrive as a Poisson
    process so that requests arrive at `rate` per second; turns follow after `think_s` (mean, exponential)."""

    rate: float = 20.0
    duration_s: float = 120.0
    system_prompts: int = 8  # distinct shared system prompts
    system_tokens: int = 500
    user_tokens: int = 1000  # mean new tokens per turn (exponential, at least 16)
    output_tokens: int = 200  # mean output (exponential, at least 8)
    turns: float = 1.0  # mean turns per session (1 = single-turn requests)
    think_s: float = 10.0

    def check(self) -> None:
        """Raise ValueError naming the first field out of its allowed range."""
        for name, value, low in (
            ("rate", self.rate, 0.0),
            ("duration_s", self.duration_s, 0.0),
            ("user_tokens", self.user_tokens, 0),
            ("output_tokens", self.output_tokens, 0),
            ("think_s", self.think_s, 0.0),
        ):
            if not value > low:
                raise ValueError(f"workload {name} is {value}: must be > {low}")
        if self.system_prompts < 1 or self.system_tokens < 0 or self.turns < 1.0:
            raise ValueError("workload system_prompts must be >= 1, system_tokens >= 0, turns >= 1")


def _exp_int(rng: random.Random, mean: float, floor: int) -> int:
    return max(floor, int(rng.expovariate(1.0 / mean)))


def generate(spec: WorkloadSpec, seed: int) -> list[Request]:
    """Requests of `spec` sorted by arrival, ids in arrival order; the same seed gives the same trace."""
    spec.check()
    rng = random.Random(seed)
    session_rate = spec.rate / spec.turns
    p_more = 1.0 - 1.0 / spec.turns  # geometric number of turns with mean `turns`
    raw: list[tuple[float, int, int, tuple[tuple[str, int], ...], str]] = []
    t = 0.0
    session = 0
    while True:
        t += rng.expovariate(session_rate)
        if t >= spec.duration_s:
            break
        session += 1
        system = rng.randrange(spec.system_prompts)
        sys_key = f"sys{system}"
        prefixes: tuple[tuple[str, int], ...] = ((sys_key, spec.system_tokens),) if spec.system_tokens else ()
        history = spec.system_tokens
        at = t
        turn = 0
        while at < spec.duration_s:
            turn += 1
            prompt = history + _exp_int(rng, spec.user_tokens, 16)
            output = _exp_int(rng, spec.output_tokens, 8)
            key = f"s{session}t{turn}"
            raw.append((at, prompt, output, prefixes, key))
            if rng.random() >= p_more:
                break
            prefixes = (*prefixes[:1], (key, prompt))
            history = prompt + output
            at += rng.expovariate(1.0 / spec.think_s)
    raw.sort(key=lambda r: r[0])
    return [Request(i, a, p, o, pre, k) for i, (a, p, o, pre, k) in enumerate(raw)]


def offered(requests: list[Request]) -> tuple[float, float, float]:
    """(requests/s, mean prompt tokens, mean output tokens) of a trace."""
    if not requests:
        return 0.0, 0.0, 0.0
    span = max(requests[-1].arrival - requests[0].arrival, 1e-9)
    n = len(requests)
    return n / span, sum(r.prompt for r in requests) / n, sum(r.output for r in requests) / n


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank method; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
