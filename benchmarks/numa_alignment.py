"""What following the kubelet's NUMA choice costs in placements (docs/device-plugin.md, "Topology Manager
agreement").

One 8-GPU node (GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, split 10) under churn: 400 arrivals of 1, 2 or 4 vGPUs of
8-40 GiB, 40 % chance of a departure before each, the same sequences for every mode. The extender's fit with
the kubelet-agreement hook places what it can; the share placed is compared with policy none in the same run
(the baseline). NUMA advertised under restricted/single-numa-node means GPUs on the NUMA node the kubelet
picks (lowest with free replicas); `numa_topology: never` takes any GPU, unaligned.

Usage: python benchmarks/numa_alignment.py [--seeds 10] [--arrivals 400]
"""

from __future__ import annotations

import argparse
import random
import time

from vgpu import kubelet_topology as kt
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import NodePlacement, fit_node
from vgpu.pod import PodInfo, pod_info
from vgpu.state import ClusterState, GpuUsage

NUMA = (0, 0, 0, 0, 1, 1, 1, 1)
MODES = {
    "none (baseline)": kt.NodePolicy("none"),
    "best-effort, auto: NUMA hidden": kt.NodePolicy("best-effort", numa_advertised=False),
    "restricted, auto: NUMA sent": kt.NodePolicy("restricted"),
    "single-numa-node, auto: NUMA sent": kt.NodePolicy("single-numa-node"),
    "single-numa-node, never: hidden": kt.NodePolicy("single-numa-node", numa_advertised=False),
}


def _pod(name: str, count: int, mib: int) -> PodInfo:
    limits = {"nvidia.com/gpu": str(count), "nvidia.com/gpumem": str(mib)}
    spec = {"containers": [{"name": "main", "image": "vllm", "resources": {"limits": limits}}]}
    return pod_info({"metadata": {"name": name, "namespace": "bench", "uid": name}, "spec": spec})


def _most_used_first(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return float(u.memory_free)


def placed_share(policy: kt.NodePolicy, seed: int, arrivals: int) -> float:
    gpus = tuple(GpuDevice(f"GPU-{i}", i, "H100", 81920, split_count=10, numa=NUMA[i]) for i in range(8))
    state = ClusterState()
    state.upsert_node(NodeInventory("n", gpus, kubelet=policy))
    rng = random.Random(seed)
    live: list[str] = []
    placed = 0
    for i in range(arrivals):
        if live and rng.random() < 0.4:
            state.release(live.pop(rng.randrange(len(live))))
        pod = _pod(f"p{i}", rng.choice([1, 1, 1, 2, 4]), rng.choice([8192, 16384, 20480, 40960]))
        fit = fit_node(state.nodes["n"], pod, state.config, _most_used_first)
        if isinstance(fit, NodePlacement):
            state.apply(pod.key, fit.assignment(pod))
            live.append(pod.key)
            placed += 1
    return placed / arrivals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--arrivals", type=int, default=400)
    args = ap.parse_args()
    start = time.monotonic()
    base = 0.0
    for name, policy in MODES.items():
        shares = [placed_share(policy, seed, args.arrivals) for seed in range(args.seeds)]
        mean = sum(shares) / len(shares)
        base = base or mean
        print(f"{name:36} placed {100 * mean:5.1f} % of arrivals  ratio to none {mean / base:.3f}")
    print(f"({args.seeds} seeds x {args.arrivals} arrivals, {time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    main()
