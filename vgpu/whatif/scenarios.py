"""Bundled scenarios, each built with a known answer: the cause planted in it is what the verdict must
name, and the fixing what-if must meet the SLO. Pure data. Model and GPU from `vgpu.perf.params`
(llama-8b on H200); SLOs are absolute and state what the platform promises.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vgpu.perf.params import GPUS, MODELS
from vgpu.perf.workload import TEMPLATES, Deployment
from vgpu.whatif import routing
from vgpu.whatif.deployment import Instance, Pool
from vgpu.whatif.report import Slos
from vgpu.whatif.verdict import Layer
from vgpu.whatif.workload import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    planted: Layer  # the layer the verdict must name ("none" for a healthy deployment)
    workload: WorkloadSpec
    pool: Pool
    policy: routing.Policy
    slos: Slos
    seed: int = 1


def pd_pool(
    prefill: int,
    decode: int,
    *,
    p_share: float = 0.4,
    p_mem: float = 40.0,
    d_share: float = 0.4,
    d_mem: float = 40.0,
    decode_rack: str | None = None,
    model: str = "llama-8b",
) -> Pool:
    """`prefill` prefill and `decode` decode slices, one of each per node (on different GPUs) in rack r0;
    with `decode_rack` the decodes sit on their own nodes in that rack instead."""
    inst: list[Instance] = []
    for k in range(prefill):
        inst.append(Instance(f"prefill-{k}", "prefill", p_share, p_mem, f"n{k}-g0", f"n{k}", "r0"))
    for k in range(decode):
        node, rack = (f"n{k}", "r0") if decode_rack is None else (f"d{k}", decode_rack)
        inst.append(Instance(f"decode-{k}", "decode", d_share, d_mem, f"{node}-g1", node, rack))
    return Pool(MODELS[model], GPUS["H200"], tuple(inst))


_SINGLE = WorkloadSpec(
    rate=20.0, duration_s=120.0, system_prompts=8, system_tokens=500, user_tokens=1000, output_tokens=200
)
_CHAT = WorkloadSpec(
    rate=24.0,
    duration_s=180.0,
    system_prompts=8,
    system_tokens=1500,
    user_tokens=300,
    output_tokens=150,
    turns=6.0,
    think_s=8.0,
)
_LONG = WorkloadSpec(
    rate=4.0,
    duration_s=300.0,
    system_prompts=4,
    system_tokens=8000,
    user_tokens=200,
    output_tokens=120,
)
_SLOS = Slos(ttft_s=0.5, tpot_s=0.03)


def _uneven() -> Pool:
    """4 prefill slices of which the first got 10 % of the SMs (its neighbour holds the rest)."""
    pool = pd_pool(4, 4)
    return replace(pool, instances=(replace(pool.instances[0], sm_share=0.1), *pool.instances[1:]))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "healthy",
            "4 prefill + 4 decode slices of llama-8b paired per node, llm-d routing, 20 req/s single-turn",
            "none",
            _SINGLE,
            pd_pool(4, 4),
            "llm-d",
            _SLOS,
        ),
        Scenario(
            "few-decode",
            "the healthy workload on 4 prefill but 1 small decode slice (24 GB): decode is short",
            "allocation",
            _SINGLE,
            pd_pool(4, 1, d_mem=24.0),
            "llm-d",
            _SLOS,
        ),
        Scenario(
            "round-robin-chat",
            "multi-turn chat with long shared system prompts routed round-robin over 4 prefill slices",
            "cache",
            _CHAT,
            pd_pool(4, 4, p_share=0.25, p_mem=60.0),
            "round-robin",
            _SLOS,
        ),
        Scenario(
            "uneven-slices",
            "4 prefill slices, one with 10 % of the SMs, routed round-robin; 16 req/s with no shared prefixes",
            "queuing",
            replace(_SINGLE, rate=16.0, system_tokens=0),
            _uneven(),
            "round-robin",
            _SLOS,
        ),
        Scenario(
            "cross-rack",
            "RAG: 8k-token shared documents (prefix-cached) on llama-70b-fp8, every decode in another rack than the prefills",
            "communication",
            _LONG,
            pd_pool(2, 2, decode_rack="r1", model="llama-70b-fp8", p_share=1.0, p_mem=141.0, d_share=1.0, d_mem=141.0),
            "llm-d",
            Slos(ttft_s=0.2, tpot_s=0.05),
        ),
    )
}


@dataclass(frozen=True, slots=True)
class PlacementCase:
    """A deployment placed by the planner (vgpu.whatif.placed) under each of pd-bench's configurations, on
    `nodes` 8-GPU H200 nodes after its `neighbours`; the same requests are then simulated on each placement."""

    name: str
    summary: str
    target: Deployment
    neighbours: tuple[Deployment, ...]
    nodes: int
    workload: WorkloadSpec
    policy: routing.Policy
    slos: Slos
    seed: int = 1


PLACEMENT_CASES: dict[str, PlacementCase] = {
    c.name: c
    for c in (
        PlacementCase(
            "shared-node",
            "llama-8b 3 P + 2 D (decodes ask memory only) placed after two qwen-14b P/D deployments on one node, 24 req/s",
            Deployment("llama", "team-a", TEMPLATES["llama-8b"], decode=2, prefill=3),
            tuple(Deployment(f"qwen-{i}", "team-b", TEMPLATES["qwen-14b"], decode=1, prefill=3) for i in range(2)),
            1,
            replace(_SINGLE, rate=24.0),
            "llm-d",
            _SLOS,
        ),
    )
}
