"""The performance formulas: prefill time from SM share, decode step time from bandwidth share, KV transfer
by link, and the highest request rate a replica serves within its SLO. Pure functions of numbers.

Prefill is compute-bound: time = FLOPs / (peak x MFU x SM share) (DistServe appendix A: linear in SMs).
Decode is bandwidth-bound: a step reads the weights and the batch's KV once; at SM share s it reaches
beta = min(1, s / s_sat) of its full speed, and it demands `decode_mbu x beta` of the GPU's bandwidth,
which co-resident decodes share (MPS/green contexts partition SMs, not bandwidth).
"""

from __future__ import annotations

from vgpu.perf.params import KIB, LINK_GB_S, GpuSpec, Link, ModelSpec, PerfParams


def beta(sm_share: float, s_sat: float) -> float:
    """Share of full decode speed reached with this share of SMs."""
    return min(1.0, max(sm_share, 0.0) / s_sat)


def decode_demand(sm_share: float, params: PerfParams) -> float:
    """Share of the GPU's memory bandwidth one decode slice consumes when it runs alone."""
    return params.decode_mbu * beta(sm_share, params.s_sat)


def prefill_seconds(model: ModelSpec, gpu: GpuSpec, sm_share: float, params: PerfParams, *, tp: int = 1) -> float:
    """Time to prefill one prompt on `tp` slices of `sm_share` each (2 FLOPs per parameter per token)."""
    flops = 2.0 * model.params_b * 1e9 * params.prompt_tokens
    peak = (gpu.fp8_tflops if model.fp8 else gpu.bf16_tflops) * 1e12
    return flops / (peak * params.prefill_mfu * max(sm_share, 1e-6) * tp)


def kv_bytes_per_seq(model: ModelSpec, tokens: int) -> float:
    return tokens * model.kv_kib_per_token * KIB


def kv_transfer_seconds(model: ModelSpec, gpu: GpuSpec, link: Link, params: PerfParams) -> float:
    """Visible time to move one prompt's KV from prefill to decode over `link`."""
    size = kv_bytes_per_seq(model, params.prompt_tokens)
    gb_s = gpu.hbm_gb_s if link == "same-gpu" else LINK_GB_S[link]
    full = size / (gb_s * 1e9)
    return min(full, params.layerwise_visible_s) if params.layerwise_kv else full


def kv_batch_limit(model: ModelSpec, slice_gb: float, tp: int, params: PerfParams) -> int:
    """Concurrent sequences whose KV fits the decode slices (weights and activation reserve taken out)."""
    free = slice_gb * tp * (1.0 - params.activation_reserve) - model.weights_gb
    per_seq = kv_bytes_per_seq(model, params.prompt_tokens + params.output_tokens // 2) / 1e9
    return max(0, int(free / per_seq))


def decode_step_seconds(model: ModelSpec, batch: float, effective_gb_s: float, params: PerfParams) -> float:
    """One decode step: the weights and the batch's KV (mean context) read at `effective_gb_s`."""
    per_seq = kv_bytes_per_seq(model, params.prompt_tokens + params.output_tokens // 2)
    return (model.weights_gb * 1e9 + batch * per_seq) / (effective_gb_s * 1e9)


def prefill_rate_within(service_s: float, kv_s: float, slo_s: float) -> float:
    """Highest arrival rate (req/s) at which the mean TTFT of an M/D/1 prefill queue meets the SLO.

    TTFT = wait + service + KV transfer, with wait = rho * service / (2 (1 - rho)).
    """
    slack = slo_s - service_s - kv_s
    if slack <= 0:
        return 0.0
    rho = 2 * slack / (service_s + 2 * slack)
    return rho / service_s


def decode_rate_within(
    model: ModelSpec, effective_gb_s: float, batch_limit: int, tpot_slo_s: float, params: PerfParams
) -> float:
    """Highest completion rate (req/s) of a decode replica whose step time stays within the TPOT SLO."""
    per_seq = kv_bytes_per_seq(model, params.prompt_tokens + params.output_tokens // 2)
    by_slo = (tpot_slo_s * effective_gb_s * 1e9 - model.weights_gb * 1e9) / per_seq
    batch = min(float(batch_limit), by_slo)
    if batch < 1.0:
        return 0.0
    return batch / (params.output_tokens * decode_step_seconds(model, batch, effective_gb_s, params))
