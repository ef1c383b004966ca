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

`--shapes multi` times pods asking more than one vGPU instead (`MULTI`: 2 x 30 %, a 2 x 20 % decode, 2, 4 and 8
whole cards, a two-container prefill), `all` both; `--each` prints every shape's figure.

`--digest` prints a hash of every evaluation (each node's placement, score, failure reason and the priorities), to
compare two versions of the code on the same clusters: the decisions must be byte-identical.

`--where` says where each shape's pass goes: the nodes it evaluates in full (`fit_node` and the scores: the first node
of each node class, and of each split of a class whose GPU states tie), replayed alone in the same order on a fresh
planner that learnt the same (so the same memos fill), against the whole pass; and how many classes, split classes
and split answers the pass made. The rest of a pass is every other node taking its class's answer, and the rank mapping.

`--rescorings` replays `extender_latency.py`'s phases instead, in-process through the extender's own service as its
process builds it (the file source, the heap frozen after the load, `gcpause.settle` after each pass), without HTTP:
no-GPU cycles, the 12 templates' first pods, then `--learn` learning pods, each a /filter + /prioritize over every
node. It prints the CPU of each new shape and of each learning re-scoring (a cycle over 4x the phase's median) as
p50 / p99 / max, and the full (gen-2) garbage collections that fell into them, timed by `gc.callbacks`.

    python benchmarks/cold_shape.py [--nodes 5000] [--passes 3] [--digest] [--shapes single|multi|all] [--each]
    python benchmarks/cold_shape.py --where [--cluster usual] [--shapes all]
    python benchmarks/cold_shape.py --rescorings [--nodes 5000] [--learn 100] [--passes 3]
    python benchmarks/cold_shape.py --callgrind [--cluster usual] [--shapes multi]

`--callgrind` runs one pass under valgrind's callgrind, counting only each shape's `evaluate` + `priorities` (the
cluster's build and the learning are not counted, nor garbage collection: it is collected before each shape and off
while it runs), and prints each shape's instructions: figures that the box's other work does not move, to compare two
versions of the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import callgrind_windows
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
    if hasattr(state, "classify"):  # as the extender does after its lists (not at the commits before it)
        state.classify()
    return state


def shapes() -> list[PodInfo]:
    rng = random.Random(1)
    return [pod_info(make_pod(10**7 + t, rng, template=t)) for t in range(len(TEMPLATES))]


# Pods asking more than one vGPU: (label, containers as (count, memory %, cores %), role, model).
MULTI: tuple[tuple[str, tuple[tuple[int, int, int], ...], str | None, str], ...] = (
    ("2x30%", ((2, 30, 30),), None, "model-0"),
    ("2x20% decode", ((2, 20, 20),), "decode", "model-1"),
    ("2x100%", ((2, 100, 100),), None, "model-0"),
    ("4x100%", ((4, 100, 100),), None, "model-0"),
    ("8x100%", ((8, 100, 100),), None, "model-0"),
    ("2 containers 25%+50%", ((1, 25, 40), (1, 50, 50)), "prefill", "model-2"),
)


def multi_shapes() -> list[PodInfo]:
    """`MULTI`'s pods: several slices each (the cold pass's worst case before node classes took them)."""
    pods = []
    for i, (_, containers, role, model) in enumerate(MULTI):
        labels = {"llm-d.ai/model": model} | ({"llm-d.ai/role": role} if role else {})
        specs = [
            {
                "name": f"c{k}",
                "resources": {
                    "limits": {
                        "nvidia.com/gpu": str(count),
                        "nvidia.com/gpumem-percentage": str(mem),
                        "nvidia.com/gpucores": str(cores),
                    }
                },
            }
            for k, (count, mem, cores) in enumerate(containers)
        ]
        meta = {"name": f"multi-{i}", "namespace": "bench", "uid": f"multi-{i}", "labels": labels}
        pods.append(pod_info({"metadata": meta, "spec": {"containers": specs}}))
    return pods


def shapes_of(kind: str) -> tuple[list[str], list[PodInfo]]:
    """The labels and pods of `--shapes` `kind`: the 12 templates (single), `MULTI` (multi) or both (all)."""
    single = ([f"tpl{t}" for t in range(len(TEMPLATES))], shapes()) if kind in ("single", "all") else ([], [])
    multi = ([m[0] for m in MULTI], multi_shapes()) if kind in ("multi", "all") else ([], [])
    return single[0] + multi[0], single[1] + multi[1]


def learned_planner(state: ClusterState, learn: int, policy: str) -> Planner:
    """`policy`: a node policy, or `node+gpu` with a cluster GPU-policy override (`--gpu-policy`)."""
    node, _, gpu = policy.partition("+")
    state.config = dataclasses.replace(state.config, node_policy=node, gpu_policy=gpu or None)
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


GATE_ENV = "COLD_SHAPE_GATE"  # set by --callgrind for the child run under valgrind


def gate(tag: str) -> None:
    """Under --callgrind: wait while the parent switches counting (benchmarks.callgrind_windows)."""
    callgrind_windows.gate(GATE_ENV, tag)


def callgrind(argv: list[str]) -> int:
    """Re-run this script under valgrind (one pass), counting each shape's pass alone; print its instructions."""
    args = [x for x in argv if x != "--callgrind"]
    windows, rc = callgrind_windows.run_windows(
        __file__,
        [*args, "--passes", "1"],
        GATE_ENV,
        lambda line: print(line, end="", flush=True),
        keep=bool(os.environ.get("COLD_SHAPE_KEEP")),
    )
    for label, total in windows:  # with --cluster both: usual's shapes, then packed's
        print(f"callgrind {label}: {total / 1e6:,.1f} M instructions")
    return rc


def run(
    state: ClusterState,
    passes: int,
    learn: int,
    policy: str,
    pods: list[PodInfo],
    labels: list[str] | None = None,
    cluster: str = "",
) -> tuple[list[float], str]:
    """Each shape's least CPU over `passes` fresh planners, and a digest of the first pass's answers; `cluster`
    prefixes the --callgrind windows' labels."""
    best = [float("inf")] * len(pods)
    h = hashlib.sha256()
    for p in range(passes):
        planner = learned_planner(state, learn, policy)
        for i, pod in enumerate(pods):
            tag = f"{cluster}{labels[i] if labels else i}".replace(" ", "_").replace("%", "pct").replace("+", "_")
            counted = GATE_ENV in os.environ
            if counted:  # no collection in a counted window: where one falls moves with any allocation elsewhere
                gc.collect()
                gc.disable()
            gate(f"start-{tag}")
            t = time.process_time()
            ev = planner.evaluate(pod)
            prios = planner.priorities(ev)
            best[i] = min(best[i], time.process_time() - t)
            gate(f"stop-{tag}")
            if counted:
                gc.enable()
            if p == 0:
                digest_of(ev, prios, h)
    return best, h.hexdigest()[:16]


def where(state: ClusterState, passes: int, learn: int, policy: str, labels: list[str], pods: list[PodInfo]) -> None:
    """Print, per shape, the pass's CPU, how much of it the full evaluations take (replayed alone) and the classes."""
    import gc

    import vgpu.planner as planner_module
    from vgpu.fit import ShapeMemo, fit_node

    fulls: dict[int, list[str]] = {}
    splits: dict[int, tuple[int, int, int]] = {}

    def recording(node: Any, *args: Any, **kwargs: Any) -> Any:
        fulls[current[0]].append(node.name)
        return fit_node(node, *args, **kwargs)

    current = [0]
    planner_module.fit_node = recording  # type: ignore[assignment]
    try:
        planner = learned_planner(state, learn, policy)
        for i, pod in enumerate(pods):
            current[0] = i
            fulls[i] = []
            known = {id(c) for c in planner._classes.values()}
            planner.evaluate(pod)
            # This shape's node classes: those the pass made (none where it shares another shape's evaluation).
            made = [c for c in planner._classes.values() if id(c) not in known]
            split = [s for c in made for s in c.values() if s.split is not None]
            splits[i] = (sum(len(c) for c in made), len(split), sum(len(s.splits or {}) for s in split))
    finally:
        planner_module.fit_node = fit_node
    whole = [float("inf")] * len(pods)
    full = [float("inf")] * len(pods)
    for _ in range(passes):
        for replay in (False, True):
            planner = learned_planner(state, learn, policy)
            gc.collect()
            gc.freeze()
            gc.disable()
            try:
                for i, pod in enumerate(pods):
                    t = time.process_time()
                    if replay:  # the same nodes in the same order, with a shape memo and classes as the pass keeps
                        node_policy, rank = planner._resolve(pod)
                        memo: ShapeMemo = ShapeMemo()
                        classes_of: dict[int, Any] = {}
                        for name in fulls[i]:
                            planner._evaluate(name, pod, node_policy, rank, memo, classes_of)
                        full[i] = min(full[i], time.process_time() - t)
                    else:
                        planner.priorities(planner.evaluate(pod))
                        whole[i] = min(whole[i], time.process_time() - t)
            finally:
                gc.enable()
                gc.unfreeze()
    print("  shape: pass CPU ms | full evaluations: how many, CPU ms, us each | classes, split classes, split answers")
    for i, label in enumerate(labels):
        n = len(fulls[i])
        c, sc, sa = splits[i]
        print(
            f"  {label:22} {whole[i] * 1000:7.1f} | {n:5d} {full[i] * 1000:7.1f} {full[i] * 1e6 / n if n else 0.0:6.1f}"
            f" | {c:4d} {sc:4d} {sa:4d}",
            flush=True,
        )


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def rescorings(nodes: int, gpus: int, seed: int, learn: int) -> tuple[list[float], list[float], list[float]]:
    """CPU ms of each new shape's cycle and of each learning re-scoring, and each full collection's ms among them."""
    import gc
    import json

    from benchmarks.extender_latency import make_cluster as cluster_doc
    from scheduler_extender import gcpause, schema
    from scheduler_extender.main import build_service
    from scheduler_extender.settings import load

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        doc = cluster_doc(nodes, gpus, rng)
        path.write_text(json.dumps(doc))
        names = [n["name"] for n in doc["nodes"]]
        gcpause.freeze_after_lists()  # as the extender's main does
        service, _, _ = build_service(
            load(flags={"source": "file", "cluster_file": str(path)}, env={}, config_file=None)
        )
    if hasattr(gcpause, "settle"):
        service.planner.after_pass = gcpause.settle  # as the extender's main does
    full: list[float] = []
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.process_time()
            else:
                full.append((time.process_time() - started[0]) * 1000)

    def cycle(pod: dict[str, Any]) -> tuple[float, list[float]]:
        n, t = len(full), time.process_time()
        out = service.filter(schema.ExtenderArgs.model_validate({"Pod": pod, "NodeNames": names}))
        passed = out.get("NodeNames") or []
        service.prioritize(schema.ExtenderArgs.model_validate({"Pod": pod, "NodeNames": passed}))
        return (time.process_time() - t) * 1000, full[n:]

    for i in range(200):
        cycle(make_pod(10**6 + i, rng, gpu=False))
    gc.callbacks.append(timed)
    try:
        cold = [cycle(make_pod(10**7 + t, rng, template=t)) for t in range(len(TEMPLATES))]
        learning = [cycle(make_pod(10**8 + i, rng)) for i in range(learn)]
    finally:
        gc.callbacks.remove(timed)
    slow = 4 * statistics.median(c for c, _ in learning)
    rescored = [x for x in learning if x[0] > slow]
    return [c for c, _ in cold], [c for c, _ in rescored], [g for _, gs in cold + rescored for g in gs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--learn", type=int, default=1100, help="pods the policy observes before the timed shapes")
    ap.add_argument(
        "--policy", default="default", help="a node policy, or NODE+GPU (e.g. default+spread: --gpu-policy)"
    )
    ap.add_argument("--cluster", choices=("usual", "packed", "both"), default="both")
    ap.add_argument("--digest", action="store_true", help="print a hash of every evaluation")
    ap.add_argument(
        "--shapes",
        choices=("single", "multi", "all"),
        default="single",
        help="the 12 one-slice templates, the multi-slice pods (MULTI) or both",
    )
    ap.add_argument("--each", action="store_true", help="print each shape's CPU ms too")
    ap.add_argument("--rescorings", action="store_true", help="replay extender_latency's phases through the service")
    ap.add_argument(
        "--where", action="store_true", help="each pass's full evaluations (replayed alone) against the pass"
    )
    ap.add_argument("--callgrind", action="store_true", help="each shape's instructions, one pass under callgrind")
    args = ap.parse_args()
    if args.callgrind:
        return callgrind(sys.argv[1:])
    if args.rescorings:
        learn = 100 if args.learn == 1100 else args.learn
        for p in range(args.passes):
            cold, rescored, full = rescorings(args.nodes, args.gpus, args.seed, learn)
            print(
                f"pass {p}: {args.nodes} nodes x {args.gpus} GPUs, CPU ms: new shapes ({len(cold)}) p50 "
                f"{statistics.median(cold):6.1f} p99 {_pct(cold, 99):6.1f} max {max(cold):6.1f}; re-scorings "
                f"({len(rescored)} of {learn} learning pods) p50 {statistics.median(rescored) if rescored else 0:6.1f} "
                f"p99 {_pct(rescored, 99) if rescored else 0:6.1f} max {max(rescored, default=0):6.1f}; "
                f"full collections among them {len(full)}, ms {' '.join(f'{g:.0f}' for g in full) or '-'}",
                flush=True,
            )
        return 0
    for kind in ("usual", "packed") if args.cluster == "both" else (args.cluster,):
        make = usual_state if kind == "usual" else packed_state
        state = make(args.nodes, args.gpus, args.seed)
        distinct = len({tuple(u.state_key for u in n.gpus) for n in state.nodes.values()})
        multisets = len({frozenset(Counter(u.state_key for u in n.gpus).items()) for n in state.nodes.values()})
        labels, pods = shapes_of(args.shapes)
        if args.where:
            print(
                f"{kind:6} {args.nodes} nodes x {args.gpus} GPUs, policy {args.policy}, least of {args.passes} passes"
            )
            where(state, args.passes, args.learn, args.policy, labels, pods)
            continue
        best, digest = run(state, args.passes, args.learn, args.policy, pods, labels, f"{kind}:")
        ms = [b * 1000 for b in best]
        print(
            f"{kind:6} {args.nodes} nodes x {args.gpus} GPUs ({distinct} distinct node states, {multisets} as multisets), policy {args.policy}: "
            f"CPU per new shape median {statistics.median(ms):7.1f} ms, min {min(ms):6.1f}, max {max(ms):6.1f}"
            + (f"  digest {digest}" if args.digest else "")
        )
        if args.each:
            print("  " + ", ".join(f"{lab} {m:.1f}" for lab, m in zip(labels, ms, strict=True)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
