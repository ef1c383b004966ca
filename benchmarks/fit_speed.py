"""In-process CPU of one node's evaluation, the part every first node of a class (and every node, for a pod asking
several GPUs) pays: `fit_node` plus the policy, role and topology scores the planner adds (`Planner.evaluate_node`,
uncached), over every node of `cold_shape.py`'s `usual` and `packed` clusters, per pod shape.

Shapes: one slice (25 % prefill with a model, one whole card), several slices of one container (2 x 30 %, 2 x 100 %,
4 x 100 %, 8 x 100 %), a two-container pod (1 x 50 % and 2 x 25 %). `--nvlink` gives every node NVLink pairs
(GPUs 2k, 2k+1) and two NUMA nodes, so the topology term and `choose` do real work. For each shape the least of
`--passes` passes over all nodes is kept (other work on the box only ever adds; the heap is frozen before each, as the
extender's is), printed as us a node, with a digest of every answer (placement, score bits, failure reason): two
versions of the code must print the same digests.

    python benchmarks/fit_speed.py [--nodes 5000] [--passes 3] [--cluster usual|packed|both] [--nvlink]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cold_shape import learned_planner, packed_state, usual_state
from vgpu.pod import PodInfo, pod_info
from vgpu.state import ClusterState, HostUse

# (label, containers as (name, GPU limits), pod labels)
SHAPES: list[tuple[str, list[tuple[str, dict[str, str]]], dict[str, str]]] = [
    (
        "1x25% prefill",
        [("vllm", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "40"})],
        {"llm-d.ai/model": "model-0", "llm-d.ai/role": "prefill"},
    ),
    ("1x100%", [("vllm", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"})], {}),
    ("2x30%", [("vllm", {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "30"})], {}),
    ("2x100%", [("vllm", {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"})], {}),
    ("4x100%", [("vllm", {"nvidia.com/gpu": "4", "nvidia.com/gpumem-percentage": "100"})], {}),
    ("8x100%", [("vllm", {"nvidia.com/gpu": "8", "nvidia.com/gpumem-percentage": "100"})], {}),
    (
        "2 containers",
        [
            ("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
            ("b", {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "25"}),
        ],
        {},
    ),
]


def shape_pods() -> list[tuple[str, PodInfo]]:
    out = []
    for i, (label, containers, labels) in enumerate(SHAPES):
        pod: dict[str, Any] = {
            "metadata": {"name": f"fit-{i}", "namespace": "bench", "uid": f"uid-fit-{i}", "labels": labels},
            "spec": {"containers": [{"name": n, "resources": {"limits": lim}} for n, lim in containers]},
        }
        out.append((label, pod_info(pod)))
    return out


def with_nvlink(state: ClusterState) -> ClusterState:
    """The same cluster with NVLink pairs (2k, 2k+1) and GPUs 0-3 / 4-7 on NUMA nodes 0 / 1 on every node."""
    out = ClusterState(state.config)
    for node in state.nodes.values():
        inv = node.inventory
        by_index = {g.index: g.uuid for g in inv.gpus}
        gpus = tuple(
            dataclasses.replace(
                g, nvlink_peers=(by_index[g.index ^ 1],) if g.index ^ 1 in by_index else (), numa=g.index // 4
            )
            for g in inv.gpus
        )
        out.upsert_node(dataclasses.replace(inv, gpus=gpus))
    for key, a in state.assignments.items():
        if out.check(a) is None:
            out.apply(key, a, state._host.get(key, HostUse()))
    if hasattr(out, "classify"):
        out.classify()
    return out


def run(state: ClusterState, passes: int, learn: int) -> list[tuple[str, float, str, int]]:
    """(shape, least us a node over the passes, digest, feasible nodes) per shape."""
    names = sorted(state.nodes)
    out = []
    for label, pod in shape_pods():
        best = float("inf")
        digest = ""
        feasible = 0
        for p in range(passes):
            planner = learned_planner(state, learn, "default")
            gc.collect()
            gc.freeze()  # as the extender freezes its heap after the lists: no pass walks the state
            h = hashlib.sha256()
            results = []
            t = time.process_time()
            for name in names:
                results.append(planner.evaluate_node(name, pod))
            best = min(best, time.process_time() - t)
            if p == 0:
                for name, r in zip(names, results, strict=True):
                    if r.placement is not None:
                        feasible += 1
                        h.update(f"F{name}{r.placement}{r.score.hex()}".encode())
                    else:
                        h.update(f"X{name}{r.failure}".encode())
                digest = h.hexdigest()[:16]
        out.append((label, best / len(names) * 1e6, digest, feasible))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--learn", type=int, default=1100, help="pods the policy observes first (as cold_shape.py)")
    ap.add_argument("--cluster", choices=("usual", "packed", "both"), default="both")
    ap.add_argument("--nvlink", action="store_true", help="NVLink pairs and two NUMA nodes on every node")
    ap.add_argument("--shapes", default="", help="comma-separated shape labels to run (default: all)")
    args = ap.parse_args()
    if args.shapes:
        keep = set(args.shapes.split(","))
        SHAPES[:] = [s for s in SHAPES if s[0] in keep]
    for kind in ("usual", "packed") if args.cluster == "both" else (args.cluster,):
        make = usual_state if kind == "usual" else packed_state
        state = make(args.nodes, args.gpus, args.seed)
        if args.nvlink:
            state = with_nvlink(state)
        tag = kind + (" nvlink" if args.nvlink else "")
        for label, us, digest, feasible in run(state, args.passes, args.learn):
            print(
                f"{tag:13} {args.nodes} nodes x {args.gpus} GPUs  {label:14} {us:7.1f} us a node  "
                f"({feasible} feasible)  digest {digest}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
