"""Online pods preempting batch slices: the extender's preempt verb against kube-scheduler's default preemption with
our filter, and against no preemption, on one mixed workload with arrivals and departures (docs/priority.md).

Cluster: `--nodes` nodes of two 80 GiB GPUs split 4 ways (8 `nvidia.com/gpu` replicas per node, what kube-scheduler
counts in-tree). Batch pods (priority 100, 10-40 GiB slices, ~2 h) arrive at a rate that keeps the GPUs full and
queue when nothing fits; online pods (priority 100000, 20 or 35 GiB, ~1 h) arrive less often. Every placement is
`vgpu.simulate.place` (the extender's filter and scoring). When an online pod fits nowhere:

- `extender` (preemptVerb, Kubernetes v1.34): candidates are the nodes our filter failed as resolvable *and* whose
  replicas are all used (kube-scheduler drops a node whose in-tree dry run needs no victim); per node
  `vgpu.preemption.choose_victims`; kube-scheduler's node choice (lowest highest-priority victim, fewest victims,
  youngest); evicted batch pods are requeued and lose their progress.
- `extender-all` the same without the in-tree gate (kube-scheduler after kubernetes/kubernetes pull request 135486).
- `default` (no preemptVerb): kube-scheduler's own victims, from its in-tree view only: on a node whose replicas are
  full, the least important lower-priority pod (lowest priority, then youngest) until one replica is free; the
  online pod then fits only if that freed enough memory on one GPU, else it waits and may preempt again later.
- `none`: online pods wait for departures.

Reported: online time to placement (p50, p99, minutes; pods never placed count in neither), online pods never
placed, batch GPU-hours evicted (slice share of a GPU x time run), preemptions, per online pod that preempted: the
victims evicted for it (all its preemptions) and, on the node of its first preemption at that moment, the fewest
victims that would have let it fit (brute force over every subset of the node's lower-priority pods), the share of
those placed with exactly that many, GPU memory use (time average). Ratios are extender / default.

    python benchmarks/preemption.py [--seeds 1-3] [--hours 48] [--nodes 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import NodePlacement, fit_node
from vgpu.planner import Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.preemption import VictimFacts, choose_victims, without
from vgpu.priority import Priority
from vgpu.simulate import Placed, place
from vgpu.state import ClusterState

CARD = 81920
SPLIT = 4
BATCH, ONLINE = 100, 100_000
STRATEGIES = ("extender", "extender-all", "default", "none")


@dataclass(slots=True)
class Job:
    key: str
    info: PodInfo
    priority: int
    arrived: float
    duration: float
    started: float | None = None
    node: str | None = None


@dataclass(slots=True)
class Stats:
    waits: list[float] = field(default_factory=list)
    never: int = 0
    evicted_gpu_h: float = 0.0
    preemptions: int = 0
    victims: list[int] = field(default_factory=list)  # per preempting online pod, all its preemptions together
    minimum: list[int] = field(default_factory=list)  # the fewest at its first preemption (-1: no set works)
    helped: list[bool] = field(default_factory=list)  # the pod was placed in the end
    mem_area: float = 0.0
    horizon: float = 0.0
    cpu_s: float = 0.0


def _info(key: str, mib: int, prio: int) -> PodInfo:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
    pod = {
        "metadata": {"name": key, "namespace": "default", "uid": key},
        "spec": {"priority": prio, "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    return pod_info(pod)


def workload(seed: int, hours: float, nodes: int) -> list[tuple[float, str, int, int, float]]:
    """(arrival s, key, MiB, priority, duration s): batch sized to oversubscribe, online at a tenth of that."""
    rnd = random.Random(seed)
    out = []
    gpus = 2 * nodes
    mean_batch = 25000 / CARD  # GPU share of a mean batch slice
    batch_rate = 1.3 * gpus / mean_batch / (2 * 3600)  # 130 % of capacity at a 2 h mean duration
    t, i = 0.0, 0
    while t < hours * 3600:
        t += rnd.expovariate(batch_rate)
        out.append((t, f"batch-{i}", rnd.choice((10000, 20000, 30000, 40000)), BATCH, rnd.expovariate(1 / 7200)))
        i += 1
    t, i = 0.0, 0
    while t < hours * 3600:
        t += rnd.expovariate(batch_rate / 10)
        out.append((t, f"online-{i}", rnd.choice((20000, 35000)), ONLINE, rnd.expovariate(1 / 3600)))
        i += 1
    return sorted(out)


def _fewest(state: ClusterState, node: str, job: Job, jobs: dict[str, Job]) -> int:
    """The fewest lower-priority pods on `node` whose removal lets the job fit (brute force)."""
    ns = state.nodes[node]
    lower = sorted(k for k in ns.pods if jobs[k].priority < job.priority)
    for size in range(1, len(lower) + 1):
        for subset in itertools.combinations(lower, size):
            if isinstance(fit_node(without(ns, subset), job.info, state.config, lambda *a: 0.0), NodePlacement):
                return size
    return -1


def run(seed: int, hours: float, nodes: int, strategy: str) -> Stats:
    config = PlacementConfig()
    state = ClusterState(config)
    for n in range(nodes):
        gpus = tuple(GpuDevice(f"n{n}-g{i}", i, "H100", CARD, split_count=SPLIT) for i in range(2))
        state.upsert_node(NodeInventory(f"n{n}", gpus))
    planner = Planner(state)
    events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, key)
    seq = itertools.count()
    jobs: dict[str, Job] = {}
    for t, key, mib, prio, dur in workload(seed, hours, nodes):
        info = _info(key, mib, prio)
        jobs[info.key] = Job(info.key, info, prio, t, dur)
        heapq.heappush(events, (t, next(seq), "arrive", info.key))
    queue: list[str] = []  # waiting pods, online first then by arrival
    preempted_for: dict[str, tuple[int, int]] = {}  # online pod -> (victims evicted for it, fewest possible)
    stats = Stats(horizon=hours * 3600)
    now = last = 0.0
    started_cpu = time.process_time()

    def start(job: Job, placed: Placed) -> None:
        job.started, job.node = now, placed.assignment.node
        if job.priority == ONLINE:
            stats.waits.append((now - job.arrived) / 60)
        heapq.heappush(events, (now + job.duration, next(seq), "leave", job.key))

    def evict(key: str) -> None:
        v = jobs[key]
        a = state.release(key)
        assert a is not None and v.started is not None
        stats.evicted_gpu_h += sum(s.memory_mib for s in a.slices()) / CARD * (now - v.started) / 3600
        v.started, v.node = None, None
        # Restarts from scratch when placed again; its old departure event is ignored (the start time moved).
        queue.append(key)

    def preempt(job: Job) -> None:
        prio = Priority(job.priority)
        facts = {
            k: VictimFacts(Priority(j.priority), j.started or 0.0)
            for k, j in jobs.items()
            if j.node is not None and j.priority < job.priority
        }
        best: tuple[tuple[Any, ...], str, tuple[str, ...]] | None = None
        for name, ns in state.nodes.items():
            full = len(ns.pods) >= 2 * SPLIT
            fit = fit_node(ns, job.info, config, lambda *a: 0.0)
            if isinstance(fit, NodePlacement) or fit.unresolvable:
                continue
            if strategy == "default":
                if not full:
                    continue
                lower = [k for k in ns.pods if k in facts]
                if not lower:
                    continue
                victim = min(lower, key=lambda k: (facts[k].priority, -facts[k].created))
                victims: tuple[str, ...] = (victim,)
            else:
                if strategy == "extender" and not full:
                    continue
                choice = choose_victims(ns, job.info, config, planner.rank_on(ns, job.info), facts, prio)
                if choice is None:
                    continue
                victims = choice.victims
            ps = sorted((facts[v].priority.value for v in victims), reverse=True)
            key = (ps[0], sum(ps), len(victims), -max(facts[v].created for v in victims), name)
            if best is None or key < best[0]:
                best = (key, name, victims)
        if best is None:
            return
        _, name, victims = best
        stats.preemptions += 1
        if job.key not in preempted_for:
            preempted_for[job.key] = (0, _fewest(state, name, job, jobs))
        n, fewest = preempted_for[job.key]
        preempted_for[job.key] = (n + len(victims), fewest)
        for v in victims:
            evict(v)

    def try_queue() -> None:
        queue.sort(key=lambda k: (-jobs[k].priority, jobs[k].arrived))
        tried = 0
        for key in list(queue):
            job = jobs[key]
            if job.priority == BATCH:
                tried += 1
                if tried > 20:
                    break
            placed = place(planner, job.info)
            if isinstance(placed, Placed):
                queue.remove(key)
                start(job, placed)
            elif job.priority == ONLINE and strategy != "none":
                preempt(job)
                placed = place(planner, job.info)
                if isinstance(placed, Placed):
                    queue.remove(key)
                    start(job, placed)

    while events:
        t, _, kind, key = heapq.heappop(events)
        if t > stats.horizon:
            break
        used = sum(u.memory_used for n in state.nodes.values() for u in n.gpus)
        stats.mem_area += used * (t - last)
        now = last = t
        job = jobs[key]
        if kind == "arrive":
            queue.append(key)
        else:
            if job.node is None or job.started is None or abs(job.started + job.duration - t) > 1e-6:
                continue  # a departure of a run that was evicted
            state.release(key)
            job.node = None
        try_queue()
    stats.never = sum(1 for k in queue if jobs[k].priority == ONLINE)
    for k, (n, fewest) in preempted_for.items():
        stats.victims.append(n)
        stats.minimum.append(fewest)
        stats.helped.append(jobs[k].node is not None or jobs[k].started is not None)
    stats.mem_area /= stats.horizon * CARD * 2 * nodes
    stats.cpu_s = time.process_time() - started_cpu
    return stats


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1-3", help="a range a-b or a comma list")
    ap.add_argument("--hours", type=float, default=48.0)
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if "-" in args.seeds:
        lo, hi = (int(x) for x in args.seeds.split("-"))
        seeds = list(range(lo, hi + 1))
    else:
        seeds = [int(x) for x in args.seeds.split(",")]
    rows: dict[str, dict[str, float]] = {}
    for strategy in STRATEGIES:
        runs = [run(s, args.hours, args.nodes, strategy) for s in seeds]
        waits = [w for r in runs for w in r.waits]
        victims = [v for r in runs for v in r.victims]
        trios = [t for r in runs for t in zip(r.victims, r.minimum, r.helped, strict=True)]
        exact = [v == m for v, m, h in trios if h and m > 0]
        rows[strategy] = {
            "online_placed": len(waits),
            "wait_p50_min": _pct(waits, 0.5),
            "wait_p99_min": _pct(waits, 0.99),
            "online_never_placed": sum(r.never for r in runs),
            "batch_gpu_h_evicted": sum(r.evicted_gpu_h for r in runs),
            "preemptions": sum(r.preemptions for r in runs),
            "preempting_pods": len(trios),
            "preempting_pods_placed": sum(h for _, _, h in trios),
            "victims_per_preempting_pod": statistics.mean(victims) if victims else 0.0,
            "fewest_possible_per_pod": statistics.mean(m for _, m, _ in trios if m > 0) if trios else 0.0,
            "placed_at_the_minimum": sum(exact) / len(exact) if exact else float("nan"),
            "gpu_memory_use": statistics.mean(r.mem_area for r in runs),
            "cpu_s": sum(r.cpu_s for r in runs),
        }
    keys = list(rows["default"])
    print(f"seeds {seeds}, {args.hours:g} h, {args.nodes} nodes x 2 GPUs (80 GiB, split {SPLIT})")
    print(f"{'metric':28}" + "".join(f"{s:>14}" for s in STRATEGIES) + f"{'extender/default':>18}")
    for k in keys:
        vals = [rows[s][k] for s in STRATEGIES]
        base = rows["default"][k]
        ratio = rows["extender"][k] / base if base else float("nan")
        print(f"{k:28}" + "".join(f"{v:14.3f}" for v in vals) + f"{ratio:18.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seeds": seeds, "hours": args.hours, "nodes": args.nodes, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
