"""Speed of the request-level what-if (`vgpu validate`): requests simulated per CPU second on a 10-minute,
100 req/s trace (60,000 requests), against the target of the whole trace in under 60 s of one core.

Two workloads on one llama-8b P/D pool sized to carry them (14 prefill slices at 40 % SM, 6 decode slices):
single-turn requests sharing 8 system prompts, and multi-turn chat (6 turns on average) whose prefix caches
matter. Each runs under round-robin routing (no cache look-ups: the cheapest router, the baseline) and llm-d's
weighted scorers (a cache look-up per prefill instance per request). CPU time is `time.process_time()` of the
simulation alone (trace generation and the report are timed apart).

When SimPy is importable (it is not a dependency: `pip install --target DIR simpy` and PYTHONPATH=DIR), the
event core is also compared on its own: the same number of timed events as the llm-d chat run processed by
a heapq loop and by SimPy processes yielding timeouts, the overhead a SimPy-based simulator starts from.

    python benchmarks/whatif_speed.py [--rate 100] [--duration 600] [--seed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from vgpu.perf.params import PerfParams
from vgpu.whatif.report import Slos, build
from vgpu.whatif.scenarios import pd_pool
from vgpu.whatif.sim import simulate
from vgpu.whatif.workload import WorkloadSpec, generate

TARGET_S = 60.0


def event_core(events: int) -> dict[str, float] | None:
    """CPU seconds for `events` timed events: heapq push/pop against SimPy timeouts (None without SimPy)."""
    try:
        import simpy  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    import heapq
    import random

    rng = random.Random(1)
    delays = [rng.random() for _ in range(events)]
    t0 = time.process_time()
    heap: list[tuple[float, int]] = []
    now = 0.0
    for i, d in enumerate(delays):
        heapq.heappush(heap, (now + d, i))
        if len(heap) > 64:
            now, _ = heapq.heappop(heap)
    while heap:
        heapq.heappop(heap)
    heap_s = time.process_time() - t0
    env = simpy.Environment()

    def proc(chunk: list[float]) -> Any:
        for d in chunk:
            yield env.timeout(d)

    t1 = time.process_time()
    for k in range(64):  # 64 concurrent processes, as many pending events as the heapq loop keeps
        env.process(proc(delays[k::64]))
    env.run()
    simpy_s = time.process_time() - t1
    return {"events": events, "heapq_cpu_s": round(heap_s, 3), "simpy_cpu_s": round(simpy_s, 3),
            "simpy_over_heapq": round(simpy_s / heap_s, 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    pool = pd_pool(14, 6, p_mem=60.0)
    params = PerfParams()
    slos = Slos(ttft_s=0.5, tpot_s=0.03)
    workloads = {
        "single-turn": WorkloadSpec(rate=args.rate, duration_s=args.duration, system_tokens=500, user_tokens=1000),
        "chat": WorkloadSpec(
            rate=args.rate, duration_s=args.duration, system_tokens=1500, user_tokens=300,
            output_tokens=150, turns=6.0, think_s=8.0,
        ),
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    print(f"{'workload':12} {'routing':12} {'requests':>9} {'gen s':>6} {'sim CPU s':>9} {'req/CPU s':>10} "
          f"{'report s':>8} {'x target':>8} {'vs rr':>6} {'SLO ok':>6}")  # fmt: skip
    for wname, spec in workloads.items():
        t0 = time.process_time()
        reqs = generate(spec, args.seed)
        gen_s = time.process_time() - t0
        base = None
        for policy in ("round-robin", "llm-d"):
            t1 = time.process_time()
            res = simulate(pool, reqs, policy, params)
            sim_s = time.process_time() - t1
            t2 = time.process_time()
            rep = build(pool, reqs, res, slos, params)
            rep_s = time.process_time() - t2
            rate = len(reqs) / sim_s
            base = base or rate
            # x target: how many times faster than the 60 s budget for this trace (> 1 meets it)
            row = {
                "workload": wname, "routing": policy, "requests": len(reqs), "events": res.events,
                "generate_cpu_s": round(gen_s, 3), "simulate_cpu_s": round(sim_s, 3),
                "requests_per_cpu_s": round(rate), "report_cpu_s": round(rep_s, 3),
                "x_target": round(TARGET_S / (sim_s + rep_s + gen_s), 2), "vs_round_robin": round(rate / base, 2),
                "slo_attainment": round(rep.slo_attainment, 4),
            }  # fmt: skip
            rows.append(row)
            print(f"{wname:12} {policy:12} {len(reqs):9d} {gen_s:6.2f} {sim_s:9.2f} {rate:10.0f} {rep_s:8.2f} "
                  f"{row['x_target']:8.2f} {row['vs_round_robin']:6.2f} {rep.slo_attainment:6.1%}")  # fmt: skip
    core = event_core(max(r["events"] for r in rows))
    if core:
        print(f"event core, {core['events']} events: heapq {core['heapq_cpu_s']:.2f} CPU s, SimPy "
              f"{core['simpy_cpu_s']:.2f} CPU s ({core['simpy_over_heapq']:.1f}x)")  # fmt: skip
    else:
        print("event core: SimPy not importable, comparison skipped")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"target_s": TARGET_S, "rows": rows, "event_core": core}, fh, indent=1)


if __name__ == "__main__":
    main()
