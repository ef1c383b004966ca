"""Topology-aware GPU choice: share of tensor-parallel pods on NVLink-connected GPUs, and GPUs used, with the default
policy against the same policy with topology off (PlacementConfig.topology=False: the order before vgpu.topology),
on one workload in one run.

The cluster has partial NVLink, as many real fleets do: NVSwitch nodes (8 x H100 SXM, all-to-all), nodes of
NVLink-bridged PCIe cards (8 x H100 PCIe, bridges 0-1, 2-3, 4-5, 6-7) and PCIe-only nodes (8 x L40S); every node
has two NUMA nodes (GPUs 0-3 and 4-7). Pods arrive one per step and leave after an exponential lifetime sized for
`--load` of the GPUs on average: a mix of shared slices, whole GPUs and TP2 / TP4 / TP8 pods (whole GPUs each).
Every pod goes through `vgpu.simulate.place` (Planner.evaluate, the best node, ClusterState.apply), what the
extender does for it.

Reported per configuration: TP pods placed, the share on GPUs that are all NVLink peers (any NUMA), on NVLink peers
on one NUMA node, on one NUMA node at all, pods refused, mean GPUs holding a slice (after a warm-up of a fifth of
the arrivals), the GPU-equivalents held, and the planner's time per pod. Ratios are on / off.

    python benchmarks/topology.py [--seeds 42-46] [--pods 3000] [--load 0.85] [--json out.json]
    python benchmarks/topology.py --seeds 42-51 --whole-node-cost 0   # also the default before the whole-node cost
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import random
import statistics
import time
from collections import Counter
from typing import Any

import vgpu.topology
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.planner import Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.simulate import Placed, place
from vgpu.state import ClusterState
from vgpu.topology import Link

GPUS = 8
# (kind, model, memory MiB, NVLink peers of GPU i)
KINDS: list[tuple[str, str, int, Any]] = [
    ("nvswitch", "H100-SXM-80GB", 81920, lambda i: [j for j in range(GPUS) if j != i]),
    ("bridged", "H100-PCIe-80GB", 81920, lambda i: [i ^ 1]),
    ("pcie", "L40S", 46068, lambda i: []),
]
# (shape, weight, GPUs, percent of each card): shared slices, whole GPUs, tensor-parallel pods.
SHAPES: list[tuple[str, float, int, int]] = [
    ("slice-25", 0.2, 1, 25),
    ("slice-50", 0.15, 1, 50),
    ("gpu-1", 0.25, 1, 100),
    ("tp-2", 0.2, 2, 100),
    ("tp-4", 0.12, 4, 100),
    ("tp-8", 0.08, 8, 100),
]


def cluster(nodes_per_kind: int) -> list[NodeInventory]:
    """Kinds interleaved (nvswitch-0, bridged-0, pcie-0, nvswitch-1, ...) so no kind wins ties by node order."""
    out: list[NodeInventory] = []
    for n in range(nodes_per_kind):
        for kind, model, mem, peers in KINDS:
            name = f"{kind}-{n}"
            gpus = tuple(
                GpuDevice(
                    uuid=f"GPU-{name}-{i}",
                    index=i,
                    model=model,
                    memory_mib=mem,
                    numa=i * 2 // GPUS,
                    nvlink_peers=tuple(f"GPU-{name}-{j}" for j in peers(i)),
                )
                for i in range(GPUS)
            )
            out.append(NodeInventory(name=name, gpus=gpus))
    return out


def _pod(i: int, shape: str, count: int, percent: int) -> PodInfo:
    limits: dict[str, Any] = {"nvidia.com/gpu": count}
    if percent < 100:
        limits["nvidia.com/gpumem-percentage"] = percent
    raw = {
        "metadata": {"name": f"{shape}-{i}", "namespace": "bench", "uid": f"u{i}"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }
    return pod_info(raw)


def workload(seed: int, pods: int, gpus: int, load: float) -> list[tuple[PodInfo, int]]:
    """(pod, lifetime in arrival steps): lifetimes exponential, mean sized so `load` of the GPUs are held."""
    rng = random.Random(seed)
    weights = [w for _, w, _, _ in SHAPES]
    mean_gpus = sum(w * n * p / 100 for _, w, n, p in SHAPES) / sum(weights)
    mean_life = load * gpus / mean_gpus
    out: list[tuple[PodInfo, int]] = []
    for i in range(pods):
        shape, _, count, percent = rng.choices(SHAPES, weights)[0]
        out.append((_pod(i, shape, count, percent), max(1, round(rng.expovariate(1 / mean_life)))))
    return out


@dataclasses.dataclass
class Result:
    tp_placed: int = 0
    tp_nvlink: int = 0  # all NVLink peers, any NUMA
    tp_nvlink_one_numa: int = 0
    tp_one_numa: int = 0  # one NUMA node, linked or not
    tp_by_size: Counter[int] = dataclasses.field(default_factory=Counter)
    tp_nvlink_by_size: Counter[int] = dataclasses.field(default_factory=Counter)
    refused: int = 0
    refused_by_shape: Counter[str] = dataclasses.field(default_factory=Counter)
    gpus_used: list[int] = dataclasses.field(default_factory=list)
    gpu_equivalents: list[float] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    pods: int = 0


def run(
    seed: int,
    config: PlacementConfig,
    nodes: list[NodeInventory],
    pods: list[tuple[PodInfo, int]],
    whole_node_cost: float | None = None,
) -> Result:
    """One configuration over the pods; `whole_node_cost` replaces vgpu.topology.WHOLE_NODE_COST for this run."""
    default_cost = vgpu.topology.WHOLE_NODE_COST
    if whole_node_cost is not None:
        vgpu.topology.WHOLE_NODE_COST = whole_node_cost
    try:
        return _run(config, nodes, pods)
    finally:
        vgpu.topology.WHOLE_NODE_COST = default_cost


def _run(config: PlacementConfig, nodes: list[NodeInventory], pods: list[tuple[PodInfo, int]]) -> Result:
    state = ClusterState(config)
    for inv in nodes:
        state.upsert_node(inv)
    planner = Planner(state)
    res = Result(pods=len(pods))
    leaving: list[tuple[int, str]] = []
    warmup = len(pods) // 5
    for step, (pod, life) in enumerate(pods):
        while leaving and leaving[0][0] <= step:
            state.release(heapq.heappop(leaving)[1])
        t0 = time.perf_counter()
        out = place(planner, pod)
        res.seconds += time.perf_counter() - t0
        if not isinstance(out, Placed):
            res.refused += 1
            res.refused_by_shape[pod.name.rsplit("-", 1)[0]] += 1
            continue
        heapq.heappush(leaving, (step + life, pod.key))
        devices = out.assignment.containers[0].devices
        if len(devices) > 1:
            node = state.nodes[out.assignment.node]
            link = node.topology.link([d.uuid for d in devices])
            res.tp_placed += 1
            res.tp_by_size[len(devices)] += 1
            if link <= Link.NVLINK_CROSS_NUMA:
                res.tp_nvlink += 1
                res.tp_nvlink_by_size[len(devices)] += 1
            res.tp_nvlink_one_numa += link == Link.NVLINK
            res.tp_one_numa += link in (Link.NVLINK, Link.NUMA)
        if step >= warmup:
            used = [u for n in state.nodes.values() for u in n.gpus if u.holders]
            res.gpus_used.append(len(used))
            res.gpu_equivalents.append(sum(min(1.0, u.used_share) for u in used))
    return res


def _share(a: int, b: int) -> float:
    return a / b if b else 0.0


def summary(results: list[Result]) -> dict[str, Any]:
    tp = sum(r.tp_placed for r in results)
    sizes = sorted({s for r in results for s in r.tp_by_size})
    return {
        "tp_placed": tp,
        "tp_nvlink_share": _share(sum(r.tp_nvlink for r in results), tp),
        "tp_nvlink_one_numa_share": _share(sum(r.tp_nvlink_one_numa for r in results), tp),
        "tp_one_numa_share": _share(sum(r.tp_one_numa for r in results), tp),
        "tp_nvlink_share_by_size": {
            str(s): _share(sum(r.tp_nvlink_by_size[s] for r in results), sum(r.tp_by_size[s] for r in results))
            for s in sizes
        },
        "refused": sum(r.refused for r in results),
        "refused_by_shape": dict(sum((r.refused_by_shape for r in results), Counter())),
        "pods": sum(r.pods for r in results),
        "gpus_used_mean": statistics.fmean(g for r in results for g in r.gpus_used),
        "gpu_equivalents_mean": statistics.fmean(g for r in results for g in r.gpu_equivalents),
        "ms_per_pod": 1000 * sum(r.seconds for r in results) / sum(r.pods for r in results),
        "per_seed_nvlink_share": [round(_share(r.tp_nvlink, r.tp_placed), 4) for r in results],
        "per_seed_gpus_used": [round(statistics.fmean(r.gpus_used), 2) for r in results],
        "per_seed_refused": [r.refused for r in results],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="42-46", help="workload seeds, e.g. 42-46 (default: %(default)s)")
    p.add_argument("--pods", type=int, default=3000, help="arrivals per seed (default: %(default)s)")
    p.add_argument("--nodes-per-kind", type=int, default=8, help="nodes of each kind (default: %(default)s)")
    p.add_argument("--load", type=float, default=0.85, help="mean share of GPUs held (default: %(default)s)")
    p.add_argument("--policy", default="default", help="node policy (default: %(default)s)")
    p.add_argument("--weight", type=float, action="append", default=[], help="also run topology_weight W (repeatable)")
    p.add_argument(
        "--whole-node-cost", type=float, action="append", default=[], help="also run WHOLE_NODE_COST C (repeatable)"
    )
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = p.parse_args()
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    nodes = cluster(args.nodes_per_kind)
    gpus = sum(len(n.gpus) for n in nodes)
    configs: dict[str, tuple[PlacementConfig, float | None]] = {
        "topology off (before)": (PlacementConfig(node_policy=args.policy, topology=False), None),
        "topology on (default)": (PlacementConfig(node_policy=args.policy), None),
        **{
            f"topology weight {w:g}": (PlacementConfig(node_policy=args.policy, topology_weight=w), None)
            for w in args.weight
        },
        **{f"whole-node cost {c:g}": (PlacementConfig(node_policy=args.policy), c) for c in args.whole_node_cost},
    }
    results: dict[str, list[Result]] = {name: [] for name in configs}
    t0 = time.perf_counter()
    for seed in seeds:
        pods = workload(seed, args.pods, gpus, args.load)
        for name, (config, cost) in configs.items():
            results[name].append(run(seed, config, nodes, pods, cost))
    wall = time.perf_counter() - t0
    table = {name: summary(rs) for name, rs in results.items()}
    print(
        f"{len(nodes)} nodes x {GPUS} GPUs ({args.nodes_per_kind} NVSwitch, {args.nodes_per_kind} bridged pairs, "
        f"{args.nodes_per_kind} PCIe-only; 2 NUMA nodes each), policy {args.policy}, load {args.load}, "
        f"{args.pods} pods x seeds {args.seeds}, {wall:.0f} s"
    )
    head = f"{'':24} {'TP pods':>8} {'NVLink':>8} {'NVL+NUMA':>9} {'1 NUMA':>8} {'refused':>8} {'GPUs used':>10} {'GPU-eq':>8} {'ms/pod':>7}"
    print(head)
    for name, s in table.items():
        print(
            f"{name:24} {s['tp_placed']:>8} {s['tp_nvlink_share']:>8.1%} {s['tp_nvlink_one_numa_share']:>9.1%} "
            f"{s['tp_one_numa_share']:>8.1%} {s['refused']:>8} {s['gpus_used_mean']:>10.1f} "
            f"{s['gpu_equivalents_mean']:>8.1f} {s['ms_per_pod']:>7.2f}"
        )
    off, on = table["topology off (before)"], table["topology on (default)"]
    for name, s in table.items():
        by_size = ", ".join(f"TP{k} {v:.1%}" for k, v in s["tp_nvlink_share_by_size"].items())
        refused = ", ".join(f"{k} {v}" for k, v in sorted(s["refused_by_shape"].items()))
        print(f"  {name}: on NVLink by size: {by_size}; refused: {refused}; per seed {s['per_seed_refused']}")
    ratios = {
        "tp_nvlink_share": _share_f(on["tp_nvlink_share"], off["tp_nvlink_share"]),
        "tp_one_numa_share": _share_f(on["tp_one_numa_share"], off["tp_one_numa_share"]),
        "gpus_used": _share_f(on["gpus_used_mean"], off["gpus_used_mean"]),
        "gpu_equivalents": _share_f(on["gpu_equivalents_mean"], off["gpu_equivalents_mean"]),
        "refused": _share_f(on["refused"], off["refused"]),
        "ms_per_pod": _share_f(on["ms_per_pod"], off["ms_per_pod"]),
    }
    print(
        "ratios on/off: "
        + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
        + f"  (GPUs used {100 * (ratios['gpus_used'] - 1):+.2f} %)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "wall_seconds": wall, "results": table, "ratios": ratios}, f, indent=1)


def _share_f(a: float, b: float) -> float:
    return a / b if b else float("nan")


if __name__ == "__main__":
    main()
