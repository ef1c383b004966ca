"""In-process CPU of the cold path: the first evaluation of a pod shape over every node (docs/extender.md,
"The cold path: a new shape and each relearn").

A shape seen for the first time, and every active shape after the default policy relearns, is evaluated on every
node: `/filter` then `/prioritize` over all names, no HTTP. Each pass makes a new planner (new policy, new caches),
lets it learn the benchmark's workload (`--learn` pods observed, as `extender_latency.py`'s learning phase does),
then times each of the 12 llm-d templates' first `evaluate` + `priorities`; per shape the least of `--passes`
passes is kept (the box's other work only ever adds), and the median over the shapes is reported.

Two clusters, both 5,000 nodes x 8 GPUs by default:
- `usual`: `extender_latency.py`'s own cluster (each GPU 0/25/50/75/100 % used at random, so nearly every node
  differs from every other);
- `packed`: what a running cluster of deployments looks like: a share of the nodes empty, the rest each holding one of
  a few dozen fills of the 12 templates' slices (llm-d roles and models), so many nodes are in the same state.

`--digest` prints a hash of every evaluation (each node's placement, score, failure reason and the priorities), to
compare two versions of the code on the same clusters: the decisions must be byte-identical.

    python benchmarks/cold_shape.py [--nodes 5000] [--passes 3] [--digest]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.extender_latency import GPU_MEM, TEMPLATES, make_cluster, make_pod
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.clusterfile import parse_cluster
from vgpu.planner import Evaluation, Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.roles import Role
from vgpu.state import ClusterState, HostUse


def usual_state(nodes: int, gpus: int, seed: int) -> ClusterState:
    inventories, allocations = parse_cluster(make_cluster(nodes, gpus, random.Random(seed)))
    return _state(inventories, allocations)


def packed_state(nodes: int, gpus: int, seed: int, *, patterns: int = 32, empty: float = 0.3) -> ClusterState:
    """`empty` of the nodes hold nothing; each other node holds one of `patterns` fills (GPUs filled in index order
    with the templates' slices, as a packing policy leaves them)."""
    rng = random.Random(seed)
    fills: list[list[list[tuple[int, str | None, str]]]] = []
    for _ in range(patterns):
        used = rng.randint(1, gpus)
        fill = []
        for _g in range(used):
            slices, room = [], 100
            while True:
                mem, cores, role, model = rng.choice(TEMPLATES)
                if max(mem, cores) > room or len(slices) >= 4:
                    break
                slices.append((mem, role, model))
                room -= max(mem, cores)
            fill.append([(m, r, mo) for m, r, mo in slices])
        fills.append(fill)  # type: ignore[arg-type]
    doc: dict[str, Any] = make_cluster(nodes, gpus, random.Random(seed))
    doc["allocations"] = []
    inventories, _ = parse_cluster(doc)
    allocations: list[tuple[str, Assignment]] = []
    by_tpl = {(t[0], t[2], t[3]): t for t in TEMPLATES}
    for n, inv in enumerate(inventories):
        if rng.random() < empty:
            continue
        for g, slices in enumerate(fills[rng.randrange(patterns)]):
            for k, (mem, role, model) in enumerate(slices):  # type: ignore[misc]
                cores = by_tpl[(mem, role, model)][1]
                dev = DeviceSlice(uuid=f"GPU-node-{n:05d}-{g}", index=g, memory_mib=GPU_MEM * mem // 100, cores=cores)
                a = Assignment(
                    node=inv.name,
                    containers=(ContainerAssignment("vllm", (dev,)),),
                    role=Role(role) if role else Role.PREFILL_DECODE,
                    model=f"bench/{model}",
                )
                allocations.append((f"bg/p-{n}-{g}-{k}", a))
    return _state(inventories, allocations)


def _state(inventories: list[Any], allocations: list[tuple[str, Assignment]]) -> ClusterState:
    state = ClusterState()
    for inv in inventories:
        state.upsert_node(inv)
    for key, a in allocations:
        if state.check(a) is None:  # a packed fill's slice the role rules refuse is left out, on every such node
            state.apply(key, a, HostUse())
    return state


def shapes() -> list[PodInfo]:
    rng = random.Random(1)
    return [pod_info(make_pod(10**7 + t, rng, template=t)) for t in range(len(TEMPLATES))]


def learned_planner(state: ClusterState, learn: int, policy: str) -> Planner:
    state.config = dataclasses.replace(state.config, node_policy=policy)
    planner = Planner(state)
    rng = random.Random(2)
    for i in range(learn):
        planner.observe(pod_info(make_pod(10**8 + i, rng)))
    return planner


def digest_of(ev: Evaluation, prios: dict[str, int], h: Any) -> None:
    for name, r in ev.feasible.items():
        h.update(f"F{name}{r.placement}{r.score!r}".encode())
    for name, why in ev.failed.items():
        h.update(f"X{name}{why}".encode())
    for name, why in ev.unresolvable.items():
        h.update(f"U{name}{why}".encode())
    h.update(repr(sorted(prios.items())).encode())


def run(state: ClusterState, passes: int, learn: int, policy: str) -> tuple[list[float], str]:
    pods = shapes()
    best = [float("inf")] * len(pods)
    h = hashlib.sha256()
    for p in range(passes):
        planner = learned_planner(state, learn, policy)
        for i, pod in enumerate(pods):
            t = time.process_time()
            ev = planner.evaluate(pod)
            prios = planner.priorities(ev)
            best[i] = min(best[i], time.process_time() - t)
            if p == 0:
                digest_of(ev, prios, h)
    return best, h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--learn", type=int, default=1100, help="pods the policy observes before the timed shapes")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--cluster", choices=("usual", "packed", "both"), default="both")
    ap.add_argument("--digest", action="store_true", help="print a hash of every evaluation")
    args = ap.parse_args()
    for kind in ("usual", "packed") if args.cluster == "both" else (args.cluster,):
        make = usual_state if kind == "usual" else packed_state
        state = make(args.nodes, args.gpus, args.seed)
        distinct = len({tuple(u.state_key for u in n.gpus) for n in state.nodes.values()})
        multisets = len({frozenset(Counter(u.state_key for u in n.gpus).items()) for n in state.nodes.values()})
        best, digest = run(state, args.passes, args.learn, args.policy)
        ms = [b * 1000 for b in best]
        print(
            f"{kind:6} {args.nodes} nodes x {args.gpus} GPUs ({distinct} distinct node states, {multisets} as multisets), policy {args.policy}: "
            f"CPU per new shape median {statistics.median(ms):7.1f} ms, min {min(ms):6.1f}, max {max(ms):6.1f}"
            + (f"  digest {digest}" if args.digest else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
