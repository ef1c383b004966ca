"""Run `vgpu replay` on the shipped openb traces and compare with the FGD paper's figures at x = 100.

    python benchmarks/openb_compare.py --seeds 42-51 --policy default --policy fgd [--traces default,gpushare40]

Writes benchmarks/results/openb_<trace>.json (+ .png) and prints a table next to the paper's numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vgpu_cli.main import main as vgpu

DATA = Path(__file__).parent / "data" / "openb"
# Mean unallocated GPU % at arrived = 100 % from the paper (REFERENCE.md), per trace and policy.
PAPER: dict[str, dict[str, float]] = {
    "default": {
        "random": 13.70,
        "dotprod": 9.38,
        "gpu-clustering": 8.35,
        "gpu-packing": 8.22,
        "bestfit": 7.14,
        "fgd": 4.77,
    },
    "gpushare40": {
        "random": 15.14,
        "dotprod": 10.70,
        "gpu-clustering": 10.24,
        "gpu-packing": 10.23,
        "bestfit": 8.56,
        "fgd": 6.04,
    },
    "gpushare60": {
        "random": 17.19,
        "dotprod": 13.18,
        "gpu-clustering": 13.10,
        "gpu-packing": 12.85,
        "bestfit": 10.94,
        "fgd": 8.75,
    },
    "gpushare80": {
        "random": 19.38,
        "dotprod": 15.86,
        "gpu-clustering": 15.50,
        "gpu-packing": 15.35,
        "bestfit": 13.34,
        "fgd": 10.92,
    },
    "gpushare100": {
        "random": 21.10,
        "dotprod": 18.02,
        "gpu-clustering": 17.78,
        "gpu-packing": 17.87,
        "bestfit": 15.38,
        "fgd": 13.36,
    },
    "multigpu20": {
        "random": 13.08,
        "dotprod": 8.15,
        "gpu-clustering": 6.66,
        "gpu-packing": 6.50,
        "bestfit": 6.27,
        "fgd": 4.47,
    },
    "multigpu30": {
        "random": 13.37,
        "dotprod": 6.89,
        "gpu-clustering": 5.45,
        "gpu-packing": 5.30,
        "bestfit": 5.43,
        "fgd": 3.64,
    },
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--policy", action="append")
    ap.add_argument("--traces", default=",".join(PAPER))
    ap.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    policies = args.policy or ["default", "fgd"]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.traces.split(","):
        target = out / f"openb_{name}.json"
        argv = ["replay", "--nodes", str(DATA / "openb_node_list_gpu_node.csv")]
        argv += ["--pods", str(DATA / f"openb_pod_list_{name}.csv"), "--seeds", args.seeds]
        argv += [a for p in policies for a in ("--policy", p)]
        argv += ["--out", str(target), "--plot", str(target.with_suffix(".png"))]
        if vgpu(argv) != 0:
            return 1
        doc = json.loads(target.read_text())
        for res in doc if isinstance(doc, list) else [doc]:
            at = res["unallocated_pct"]["100"]
            ref = PAPER[name].get(res["policy"], PAPER[name]["fgd"])
            print(
                f"{name:>12} {res['policy']:>15}: mean {at['mean']:.2f} ± {at['sd']:.2f}, "
                f"median {at['median']:.2f}  (paper {'FGD ' if res['policy'] not in PAPER[name] else ''}{ref:.2f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
