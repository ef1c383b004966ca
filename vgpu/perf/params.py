"""Every constant of the P/D performance model, with its source and the knob that varies it.

Nothing here is tuned to make a policy look good: values come from datasheets and the papers named next
to them (docs/pd-packing.md lists them with the sensitivity each one has). `PerfParams` holds the knobs a
run may vary; `GPUS` and `MODELS` are the hardware and model catalogues.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

GIB = 1024**3
KIB = 1024


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak numbers of one card (dense, no sparsity)."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_gb_s: float
    memory_gib: float


# NVIDIA H200 SXM datasheet: 989 TFLOPS bf16 dense, 1,979 fp8 dense, 4.8 TB/s HBM3e, 141 GB.
H200 = GpuSpec("H200", bf16_tflops=989.0, fp8_tflops=1979.0, hbm_gb_s=4800.0, memory_gib=141e9 / GIB)
# NVIDIA H100 SXM datasheet: 989 / 1,979 TFLOPS, 3.35 TB/s HBM3, 80 GB.
H100 = GpuSpec("H100", bf16_tflops=989.0, fp8_tflops=1979.0, hbm_gb_s=3350.0, memory_gib=80.0)
GPUS = {g.name: g for g in (H200, H100)}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A served model: parameters, bytes per weight and KV bytes per token.

    KV per token (bf16) = layers * KV heads * head dim * 2 (K and V) * 2 bytes, from each model's config.

    SLOs are not fixed per model but derived from each deployment's isolated latency (`slo_scale`).
    """

    name: str
    params_b: float
    weight_bytes: float  # per parameter: 2 for bf16, 1 for fp8
    kv_kib_per_token: float

    @property
    def weights_gb(self) -> float:
        return self.params_b * self.weight_bytes

    @property
    def fp8(self) -> bool:
        return self.weight_bytes <= 1.0


MODELS = {
    m.name: m
    for m in (
        ModelSpec("llama-8b", 8.0, 2.0, 128.0),
        ModelSpec("qwen-14b", 14.8, 2.0, 192.0),
        ModelSpec("qwen-32b", 32.8, 2.0, 256.0),
        ModelSpec("llama-70b-fp8", 70.6, 1.0, 320.0),
    )
}

Link = Literal["same-gpu", "nvlink", "pcie", "rack", "cross-rack"]

# Effective link bandwidths in GB/s (docs/pd-packing.md, Performance model): NVLink4 ~300 effective, PCIe5 x16 ~50, 400G RDMA ~50 line
# rate (inside a rack), 200G ~25 (across racks, where the spine halves it). Same GPU: the KV stays in
# HBM and is handed over (vLLM's IPC / CUDA VMM sharing), so only a copy at HBM speed remains.
LINK_GB_S: dict[Link, float] = {"nvlink": 300.0, "pcie": 50.0, "rack": 50.0, "cross-rack": 25.0}


@dataclass(frozen=True, slots=True)
class PerfParams:
    """The knobs of the model; defaults are the sources' central values."""

    # Decode speed saturates at this SM share (MuxServe ICML'24 ~0.3; MuxWise/Drift: the fewest SMs that
    # meet the SLO); the sources span 0.2-0.5. beta = min(1, s / s_sat).
    s_sat: float = 0.35
    # Memory-bandwidth utilisation of one decode alone. Two vLLM processes under MPS on one A100 took
    # +19.5 % time per output token, TetriInfer's decode+decode +23 % latency: if each demands u of the
    # bandwidth, 2u - 1 = 0.2 gives u ~ 0.6 (also the ~60 % MBU commonly measured for vLLM decode).
    decode_mbu: float = 0.6
    # Model FLOPs utilisation of a 4k-token prefill on the SMs it owns; throughput linear in SM share
    # (DistServe appendix A). 0.5 is the usual measured range (0.4-0.6); calibrate_gpu.py measures it.
    prefill_mfu: float = 0.5
    # A busy prefill on the same GPU slows a decode by 20-30 % even with SM partitioning (MuxWise),
    # scaled by the prefill's utilisation.
    prefill_corun_penalty: float = 0.25
    # A GPU holding a prefill whose SMs are NOT partitioned (a best-effort neighbour or more than 100 %
    # reserved): DistServe Fig. 1 measures colocated serving at about half the goodput of disaggregated
    # (1.6 vs 3.3 req/s/GPU); TetriInfer up to 5x. Both prefill and decode on it run this much slower.
    unpartitioned_slowdown: float = 2.0
    # vLLM's NIXL connector pulls KV blocks after the prefill finished, so the whole transfer is
    # visible. With layer-wise transfer (Splitwise ISCA'24) only ~5-8 ms stays visible.
    layerwise_kv: bool = False
    layerwise_visible_s: float = 0.0065
    # Workload: prompt and output lengths (llm-d's P/D guides benchmark long prompts).
    prompt_tokens: int = 4096
    output_tokens: int = 256
    # Share of a slice's memory beyond the weights kept for activations and CUDA graphs (vLLM's own
    # gpu_memory_utilization default of 0.9 leaves 10 %).
    activation_reserve: float = 0.1
    # SLOs are this multiple of each deployment's isolated latency (DistServe's "SLO scale").
    slo_scale: float = 2.0
    # Offered load as a share of each deployment's nominal (isolated) SLO capacity.
    load_factor: float = 0.7
    # How the router pairs a prefill with a decode: the nearest decode of the same model (a KV-aware
    # router), or uniformly over the decodes.
    routing: Literal["nearest", "uniform"] = "nearest"

    def with_(self, **changes: object) -> PerfParams:
        return replace(self, **changes)  # type: ignore[arg-type]
