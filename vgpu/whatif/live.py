"""The layered report from a live cluster: what Prometheus holds over a window, turned into the same
`Report` the simulation gives, so one set of verdict rules (`vgpu.whatif.verdict.judge`) serves both. Pure:
the adapter (vgpu_cli.validate_live) queries Prometheus and hands the results here.

Measured (from the serving engine's and the router's metrics): TTFT and TPOT distributions and SLO
attainment, the offered rate and mean lengths, queue waits, prefill busy share, decode KV use, waiting
while a peer was idle (from the waiting/running gauges sampled at each step), prefix hit rate, KV
transfer time. Modelled (from the slices our metrics describe, `vgpu/perf/` formulas): the prefill and
decode capacity behind the loads. Not measurable from metrics: the oracle router's hit rate; it comes
from a trace of the window's requests when one is given (`oracle_hit_rate`), else it is NaN and the
cache rule cannot fire.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from vgpu.perf.params import GpuSpec, ModelSpec, PerfParams
from vgpu.whatif.deployment import Instance, Pool, Role
from vgpu.whatif.report import Report, Slos, loads
from vgpu.whatif.sim import PrefixCache
from vgpu.whatif.workload import Request

Engine = Literal["vllm", "sglang"]

# Metric names per engine. vLLM: vllm/v1/metrics/loggers.py (vllm-project/vllm, commit 005a810b, the 0.10
# line): num_requests_running/_waiting gauges; kv_cache_usage_perc (gpu_cache_usage_perc kept as the
# deprecated alias "DEPRECATED: Use vllm:kv_cache_usage_perc instead"); prefix_cache_queries/_hits counters
# in tokens ("Deprecated in 0.9 - Renamed as vllm:prefix_cache_hits", formerly gpu_prefix_cache_*);
# time_to_first_token_seconds; time_per_output_token_seconds observed per token (later deprecated for
# inter_token_latency_seconds, next to the per-request request_time_per_output_token_seconds that we use,
# falling back to the per-token one); request_queue_time_seconds; request_prompt_tokens and
# request_generation_tokens histograms. KV transfer: vllm:nixl_xfer_time_seconds (NixlPromMetrics of
# the NIXL connector). SGLang: sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage,
# sglang:cached_tokens_total over sglang:prompt_tokens_total, sglang:time_to_first_token_seconds,
# sglang:inter_token_latency_seconds, sglang:queue_time_seconds (its metrics collector, as scraped by its
# users; no per-request TPOT histogram). Router: gateway-api-inference-extension's
# inference_objective_request_total (requests arriving at the endpoint picker, pkg/epp/metrics).
NAMES: dict[Engine, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "ttft": ("vllm:time_to_first_token_seconds",),
        "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
        "queue": ("vllm:request_queue_time_seconds",),
        "kv_xfer": ("vllm:nixl_xfer_time_seconds",),
        "prompt": ("vllm:request_prompt_tokens",),
        "output": ("vllm:request_generation_tokens",),
    },
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "prefix_queries": ("sglang:prompt_tokens_total",),
        "prefix_hits": ("sglang:cached_tokens_total",),
        "ttft": ("sglang:time_to_first_token_seconds",),
        "tpot": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "queue": ("sglang:queue_time_seconds",),
        "kv_xfer": (),
        "prompt": (),
        "output": (),
    },
}
ROUTER_REQUESTS = "inference_objective_request_total"
# The endpoint picker's end-to-end TTFT histogram (listed in llm-d's monitoring docs among the EPP's request
# histograms). Preferred over the engine's: under P/D the decode pod's vLLM counts from when the routing
# sidecar hands it the request, after the prefill pod is done, so its TTFT misses the prefill part.
ROUTER_TTFT = "inference_extension_request_ttft_duration_seconds"
# Our slice metrics (docs/telemetry.md), labels pod, role, Hostname, UUID.
SLICE_SM = "vgpu_slice_cores_quota_ratio"
SLICE_MEMORY = "vgpu_slice_memory_limit_bytes"
# vLLM's bucket bounds (loggers.py above), used by the replay exporters of the tests.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
KV_ROOM = 0.9  # a decode peer with KV use below this and nothing waiting could have taken the request


@dataclass(frozen=True, slots=True)
class Histogram:
    """Increase over the window of one histogram, summed over pods: cumulative counts per upper bound
    (`+Inf` last), sum and count."""

    buckets: tuple[tuple[float, float], ...] = ()
    sum: float = 0.0
    count: float = 0.0

    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear inside the bucket, the last finite bound past it."""
        if not self.buckets or self.buckets[-1][1] <= 0:
            return math.nan
        rank = q * self.buckets[-1][1]
        lower, below = 0.0, 0.0
        for upper, cum in self.buckets:
            if cum >= rank:
                if math.isinf(upper):
                    return lower
                return lower + (upper - lower) * ((rank - below) / (cum - below) if cum > below else 0.0)
            lower, below = upper, cum
        return lower

    def share_within(self, x: float) -> float:
        """Share of observations <= x, linear inside the bucket holding x."""
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0:
            return math.nan
        lower, below = 0.0, 0.0
        for upper, cum in self.buckets:
            if x <= upper:
                if math.isinf(upper):
                    return below / total
                return (below + (cum - below) * (x - lower) / (upper - lower)) / total
            lower, below = upper, cum
        return 1.0


@dataclass(frozen=True, slots=True)
class Slice:
    """One serving pod as our slice metrics describe it."""

    pod: str
    role: Role
    sm_share: float  # 0 = best effort: counted as the whole GPU
    memory_gb: float
    gpu: str
    node: str


@dataclass(frozen=True, slots=True)
class Window:
    """What Prometheus holds for one model pool over `seconds`. Histograms are per role (summed over the
    role's pods); gauges are per pod, sampled at the same steps."""

    seconds: float
    arrivals: float  # router's requests over the window; NaN: unknown, the completions are used
    ttft: Histogram
    tpot: Histogram
    prefill_queue: Histogram
    decode_queue: Histogram
    kv_xfer: Histogram
    prompt_tokens: Histogram
    output_tokens: Histogram
    prefix_queries: float
    prefix_hits: float
    running: Mapping[str, Sequence[float]] = field(default_factory=dict)
    waiting: Mapping[str, Sequence[float]] = field(default_factory=dict)
    kv_usage: Mapping[str, Sequence[float]] = field(default_factory=dict)


def pool_from_slices(model: ModelSpec, gpu: GpuSpec, slices: Sequence[Slice]) -> Pool:
    """The pool the capacity model needs; every node is taken as one rack (racks are not in the metrics)."""
    inst = tuple(
        Instance(s.pod, s.role, s.sm_share if 0 < s.sm_share <= 1 else 1.0, s.memory_gb, s.gpu, s.node, "cluster")
        for s in sorted(slices, key=lambda s: (s.role != "prefill", s.pod))
    )
    pool = Pool(model, gpu, inst)
    pool.check()
    return pool


def oracle_hit_rate(requests: Sequence[Request], cache_tokens: int) -> float:
    """Hit rate of one LRU as large as all prefill caches together, fed in arrival order (the simulation's
    oracle router), from a trace of the window's requests."""
    cache = PrefixCache(cache_tokens)
    hits = prompt = 0
    for r in requests:
        hits += cache.match(r.prefixes)
        cache.insert(r.prefixes, r.key, r.prompt)
        prompt += r.prompt
    return hits / prompt if prompt else math.nan


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def peer_idle_share(pool: Pool, w: Window) -> float:
    """Share of the sampled waiting done on a pod while a peer of its role was idle (prefill: nothing
    running or waiting) or had KV room (decode: nothing waiting, KV use below KV_ROOM)."""
    idle_wait = total = 0.0
    for role in ("prefill", "decode"):
        pods = [i.name for i in pool.role(role) if i.name in w.waiting]
        steps = min((len(w.waiting[p]) for p in pods), default=0)
        for t in range(steps):
            free = {
                p
                for p in pods
                if w.waiting[p][t] == 0
                and (
                    (w.running.get(p, [0.0] * steps)[t] == 0)
                    if role == "prefill"
                    else (w.kv_usage.get(p, [1.0] * steps)[t] < KV_ROOM)
                )
            }
            for p in pods:
                q = w.waiting[p][t]
                total += q
                if q > 0 and free - {p}:
                    idle_wait += q
    return idle_wait / total if total > 0 else 0.0


def build(pool: Pool, w: Window, slos: Slos, params: PerfParams, oracle: float = math.nan) -> Report:
    """The Report of the simulation, each field measured over the window where metrics give it."""
    slos.check()
    n = w.ttft.count
    rate = (w.arrivals if not math.isnan(w.arrivals) else n) / w.seconds if w.seconds > 0 else 0.0
    mean_prompt, mean_output = w.prompt_tokens.mean(), w.output_tokens.mean()
    hit = w.prefix_hits / w.prefix_queries if w.prefix_queries > 0 else 0.0
    counted_at = oracle if not math.isnan(oracle) else hit  # without an oracle: the achieved hit rate
    if math.isnan(mean_prompt) or math.isnan(mean_output):
        p_load = d_load = math.nan
    else:
        p_load, d_load = loads(pool, rate, mean_prompt, mean_output, counted_at, slos, params)
    ttft_ok, tpot_ok = w.ttft.share_within(slos.ttft_s), w.tpot.share_within(slos.tpot_s)
    both = min(ttft_ok, tpot_ok)  # per-request pairs are not in the metrics: an upper bound
    prefills = [i.name for i in pool.role("prefill")]
    decodes = [i.name for i in pool.role("decode")]
    busy = max((_mean([min(1.0, x) for x in w.running.get(p, [])]) for p in prefills), default=0.0)
    kv_mean = max((_mean(w.kv_usage.get(p, [])) for p in decodes), default=0.0)
    kv_peak = max((max(w.kv_usage.get(p, [0.0]), default=0.0) for p in decodes), default=0.0)
    ttft_sum = w.ttft.sum or 1.0
    return Report(
        requests=round(n),
        prefill_instances=len(prefills),
        decode_instances=len(decodes),
        ttft_p50_s=w.ttft.quantile(0.5),
        ttft_p99_s=w.ttft.quantile(0.99),
        tpot_p50_s=w.tpot.quantile(0.5),
        tpot_p99_s=w.tpot.quantile(0.99),
        ttft_attainment=ttft_ok,
        tpot_attainment=tpot_ok,
        slo_attainment=both,
        slo_met=both >= slos.target,
        offered_rps=rate,
        prefill_load=p_load,
        decode_load=d_load,
        prefill_busy_max=busy,
        decode_kv_mean=kv_mean,
        decode_kv_peak=kv_peak,
        prefill_wait_mean_s=w.prefill_queue.mean(),
        prefill_wait_p99_s=w.prefill_queue.quantile(0.99),
        decode_wait_mean_s=w.decode_queue.mean(),
        decode_wait_p99_s=w.decode_queue.quantile(0.99),
        wait_peer_idle_share=peer_idle_share(pool, w),
        hit_rate=hit,
        oracle_hit_rate=oracle,
        kv_share_of_ttft=w.kv_xfer.sum / ttft_sum if w.kv_xfer.count else 0.0,
        kv_mean_s=w.kv_xfer.mean() if w.kv_xfer.count else 0.0,
    )
