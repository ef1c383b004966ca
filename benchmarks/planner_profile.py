"""Where the extender's per-pod CPU goes, in-process (no HTTP): the verbs called as the server calls them.

Two workloads, both through `ExtenderService.filter` / `prioritize` / `bind` with pydantic's parse of the request
bytes and orjson's dump of the answer (what the HTTP handlers do), on the file source:

* ``warm``: `extender_latency.py`'s cluster (5,000 nodes x 8 GPUs at ~50 %) and 12 llm-d templates: the 12 first
  pods, `--learn` unbound learning pods over every name, their holds expired, then `--pods` warm pods each over
  `--sample` rotating names (0: all), filtered, prioritized and bound to the best node.
* ``scale``: `scale.py`'s workload replayed: its `--nodes` empty nodes (kube_vgpu_dev's inventory; host CPU and memory not tracked, as the kube source does not), its
  pod sequence (`scale.shapes`: 60 % P/D slices of 8 models, 25 % whole cards, 15 % 2- or 4-GPU pods) created at
  `--rate` pods/s (a simulated clock drives relearns and holds), each over kube-scheduler's window (the adaptive
  percentageOfNodesToScore: 420 names at 1,000 nodes, rotating from where the last one stopped), bound to the best
  node; after each wave every pod is deleted (released through the pod watch's handler), as scale.py does.

Prints CPU per pod (process time), node evaluations per pod (and how many ran `fit_node`), the time in the main
planner calls per pod, a digest of every answer (to check that a change leaves every decision as it was), and with
`--profile` cProfile's top functions. `--callgrind` runs the measured window under valgrind and prints its
instruction count per pod (load-proof, slow: use small `--pods`).

    python benchmarks/planner_profile.py warm --nodes 5000 --pods 300 --learn 100 --sample 500
    python benchmarks/planner_profile.py scale --nodes 1000 --pods 2000 --waves 2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import hashlib
import json
import os
import pstats
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vgpu.planner as planner_mod
from benchmarks import callgrind_windows
from benchmarks import extender_latency as lat
from benchmarks import scale as scale_bench
from kube_vgpu_dev.stack import GPU_MEM, SPLIT
from scheduler_extender import schema
from scheduler_extender.main import build_service
from scheduler_extender.service import ExtenderService
from scheduler_extender.settings import ExtenderSettings

GATE_ENV = "PLANNER_PROFILE_GATE"  # set by --callgrind for the child run under valgrind


class Clock:
    """A simulated monotonic clock for the learning's relearn interval and the soft holds' TTL."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Driver:
    """Calls the verbs as the HTTP handlers do and hashes every answer."""

    def __init__(self, svc: ExtenderService, answers: Path | None = None) -> None:
        self.svc = svc
        self.digest = hashlib.sha256()
        self.raw = hashlib.sha256()  # every answer's bytes as sent, FailedNodes in the order the server wrote them
        self.calls = 0
        self.answers = None if answers is None else answers.open("wb")  # one line an answer, to find a difference

    def call(self, verb: str, model: Any, body: object) -> Any:
        args = model.model_validate_json(orjson.dumps(body))
        out = orjson.dumps(getattr(self.svc, verb)(args))
        self.raw.update(verb.encode() + out)
        # FailedNodes is a map (kube-scheduler reads it as one): its order, which follows a memo's history, is no
        # part of a decision, so the digest takes every map's keys sorted.
        canon = orjson.dumps(orjson.loads(out), option=orjson.OPT_SORT_KEYS)
        self.digest.update(verb.encode() + canon)
        if self.answers is not None:
            self.answers.write(verb.encode() + b" " + canon + b"\n")
        self.calls += 1
        return orjson.loads(out)

    def cycle(self, pod: dict[str, Any], names: list[str], *, bind: bool) -> str | None:
        """filter, prioritize and (with `bind`) bind to the best-scored node (the first of equals); the node bound."""
        f = self.call("filter", schema.ExtenderArgs, {"Pod": pod, "Nodes": None, "NodeNames": names})
        prios = self.call("prioritize", schema.ExtenderArgs, {"Pod": pod, "Nodes": None, "NodeNames": f["NodeNames"]})
        if not bind or not prios:
            return None
        best = max(prios, key=lambda h: h["Score"])["Host"]
        m = pod["metadata"]
        r = self.call(
            "bind",
            schema.ExtenderBindingArgs,
            {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": best},
        )
        if r["Error"]:
            raise RuntimeError(f"bind of {m['name']} to {best}: {r['Error']}")
        return str(best)


def service(doc: dict[str, Any], policy: str, tmp: Path, clock: Clock, *, learning_clock: bool) -> ExtenderService:
    """The extender's service on a file source of `doc`; the holds on `clock`, and the learning's relearn interval too
    with `learning_clock` (else on the real clock, as extender_latency.py's server: no relearn in a short window)."""
    path = tmp / "cluster.json"
    path.write_text(json.dumps(doc))
    settings = ExtenderSettings.model_validate({"source": "file", "cluster_file": str(path), "node_policy": policy})
    svc = build_service(settings)[0]
    svc.holds.clock = clock
    if learning_clock:
        svc.learning.clock = clock
    return svc


class Counts:
    """Node evaluations (`Planner._evaluate`), full fits (`fit_node`) and time in the main planner calls, while on."""

    def __init__(self, *, timed: bool = True) -> None:
        self.timed = timed  # off under cProfile: a process_time call a wrapped call would weigh on its figures
        self.on = False
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.shapes: collections.Counter[str] = collections.Counter()  # full fits by the pod's GPU count

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved: list[tuple[Any, str, Any]] = []

        def wrap(owner: Any, name: str, *, timed: bool) -> None:
            fn = getattr(owner, name)
            saved.append((owner, name, fn))

            def counted(*a: Any, **k: Any) -> Any:
                if not self.on:
                    return fn(*a, **k)
                self.calls[name] += 1
                if name == "fit_node":
                    self.shapes[f"{a[1].request.containers[0].count if a[1].request.containers else 0} GPU"] += 1
                if not timed or not self.timed:
                    return fn(*a, **k)
                t = time.process_time()
                try:
                    return fn(*a, **k)
                finally:
                    self.seconds[name] += time.process_time() - t

            setattr(owner, name, counted)

        wrap(planner_mod.Planner, "_evaluate", timed=False)
        wrap(planner_mod, "fit_node", timed=False)
        for name in ("_memo_for", "_freshen", "_refresh", "filter_names", "priorities_for", "evaluate_beside"):
            wrap(planner_mod.Planner, name, timed=True)
        for name in ("filter", "prioritize", "bind"):
            wrap(ExtenderService, name, timed=True)
        try:
            yield
        finally:
            for owner, name, fn in reversed(saved):
                setattr(owner, name, fn)

    def report(self, pods: int) -> None:
        print(
            f"  node evaluations a pod {self.calls['_evaluate'] / pods:.2f}, of them full fit_node "
            f"{self.calls['fit_node'] / pods:.2f} ({', '.join(f'{k}: {v / pods:.2f}' for k, v in sorted(self.shapes.items()))})"
        )
        for name, secs in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            print(f"  {name:16s} {secs / pods * 1e3:7.3f} ms a pod ({self.calls[name] / pods:.2f} calls)")


def gate(tag: str) -> None:
    """Under --callgrind: wait while the parent switches counting (benchmarks.callgrind_windows)."""
    callgrind_windows.gate(GATE_ENV, tag)


def measure(
    label: str, pods: list[Any], step: Callable[[Any], None], counts: Counts, profile: int, *, gated: bool = True
) -> float:
    """Run `step` over `pods` with counting on; the CPU per pod (ms)."""
    tag = label.replace(" ", "_")
    if gated:
        gate(f"start-{tag}")
    prof = cProfile.Profile() if profile else None
    counts.on = True
    t0 = time.process_time()
    if prof:
        prof.enable()
    for p in pods:
        step(p)
    if prof:
        prof.disable()
    cpu = (time.process_time() - t0) / max(1, len(pods)) * 1e3
    counts.on = False
    if gated:
        gate(f"stop-{tag}")
    print(f"{label}: {len(pods)} pods, CPU {cpu:.3f} ms a pod")
    counts.report(max(1, len(pods)))
    if prof:
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(profile)
        st.sort_stats("cumtime").print_stats(profile)
    counts.calls.clear()
    counts.seconds.clear()
    counts.shapes.clear()
    return cpu


def run_warm(a: argparse.Namespace, tmp: Path) -> Driver:
    rng = random.Random(a.seed)
    ids = random.Random(99)
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128))  # the pods' UIDs, the same every run (the digest)
    doc = lat.make_cluster(a.nodes, 8, rng)
    names = [n["name"] for n in doc["nodes"]]
    clock = Clock()
    svc = service(doc, a.policy, tmp, clock, learning_clock=False)
    drv = Driver(svc, a.answers)
    for t in range(len(lat.TEMPLATES)):
        drv.cycle(lat.make_pod(10**7 + t, rng, template=t), names, bind=False)
    for i in range(a.learn):
        drv.cycle(lat.make_pod(10**8 + i, rng), names, bind=False)
    clock.now += 100  # the learning pods' holds expire (in a cluster their bind or its failure ends them)

    def window(i: int) -> list[str]:
        asked = names
        if a.sample:
            at = (i * a.sample) % len(names)
            asked = (names[at:] + names[:at])[: a.sample]
        return asked[: len(asked) // 2] + ghosts + asked[len(asked) // 2 :] if ghosts else asked

    ghosts = [f"no-gpu-{k}" for k in range(a.ghosts)]  # nodes without an inventory (no device plugin)

    counts = Counts(timed=not a.profile and GATE_ENV not in os.environ)
    with counts.installed():
        floor = [(lat.make_pod(2 * 10**6 + i, rng, gpu=False), window(i)) for i in range(a.floor)]
        measure("no-GPU floor", floor, lambda pw: drv.cycle(pw[0], pw[1], bind=False), counts, 0)
        batch = [(lat.make_pod(i, rng), window(i)) for i in range(a.pods)]
        measure("warm", batch, lambda pw: drv.cycle(pw[0], pw[1], bind=True), counts, a.profile)
    return drv


def scale_pod(name: str, labels: dict[str, str], limits: dict[str, str], uid: str) -> dict[str, Any]:
    body = scale_bench.pod_body(name, labels, limits, "w")
    body["metadata"] |= {"namespace": "scale", "uid": uid}
    return body


def window_size(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the adaptive percentageOfNodesToScore (pkg/scheduler/
    schedule_one.go, v1.34: 50 - nodes/125 %, at least 5 %, at least 100 nodes)."""
    if nodes < 100:
        return nodes
    pct = max(5, 50 - nodes // 125)
    return max(100, nodes * pct // 100)


def run_scale(a: argparse.Namespace, tmp: Path) -> Driver:
    nodes = [
        {
            "name": f"gpu-{i:05d}",
            "gpuTemplate": {"count": 8, "model": "H100-80GB", "memoryMiB": GPU_MEM, "split": SPLIT},
        }
        for i in range(a.nodes)
    ]
    doc = {"version": "v1", "nodes": nodes, "allocations": []}
    names = [n["name"] for n in nodes]
    clock = Clock()
    svc = service(doc, a.policy, tmp, clock, learning_clock=True)
    drv = Driver(svc, a.answers)
    size = window_size(a.nodes)
    cfg = scale_bench.Config(nodes=a.nodes, pods=a.pods, rate=a.rate, seed=a.seed)
    counts = Counts(timed=not a.profile and GATE_ENV not in os.environ)
    start = [0]
    cpus = []
    with counts.installed():
        for w in range(a.waves):
            bound: list[str] = []

            def step(p: tuple[str, dict[str, str], dict[str, str]], w: int = w, bound: list[str] = bound) -> None:
                name, labels, limits = p
                clock.now += 1 / a.rate
                at = start[0]
                asked = (names[at:] + names[:at])[:size]
                start[0] = (at + size) % len(names)
                pod = scale_pod(f"w{w}-{name}", labels, limits, f"uid-{w}-{name}")
                if drv.cycle(pod, asked, bind=True) is not None:
                    bound.append(pod["metadata"]["name"])

            cpus.append(measure(f"wave {w}", scale_bench.shapes(cfg), step, counts, a.profile, gated=w == a.waves - 1))
            print(f"  bound {len(bound)} of {a.pods}")
            with svc.lock:
                for pod_name in bound:
                    svc.sync.pod_event("DELETED", {"metadata": {"name": pod_name, "namespace": "scale"}})
            clock.now += 30
    return drv


def callgrind(argv: list[str]) -> int:
    """Re-run this script under valgrind, counting only the measured windows; print their instructions a pod."""
    pods: dict[str, int] = {}

    def line_of(line: str) -> None:
        print(line, end="", flush=True)
        if ": " in line and " pods, CPU " in line:
            label, rest = line.split(": ", 1)
            pods[label.replace(" ", "_")] = int(rest.split()[0])

    windows, rc = callgrind_windows.run_windows(__file__, [x for x in argv if x != "--callgrind"], GATE_ENV, line_of)
    for label, total in windows:
        n = pods.get(label, 0)
        print(f"callgrind {label}: {total:,} instructions" + (f", {total / n / 1e6:.3f} M a pod" if n else ""))
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=("warm", "scale"))
    ap.add_argument("--nodes", type=int, default=None, help="default: 5,000 (warm), 1,000 (scale)")
    ap.add_argument("--pods", type=int, default=None, help="measured pods (warm, default 300) or a wave's (2,000)")
    ap.add_argument("--learn", type=int, default=100, help="warm: unbound learning pods before the measured ones")
    ap.add_argument("--sample", type=int, default=500, help="warm: names a /filter (0: all)")
    ap.add_argument("--floor", type=int, default=100, help="warm: no-GPU pods measured first")
    ap.add_argument("--ghosts", type=int, default=0, help="warm: names without an inventory added to each /filter")
    ap.add_argument("--waves", type=int, default=2, help="scale: waves, each deleted at its end")
    ap.add_argument("--rate", type=float, default=50.0, help="scale: pods created a second (simulated clock)")
    ap.add_argument("--seed", type=int, default=None, help="default: 7 (warm), 1 (scale)")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions of the measured pods")
    ap.add_argument("--answers", type=Path, help="write every answer here, one a line (to diff two runs)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions of the last window (valgrind)")
    a = ap.parse_args(argv)
    if a.callgrind:
        return callgrind(argv)
    warm = a.workload == "warm"
    a.nodes = a.nodes or (5000 if warm else 1000)
    a.pods = a.pods or (300 if warm else 2000)
    a.seed = a.seed if a.seed is not None else (7 if warm else 1)
    with tempfile.TemporaryDirectory() as tmp:
        drv = run_warm(a, Path(tmp)) if warm else run_scale(a, Path(tmp))
    print(f"digest {drv.digest.hexdigest()[:16]} over {drv.calls} answers (raw bytes {drv.raw.hexdigest()[:16]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
