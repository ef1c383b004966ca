"""The model applied to a placed cluster: per-replica capacity within SLO, per-deployment goodput, and the
placement facts that explain it (P/D pairing, SM oversubscription, bandwidth overcommit). Pure.

Per GPU: SM shares come from the reserved cores (a best-effort slice gets what is left; more than 100 %
reserved scales every share down); decode slices demand `decode_mbu x beta` of the bandwidth and slow
down together when the sum exceeds 1; a prefill on the same GPU slows its decodes by
`prefill_corun_penalty x load_factor`; a GPU with a prefill whose SMs are not partitioned slows both
roles by `unpartitioned_slowdown`. Per deployment: goodput = min(prefill, decode) capacity within SLO.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpu.annotations import Assignment
from vgpu.perf import model as pm
from vgpu.perf.pairing import PairingChances
from vgpu.perf.params import GpuSpec, Link, PerfParams
from vgpu.perf.workload import RACK_LABEL, Deployment, SliceShape
from vgpu.roles import Role
from vgpu.state import ClusterState, GpuUsage


@dataclass(frozen=True, slots=True)
class Slos:
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True, slots=True)
class GpuView:
    sm_share: dict[str, float]  # pod key -> effective SM share on this GPU
    decode_slowdown: float  # bandwidth contention x prefill co-run x unpartitioned
    prefill_slowdown: float
    sm_oversubscribed: bool  # holds a prefill and its SMs are not hard-partitioned
    bw_overcommitted: bool


@dataclass(frozen=True, slots=True)
class Metrics:
    goodput_rps: float
    nominal_rps: float
    ttft_attainment: float
    tpot_attainment: float
    slo_attainment: float
    pair_node: float  # share of placed prefills with a decode of the same pool on their node
    # ... among the pairable prefills only: paired, or with a live decode of the pool that the filter
    # admitted next to them at a placement decision (vgpu.perf.pairing); every prefill without `chances`
    pair_node_capacity: float
    pairable: float  # share of placed prefills that are pairable
    pair_gpu: float  # ... on one of their GPUs
    prefill_sm_oversubscribed: int  # GPUs
    bw_overcommitted: int  # GPUs
    gpus_used: int
    gpu_equivalents: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in self.__slots__}


def gpu_view(u: GpuUsage, params: PerfParams) -> GpuView:
    reserved = sum(h.cores for h in u.holders)
    best_effort = any(h.cores == 0 for h in u.holders)
    has_prefill = u.prefill > 0
    shares: dict[str, float] = {}
    for h in u.holders:
        if h.cores == 0:
            shares[h.pod_key] = max(0.05, 1.0 - reserved / u.device.cores)
        else:
            shares[h.pod_key] = h.cores / max(reserved, u.device.cores)
    demand = sum(pm.decode_demand(shares[h.pod_key], params) for h in u.holders if h.role is Role.DECODE)
    unpartitioned = has_prefill and len(u.holders) > 1 and (best_effort or reserved > u.device.cores)
    un = params.unpartitioned_slowdown if unpartitioned else 1.0
    corun = 1.0 + params.prefill_corun_penalty * params.load_factor if has_prefill else 1.0
    return GpuView(
        sm_share=shares,
        decode_slowdown=max(1.0, demand) * corun * un,
        prefill_slowdown=un,
        sm_oversubscribed=unpartitioned,
        bw_overcommitted=demand > 1.0,
    )


def slos(dep: Deployment, gpu: GpuSpec, params: PerfParams) -> Slos:
    """SLOs of a deployment: `slo_scale` x its isolated latency (prefill alone on its slice plus an NVLink
    transfer; a decode step at the KV-limited batch), as DistServe scales SLOs from isolated latency."""
    t = dep.template
    p_share = _declared_share(t.prefill)
    ttft = pm.prefill_seconds(t.model, gpu, p_share, params) + pm.kv_transfer_seconds(t.model, gpu, "nvlink", params)
    bw = _isolated_gb_s(t.decode, gpu, params)
    batch = pm.kv_batch_limit(t.model, t.decode.memory_gb(), t.decode.count, params)
    tpot = pm.decode_step_seconds(t.model, batch, bw, params)
    return Slos(ttft_s=params.slo_scale * ttft, tpot_s=params.slo_scale * tpot)


def _declared_share(shape: SliceShape, gpu_mib: int = 143771) -> float:
    cores = shape.cores if shape.cores is not None else -(-100 * shape.memory_mib // gpu_mib)
    return cores / 100


def _isolated_gb_s(shape: SliceShape, gpu: GpuSpec, params: PerfParams) -> float:
    per = gpu.hbm_gb_s * params.decode_mbu * pm.beta(_declared_share(shape), params.s_sat)
    return per * shape.count


def nominal(dep: Deployment, gpu: GpuSpec, params: PerfParams) -> tuple[float, float]:
    """(prefill, decode) capacity in req/s of the deployment's replicas, each alone on its GPU(s)."""
    t = dep.template
    s = slos(dep, gpu, params)
    service = pm.prefill_seconds(t.model, gpu, _declared_share(t.prefill), params, tp=t.prefill.count)
    kv = pm.kv_transfer_seconds(t.model, gpu, "nvlink", params)
    p = pm.prefill_rate_within(service, kv, s.ttft_s)
    batch = pm.kv_batch_limit(t.model, t.decode.memory_gb(), t.decode.count, params)
    d = pm.decode_rate_within(t.model, _isolated_gb_s(t.decode, gpu, params), batch, s.tpot_s, params)
    return dep.prefill * p, dep.decode * d


def link(state: ClusterState, a: Assignment, b: Assignment) -> Link:
    """The best path between any GPU of `a` and any of `b`."""
    if a.node != b.node:
        ra = state.nodes[a.node].inventory.labels.get(RACK_LABEL)
        rb = state.nodes[b.node].inventory.labels.get(RACK_LABEL)
        return "rack" if ra is not None and ra == rb else "cross-rack"
    ua = {s.uuid for s in a.slices()}
    ub = {s.uuid for s in b.slices()}
    if ua & ub:
        return "same-gpu"
    node = state.nodes[a.node]
    if any(p in ub for x in ua for p in node.by_uuid[x].device.nvlink_peers):
        return "nvlink"
    return "pcie"


def evaluate(
    state: ClusterState,
    deployments: Iterable[Deployment],
    gpu: GpuSpec,
    params: PerfParams,
    chances: PairingChances | None = None,
) -> tuple[Metrics, dict[str, GpuView]]:
    """Model every placed replica of `deployments` on `state`; returns the metrics and each GPU's view.
    `chances` (recorded while placing) decides which unpaired prefills count for `pair_node_capacity`."""
    views = {u.device.uuid: gpu_view(u, params) for n in state.nodes.values() for u in n.gpus if u.holders}
    by_pool: dict[str, dict[Role, list[tuple[str, Assignment]]]] = {}
    for key, a in state.assignments.items():
        if a.model is not None and a.role in (Role.PREFILL, Role.DECODE):
            by_pool.setdefault(a.model, {Role.PREFILL: [], Role.DECODE: []})[a.role].append((key, a))
    goodput = nominal_total = offered_total = ttft_ok = tpot_ok = both_ok = 0.0
    prefills = pair_node = pair_gpu = pairable = 0
    for dep in deployments:
        t = dep.template
        s = slos(dep, gpu, params)
        nom = min(nominal(dep, gpu, params))
        offered = params.load_factor * nom
        nominal_total += nom
        offered_total += offered
        placed = by_pool.get(dep.identity, {Role.PREFILL: [], Role.DECODE: []})
        decodes = placed[Role.DECODE]
        d_cap = 0.0
        for key, a in decodes:
            slices = a.slices()
            per = min(
                gpu.hbm_gb_s
                * params.decode_mbu
                * pm.beta(views[x.uuid].sm_share[key], params.s_sat)
                / views[x.uuid].decode_slowdown
                for x in slices
            )
            batch = pm.kv_batch_limit(t.model, max(x.memory_mib for x in slices) * 1024**2 / 1e9, len(slices), params)
            d_cap += pm.decode_rate_within(t.model, per * len(slices), batch, s.tpot_s, params)
        p_cap = 0.0
        for key, a in placed[Role.PREFILL]:
            prefills += 1
            slices = a.slices()
            service = max(
                pm.prefill_seconds(t.model, gpu, views[x.uuid].sm_share[key], params, tp=len(slices))
                * views[x.uuid].prefill_slowdown
                for x in slices
            )
            links = [link(state, a, b) for _, b in decodes]
            paired = any(lk in ("same-gpu", "nvlink", "pcie") for lk in links)
            pair_node += paired
            pairable += paired or chances is None or chances.had_chance(key)
            pair_gpu += "same-gpu" in links
            if not links:
                continue
            times = [pm.kv_transfer_seconds(t.model, gpu, lk, params) for lk in links]
            kv = min(times) if params.routing == "nearest" else sum(times) / len(times)
            p_cap += pm.prefill_rate_within(service, kv, s.ttft_s)
        cap = min(p_cap, d_cap)
        goodput += cap
        if offered > 0:
            ttft_ok += min(offered, p_cap)
            tpot_ok += min(offered, d_cap)
            both_ok += min(offered, cap)
    used = [u for n in state.nodes.values() for u in n.gpus if u.holders]
    return (
        Metrics(
            goodput_rps=goodput,
            nominal_rps=nominal_total,
            ttft_attainment=ttft_ok / offered_total if offered_total else 1.0,
            tpot_attainment=tpot_ok / offered_total if offered_total else 1.0,
            slo_attainment=both_ok / offered_total if offered_total else 1.0,
            pair_node=pair_node / prefills if prefills else 1.0,
            pair_node_capacity=pair_node / pairable if pairable else 1.0,
            pairable=pairable / prefills if prefills else 1.0,
            pair_gpu=pair_gpu / prefills if prefills else 0.0,
            prefill_sm_oversubscribed=sum(v.sm_oversubscribed for v in views.values()),
            bw_overcommitted=sum(v.bw_overcommitted for v in views.values()),
            gpus_used=len(used),
            gpu_equivalents=sum(min(1.0, u.used_share) for u in used),
        ),
        views,
    )


def mean(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    rows = list(rows)
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} if rows else {}
