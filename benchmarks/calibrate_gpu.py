"""Measure on a real GPU what the P/D performance model assumes (docs/pd-packing.md, "Calibration").

For each MPS active-thread percentage (the SM share), runs in a fresh process:
- decode: the time of one step of a Llama-3.1-8B-shaped layer stack at batch 1/16/64 (weights and a KV
  cache read as in decode; synthetic weights, no download), giving beta(s) and s_sat;
- prefill: a 4096-token forward of the same stack, giving throughput vs SM share (expected linear).
and, with two decode processes at once, the bandwidth contention (model: 2 x decode_mbu - 1).

Needs torch with CUDA and MPS (`nvidia-cuda-mps-control -d` is started and stopped here when possible).
Usage: python benchmarks/calibrate_gpu.py [--shares 20,35,50,100] [--layers 8] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128  # Llama-3.1-8B


def _worker(kind: str, batch: int, layers: int, context: int, iters: int) -> float:
    """Seconds per decode step or per prefill, measured in this process (run under MPS)."""
    import torch

    dev = torch.device("cuda")
    dt = torch.bfloat16
    w_qkv = [torch.randn(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=dev, dtype=dt) for _ in range(layers)]
    w_o = [torch.randn(HEADS * HEAD_DIM, HIDDEN, device=dev, dtype=dt) for _ in range(layers)]
    w_up = [torch.randn(HIDDEN, 2 * FFN, device=dev, dtype=dt) for _ in range(layers)]
    w_down = [torch.randn(FFN, HIDDEN, device=dev, dtype=dt) for _ in range(layers)]
    tokens = batch if kind == "decode" else 4096
    x = torch.randn(tokens, HIDDEN, device=dev, dtype=dt)
    kv = (
        [torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=dev, dtype=dt) for _ in range(layers)]
        if kind == "decode"
        else None
    )

    def step() -> None:
        h = x
        for i in range(layers):
            qkv = h @ w_qkv[i]
            if kv is not None:
                q = qkv[:, : HEADS * HEAD_DIM].view(batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
                scores = torch.einsum("bkgd,bkcd->bkgc", q, kv[i])
                attn = torch.einsum("bkgc,bkcd->bkgd", scores.softmax(-1), kv[i]).reshape(batch, -1)
            else:
                attn = qkv[:, : HEADS * HEAD_DIM]
            h = attn @ w_o[i]
            up = h @ w_up[i]
            h = (torch.nn.functional.silu(up[:, :FFN]) * up[:, FFN:]) @ w_down[i]

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def _run(share: int, kind: str, batch: int, layers: int, context: int, iters: int, copies: int = 1) -> float:
    env = dict(os.environ, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(share))
    cmd = [sys.executable, __file__, "--worker", kind, str(batch), str(layers), str(context), str(iters)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(copies)]
    times = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"worker failed ({kind}, share {share})")
        times.append(float(out.strip().splitlines()[-1]))
    return max(times)


def calibrate(shares: list[int], layers: int, iters: int, batches: list[int], context: int) -> dict[str, Any]:
    out: dict[str, Any] = {"layers": layers, "context": context, "decode": {}, "prefill": {}, "contention": {}}
    for b in batches:
        out["decode"][str(b)] = {str(s): _run(s, "decode", b, layers, context, iters) for s in shares}
    out["prefill"] = {str(s): _run(s, "prefill", 1, layers, context, max(1, iters // 4)) for s in shares}
    b = batches[len(batches) // 2]
    alone = out["decode"][str(b)][str(max(shares))]
    pair = _run(max(shares), "decode", b, layers, context, iters, copies=2)
    out["contention"] = {"batch": b, "alone_s": alone, "two_s": pair, "slowdown": pair / alone}
    # Derived: beta(s) = t(100 %) / t(s) per batch; s_sat = the smallest share within 5 % of full speed.
    full = max(shares)
    out["beta"] = {bb: {s: out["decode"][bb][str(full)] / t for s, t in v.items()} for bb, v in out["decode"].items()}
    out["s_sat"] = {
        bb: min((int(s) for s, v in betas.items() if v >= 0.95), default=full) / 100
        for bb, betas in out["beta"].items()
    }
    p_full = out["prefill"][str(full)]
    out["prefill_linearity"] = {s: p_full / t / (int(s) / full) for s, t in out["prefill"].items()}
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, batch, layers, context, iters = sys.argv[2], *map(int, sys.argv[3:7])
        print(_worker(kind, batch, layers, context, iters))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", default="10,20,35,50,75,100")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (32 = the whole 8B model)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="few iterations, two shares, batch 16 (for tests)")
    ap.add_argument("--out")
    args = ap.parse_args()
    shares = [int(s) for s in args.shares.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    iters = 20
    if args.quick:
        shares, batches, iters = [35, 100], [16], 5
    started = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True).returncode == 0
    try:
        result = calibrate(shares, args.layers, iters, batches, args.context)
    finally:
        if started:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, capture_output=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
