"""The layered report of one simulation: latency and SLO attainment, then allocation, queuing, cache
reuse and communication, each from numbers the others do not touch. Pure.

- allocation: offered load over capacity per role. Prefill capacity in tokens/s of all prefill slices,
  offered = the uncached tokens/s at the *oracle* hit rate (what no routing can avoid); decode capacity
  = the completion rate the decode slices sustain within the TPOT SLO (`vgpu.perf.model.decode_rate_within`
  at the trace's mean lengths and the KV-limited batch). Above 1, no routing fixes it.
  Slice saturation: the busiest prefill slice's busy share and the fullest decode slice's
  KV use (time-averaged and peak).
- queuing: mean and p99 waits (prefill queue, decode admission) and the share of waiting done while
  a peer instance of the same role sat idle (prefill) or had KV room (decode): imbalance, not shortage.
- cache: prompt tokens served from a prefix cache, against the oracle router's.
- communication: KV transfer time as a share of TTFT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from vgpu.perf import model as pm
from vgpu.perf.params import PerfParams
from vgpu.whatif.deployment import Pool
from vgpu.whatif.sim import SimResult, decode_bytes_per_s, kv_capacity_tokens, prefill_s_per_token
from vgpu.whatif.workload import Request, offered, percentile


@dataclass(frozen=True, slots=True)
class Slos:
    ttft_s: float
    tpot_s: float
    target: float = 0.9  # share of requests that must meet both

    def check(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and 0 < self.target <= 1):
            raise ValueError("SLOs need ttft_s > 0, tpot_s > 0 and a target share in (0, 1]")


@dataclass(frozen=True, slots=True)
class Report:
    requests: int
    prefill_instances: int
    decode_instances: int
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    ttft_attainment: float
    tpot_attainment: float
    slo_attainment: float
    slo_met: bool
    # allocation
    offered_rps: float
    prefill_load: float  # offered uncached tokens/s at the oracle hit rate / prefill capacity
    decode_load: float  # offered req/s / decode capacity within the TPOT SLO
    prefill_busy_max: float  # busiest prefill slice's busy share
    decode_kv_mean: float  # the fullest decode slice's time-averaged share of KV memory reserved
    decode_kv_peak: float  # highest share of a decode slice's KV memory reserved at once
    # queuing
    prefill_wait_mean_s: float
    prefill_wait_p99_s: float
    decode_wait_mean_s: float
    decode_wait_p99_s: float
    wait_peer_idle_share: float
    # cache
    hit_rate: float
    oracle_hit_rate: float
    # communication
    kv_share_of_ttft: float
    kv_mean_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def loads(
    pool: Pool, rate: float, mean_prompt: float, mean_output: float, hit: float, slos: Slos, params: PerfParams
) -> tuple[float, float]:
    """(prefill load, decode load): offered work over the slices' modelled capacity; `hit` is the prefix hit
    rate the prefill work is counted at. Shared by the simulated and the live (vgpu.whatif.live) report."""
    p_cap = sum(1.0 / prefill_s_per_token(pool, i, params) for i in pool.role("prefill"))
    p_load = rate * mean_prompt * (1.0 - hit) / p_cap
    mean_params = params.with_(prompt_tokens=max(1, round(mean_prompt)), output_tokens=max(1, round(mean_output)))
    d_cap = 0.0
    for i in pool.role("decode"):
        batch = int(kv_capacity_tokens(pool, i, params) / max(1.0, mean_prompt + mean_output))
        gb_s = decode_bytes_per_s(pool, i, params) / 1e9
        d_cap += pm.decode_rate_within(pool.model, gb_s, batch, slos.tpot_s, mean_params)
    return p_load, (rate / d_cap if d_cap else float("inf"))


def build(pool: Pool, requests: list[Request], result: SimResult, slos: Slos, params: PerfParams) -> Report:
    outs = result.outcomes
    n = len(outs)
    rate, mean_prompt, mean_output = offered(requests)
    prompt_tokens = sum(o.prompt for o in outs) or 1
    oracle = result.oracle_hit_tokens / prompt_tokens
    p_load, d_load = loads(pool, rate, mean_prompt, mean_output, oracle, slos, params)
    span = result.span_s or 1.0
    busy = {name: s / span for name, s in result.busy_s.items()}
    prefill_names = {i.name for i in pool.role("prefill")}
    ttft_ok = [o.ttft <= slos.ttft_s for o in outs]
    tpot_ok = [o.tpot <= slos.tpot_s for o in outs]
    both = sum(a and b for a, b in zip(ttft_ok, tpot_ok, strict=True)) / n if n else 0.0
    waits = [o.prefill_wait for o in outs]
    dwaits = [o.decode_wait for o in outs]
    total_wait = sum(waits) + sum(dwaits)
    ttft_sum = sum(o.ttft for o in outs) or 1.0
    return Report(
        requests=n,
        prefill_instances=len(prefill_names),
        decode_instances=len(pool.role("decode")),
        ttft_p50_s=percentile([o.ttft for o in outs], 0.5),
        ttft_p99_s=percentile([o.ttft for o in outs], 0.99),
        tpot_p50_s=percentile([o.tpot for o in outs], 0.5),
        tpot_p99_s=percentile([o.tpot for o in outs], 0.99),
        ttft_attainment=sum(ttft_ok) / n if n else 0.0,
        tpot_attainment=sum(tpot_ok) / n if n else 0.0,
        slo_attainment=both,
        slo_met=both >= slos.target,
        offered_rps=rate,
        prefill_load=p_load,
        decode_load=d_load,
        prefill_busy_max=max((b for k, b in busy.items() if k in prefill_names), default=0.0),
        decode_kv_mean=max(result.kv_mean.values(), default=0.0),
        decode_kv_peak=max(result.kv_peak.values(), default=0.0),
        prefill_wait_mean_s=sum(waits) / n if n else 0.0,
        prefill_wait_p99_s=percentile(waits, 0.99),
        decode_wait_mean_s=sum(dwaits) / n if n else 0.0,
        decode_wait_p99_s=percentile(dwaits, 0.99),
        wait_peer_idle_share=sum(o.wait_peer_idle for o in outs) / total_wait if total_wait > 0 else 0.0,
        hit_rate=sum(o.hit_tokens for o in outs) / prompt_tokens,
        oracle_hit_rate=oracle,
        kv_share_of_ttft=sum(o.kv_s for o in outs) / ttft_sum,
        kv_mean_s=sum(o.kv_s for o in outs) / n if n else 0.0,
    )
