"""The verdict: which layer to fix first, proven by a what-if that changes only that layer. Pure.

Checked in this order, first match wins (a shortage hides every other cause, so it goes first):
1. allocation, decode: offered load at or above the decode slices' capacity within the TPOT SLO;
   what-if: add decode slices shaped like the first until the load is 0.8 of capacity.
2. allocation, prefill: offered uncached tokens at the oracle hit rate at or above 0.95 of prefill
   capacity (even a perfect router could not save it); what-if: add prefill slices to 0.7.
3. communication: KV transfer at least a quarter of TTFT over links that leave the node; what-if:
   re-place each decode on a prefill's node.
4. cache reuse: hit rate 10 points or more below the oracle router's; what-if: llm-d routing.
5. queuing imbalance: a third or more of the waiting done while a peer sat idle; what-if: llm-d routing.
6. allocation, placement: a slice runs 1.5x or more slower from what shares its GPU (unpartitioned SMs,
   bandwidth taken by co-resident decodes; `Instance.slowdown`); what-if: the same slices without it.
7. otherwise allocation of the busier role (capacity too tight for the SLO's tail).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from vgpu.perf.params import PerfParams
from vgpu.whatif import routing
from vgpu.whatif.deployment import Pool, link
from vgpu.whatif.report import Report, Slos, build
from vgpu.whatif.sim import simulate
from vgpu.whatif.workload import Request

Layer = Literal["none", "allocation", "queuing", "cache", "communication"]
DECODE_LOAD_MAX = 1.0
PREFILL_LOAD_MAX = 0.95
KV_SHARE_MAX = 0.25
CACHE_GAP_MAX = 0.10
PEER_IDLE_MAX = 0.33
SLOWDOWN_MAX = 1.5


@dataclass(frozen=True, slots=True)
class WhatIf:
    change: str
    pool: Pool
    policy: routing.Policy
    report: Report


@dataclass(frozen=True, slots=True)
class Verdict:
    layer: Layer
    cause: str
    fix: WhatIf | None
    suggested: str = ""  # the what-if's change when it was not run (live mode)

    def text(self, before: Report) -> str:
        if self.fix is None and self.suggested:
            return f"fix {self.layer} first: {self.cause}; what-if to try: {self.suggested}"
        if self.fix is None:
            return f"{self.layer}: {self.cause}"
        after = self.fix.report
        met = "SLO met" if after.slo_met else "SLO still NOT met"
        return (
            f"fix {self.layer} first: {self.cause}; what-if {self.fix.change}: SLO attainment "
            f"{before.slo_attainment:.0%} -> {after.slo_attainment:.0%} ({met})"
        )


def run(pool: Pool, requests: list[Request], policy: routing.Policy, slos: Slos, params: PerfParams) -> Report:
    return build(pool, requests, simulate(pool, requests, policy, params), slos, params)


def _more(k: int, role: str) -> str:
    return f"+{k} {role} slice" + ("s" if k > 1 else "")


def _to(load: float, count: int, target: float) -> int:
    return max(1, math.ceil(count * load / target) - count)


@dataclass(frozen=True, slots=True)
class Finding:
    """The layer to fix first and the what-if that would show it: `pool` and `policy` after the change."""

    layer: Layer
    cause: str
    change: str
    pool: Pool
    policy: routing.Policy


def judge(rep: Report, pool: Pool, policy: routing.Policy) -> Finding | None:
    """The verdict rules on a report, simulated or read live (vgpu.whatif.live); None when the SLO is met."""
    if rep.slo_met:
        return None
    llmd = "llm-d routing (prefix + queue + KV scorers)"
    crossing = any(link(p, d) in ("rack", "cross-rack") for p in pool.role("prefill") for d in pool.role("decode"))
    if rep.decode_load >= DECODE_LOAD_MAX:
        k = _to(rep.decode_load, rep.decode_instances, 0.8)
        cause = f"offered load is {rep.decode_load:.2f}x the decode slices' capacity within the TPOT SLO"
        return Finding("allocation", cause, _more(k, "decode"), pool.add("decode", k), policy)
    if rep.prefill_load >= PREFILL_LOAD_MAX:
        k = _to(rep.prefill_load, rep.prefill_instances, 0.7)
        cause = f"prefill work is {rep.prefill_load:.2f}x prefill capacity even at the oracle hit rate"
        return Finding("allocation", cause, _more(k, "prefill"), pool.add("prefill", k), policy)
    if rep.kv_share_of_ttft >= KV_SHARE_MAX and crossing:
        cause = f"KV transfer is {rep.kv_share_of_ttft:.0%} of TTFT over links that leave the node"
        return Finding("communication", cause, "decodes re-placed on prefill nodes", pool.colocated(), policy)
    if rep.oracle_hit_rate - rep.hit_rate >= CACHE_GAP_MAX and policy != "llm-d":
        gap = 100 * (rep.oracle_hit_rate - rep.hit_rate)
        cause = f"prefix hit rate {rep.hit_rate:.0%} vs {rep.oracle_hit_rate:.0%} for an oracle router ({gap:.0f} points lost by {policy} routing; no new GPUs needed)"
        return Finding("cache", cause, llmd, pool, "llm-d")
    if rep.wait_peer_idle_share >= PEER_IDLE_MAX and policy != "llm-d":
        cause = f"{rep.wait_peer_idle_share:.0%} of waiting happened while a peer instance was idle"
        return Finding("queuing", cause, llmd, pool, "llm-d")
    slowed = [i for i in pool.instances if i.slowdown >= SLOWDOWN_MAX]
    if slowed:
        worst = max(i.slowdown for i in slowed)
        cause = (
            f"{len(slowed)} slice(s) run up to {worst:.1f}x slower from what shares their GPU "
            "(unpartitioned SMs or bandwidth taken by co-resident decodes): placement"
        )
        alone = replace(pool, instances=tuple(replace(i, slowdown=1.0) for i in pool.instances))
        return Finding("allocation", cause, "the same slices placed without co-residence slowdown", alone, policy)
    if rep.decode_load >= rep.prefill_load:
        k = _to(max(rep.decode_load, 0.8), rep.decode_instances, 0.6)
        cause = f"decode capacity too tight for the SLO's tail (load {rep.decode_load:.2f})"
        return Finding("allocation", cause, _more(k, "decode"), pool.add("decode", k), policy)
    k = _to(max(rep.prefill_load, 0.7), rep.prefill_instances, 0.5)
    cause = f"prefill capacity too tight for the SLO's tail (load {rep.prefill_load:.2f})"
    return Finding("allocation", cause, _more(k, "prefill"), pool.add("prefill", k), policy)


def met(rep: Report, slos: Slos) -> Verdict:
    return Verdict("none", f"{rep.slo_attainment:.0%} of requests meet both SLOs (target {slos.target:.0%})", None)


def diagnose(
    pool: Pool, requests: list[Request], policy: routing.Policy, slos: Slos, params: PerfParams
) -> tuple[Report, Verdict]:
    """Simulate, report, and when the SLO is missed name the layer and run the what-if that fixes it."""
    slos.check()
    rep = run(pool, requests, policy, slos, params)
    f = judge(rep, pool, policy)
    if f is None:
        return rep, met(rep, slos)
    fix = WhatIf(f.change, f.pool, f.policy, run(f.pool, requests, f.policy, slos, params))
    return rep, Verdict(f.layer, f.cause, fix)
