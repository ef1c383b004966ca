"""The placement core interpreted against the same sources compiled with mypyc (kube_vgpu_dev.native), same run.

Builds the compiled tree (or takes `--tree`), then runs the same benchmarks from both trees, interleaved `--rounds`
times, and prints each figure side by side with the ratio compiled / interpreted:

* the cold pass (`cold_shape.py --shapes all --each --digest`): each shape's first evaluation over every node, least
  CPU of `--passes` passes and of the rounds; with `--callgrind`, instructions instead (load-proof, ~5 min a tree);
* the warm loop (`planner_profile.py warm`, 500 rotating names, each pod filtered, prioritized and bound through the
  extender's service, pydantic and orjson included): CPU a pod, least of the rounds.

Every digest (each node's placement, score and failure, the priorities; the warm loop's answers) must be equal in
both trees: the exit status is 1 where one differs, whatever the speed.

    python benchmarks/native_speed.py [--nodes 5000] [--rounds 2] [--passes 2] [--tree DIR] [--callgrind]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kube_vgpu_dev.native import NativeBuildError, build, missing_tools  # noqa: E402

_DIGEST = re.compile(r"^(\w+)\s+\d+ nodes .*digest (\w+)$")
_EACH = re.compile(r"([^,]+?) (\d+(?:\.\d+)?)(?:,|$)")
_CALLGRIND = re.compile(r"^callgrind (\w+):(\S+): ([\d.,]+) M instructions$")
_WARM = re.compile(r"^warm: \d+ pods, CPU ([\d.]+) ms a pod$")
_WARM_DIGEST = re.compile(r"^digest (\w+) over")


def _run(tree: Path, script: str, args: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / script), *args],
        cwd=tree,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} in {tree} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def cold(tree: Path, a: argparse.Namespace) -> tuple[dict[str, float], dict[str, str]]:
    """Each (cluster, shape)'s figure (ms, or M instructions with --callgrind) and each cluster's digest."""
    args = ["--nodes", str(a.nodes), "--shapes", "all", "--cluster", a.cluster, "--passes", str(a.passes)]
    args += ["--policy", a.policy]
    figures: dict[str, float] = {}
    digests: dict[str, str] = {}
    if a.callgrind:
        for line in _run(tree, "cold_shape.py", [*args, "--callgrind"]).splitlines():
            if m := _CALLGRIND.match(line):
                figures[f"{m[1]} {m[2]}"] = float(m[3].replace(",", ""))
    out = _run(tree, "cold_shape.py", [*args, "--each", "--digest"]).splitlines()
    for i, line in enumerate(out):
        if m := _DIGEST.match(line):
            digests[m[1]] = m[2]
            if not a.callgrind and i + 1 < len(out):
                for shape, ms in _EACH.findall(out[i + 1].strip()):
                    figures[f"{m[1]} {shape.strip()}"] = float(ms)
    return figures, digests


def warm(tree: Path, a: argparse.Namespace) -> tuple[float, str]:
    args = ["warm", "--nodes", str(a.nodes), "--pods", str(a.warm_pods), "--learn", "100", "--sample", "500"]
    out = _run(tree, "planner_profile.py", [*args, "--policy", a.policy])
    cpu = next(float(m[1]) for line in out.splitlines() if (m := _WARM.match(line)))
    digest = next(m[1] for line in out.splitlines() if (m := _WARM_DIGEST.match(line)))
    return cpu, digest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--cluster", choices=["usual", "packed", "both"], default="both")
    ap.add_argument("--policy", default="default", help="node policy of both benchmarks")
    ap.add_argument("--passes", type=int, default=2, help="cold passes a run (the least is kept)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved runs of each tree (the least is kept)")
    ap.add_argument("--warm-pods", type=int, default=300, help="warm loop pods (0: no warm loop)")
    ap.add_argument("--tree", type=Path, help="a compiled tree made before (python -m kube_vgpu_dev native DIR)")
    ap.add_argument("--callgrind", action="store_true", help="cold pass: instructions (callgrind) as well as digests")
    a = ap.parse_args()
    tree = a.tree
    if tree is None:
        why = missing_tools()
        if why is not None:
            print(f"cannot compile here: {why}", file=sys.stderr)
            return 2
        tree = Path(tempfile.mkdtemp(prefix="kube-vgpu-native-")) / "tree"
        print(f"compiling the placement core into {tree} (~1.5 min) ...", flush=True)
        try:
            build(tree)
        except NativeBuildError as exc:
            print(exc, file=sys.stderr)
            return 1
    trees = {"interpreted": ROOT, "compiled": tree}
    best: dict[str, dict[str, float]] = {k: {} for k in trees}
    warm_cpu: dict[str, float] = {}
    digests: dict[str, set[str]] = {}
    for r in range(a.rounds):
        for kind, t in trees.items():
            figures, cluster_digests = cold(t, a)
            for key, x in figures.items():
                best[kind][key] = min(best[kind].get(key, x), x)
            for cluster, d in cluster_digests.items():
                digests.setdefault(f"cold {cluster}", set()).add(d)
            if a.warm_pods:
                cpu, d = warm(t, a)
                warm_cpu[kind] = min(warm_cpu.get(kind, cpu), cpu)
                digests.setdefault("warm", set()).add(d)
            print(f"round {r + 1}/{a.rounds}: {kind} done", flush=True)
    unit = "M instructions" if a.callgrind else "ms CPU (least)"
    print(f"\n{a.nodes} nodes x 8 GPUs; cold pass, {unit}: interpreted / compiled (ratio)")
    ratios = []
    for key, x in best["interpreted"].items():
        y = best["compiled"].get(key)
        if y is None:
            continue
        ratio = y / x if x else float("nan")
        if x >= 1.0:
            ratios.append(ratio)
        print(f"  {key:34} {x:9.1f} {y:9.1f}  ({ratio:.2f}x)")
    if ratios:
        print(f"  median ratio over the shapes of >= 1 {unit.split()[0]}: {statistics.median(ratios):.2f}x")
    if warm_cpu:
        w0, w1 = warm_cpu["interpreted"], warm_cpu["compiled"]
        print(f"warm loop, 500 names, CPU a pod incl. /bind: {w0:.3f} / {w1:.3f} ms ({w1 / w0:.2f}x)")
    same = all(len(v) == 1 for v in digests.values())
    for what, v in sorted(digests.items()):
        print(f"digest {what}: {' '.join(sorted(v))}" + ("" if len(v) == 1 else "  DIFFERENT"))
    print("decisions: identical" if same else "decisions: DIFFER between the trees")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
