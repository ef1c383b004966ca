"""A CUDA client through the driver API alone (ctypes on libcuda; no toolkit, no framework), for the GPU check.

    python tests/gpu/cuda_client.py --alloc-mib 8192 --step-mib 256 [--hold-s 5] [--device 0] [--lib libcuda.so.1]

cuInit, cuDeviceGet, cuCtxCreate, cuMemGetInfo, then cuMemAlloc in steps until --alloc-mib are held or the
driver refuses; prints one JSON line (what CUDA reported as total/free, what it let us hold, what stopped us),
holds the memory --hold-s seconds (so NVML and the watchdog can see the process), frees it and exits 0 (2 for
bad arguments, 1 when CUDA could not even start). It runs under whatever env it is given: the check hands it
an Allocate response's env (MPS pipe and limits, CUDA_VISIBLE_DEVICES), exactly as a container would get it.

Signatures: CUDA driver API (cuda.h, CUDA 12): CUresult is an int, CUdevice an int, CUcontext a pointer,
CUdeviceptr an unsigned 64-bit integer; the _v2 entry points are the ones cuda.h maps the plain names to.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

MIB = 1 << 20
CUDA_SUCCESS = 0


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cuda_client", description="allocate GPU memory through the CUDA driver API")
    p.add_argument("--alloc-mib", type=int, required=True, help="MiB to try to hold in total")
    p.add_argument("--step-mib", type=int, default=None, help="MiB per cuMemAlloc (default: 256, at most --alloc-mib)")
    p.add_argument("--hold-s", type=float, default=0.0, help="seconds to hold the memory before freeing it")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (after CUDA_VISIBLE_DEVICES)")
    p.add_argument("--lib", default="libcuda.so.1", help="the CUDA driver library to load")
    a = p.parse_args(argv)
    if a.step_mib is None:
        a.step_mib = max(1, min(256, a.alloc_mib))
    if a.alloc_mib < 1 or a.step_mib < 1 or a.step_mib > a.alloc_mib:
        p.error(f"need 1 <= --step-mib <= --alloc-mib, got --step-mib {a.step_mib} --alloc-mib {a.alloc_mib}")
    if a.hold_s < 0 or a.device < 0:
        p.error("--hold-s and --device must be >= 0")
    return a


class Driver:
    def __init__(self, lib: str) -> None:
        self.lib = ctypes.CDLL(lib)

    def _name(self, code: int) -> str:
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(s)) == CUDA_SUCCESS and s.value:
            return s.value.decode()
        return f"CUresult {code}"

    def call(self, name: str, *args: Any) -> None:
        code = int(getattr(self.lib, name)(*args))
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self._name(code))


def run(a: argparse.Namespace) -> tuple[dict[str, Any], list[int], Driver | None]:
    out: dict[str, Any] = {"pid": os.getpid(), "ok": False, "allocated_mib": 0}
    try:
        cuda = Driver(a.lib)
    except OSError as exc:
        out["error"] = f"cannot load {a.lib}: {exc}"
        return out, [], None
    held: list[int] = []
    try:
        cuda.call("cuInit", ctypes.c_uint(0))
        dev = ctypes.c_int()
        cuda.call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(a.device))
        ctx = ctypes.c_void_p()
        cuda.call("cuCtxCreate_v2", ctypes.byref(ctx), ctypes.c_uint(0), dev)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cuda.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        out.update(total_mib=total.value // MIB, free_mib=free.value // MIB)
    except CudaError as exc:
        out["error"] = str(exc)
        return out, held, cuda
    out["ok"] = True
    out["stopped_by"] = "target"
    while len(held) * a.step_mib < a.alloc_mib:
        ptr = ctypes.c_uint64()
        try:
            cuda.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(a.step_mib * MIB))
        except CudaError as exc:
            out["stopped_by"] = exc.name
            break
        held.append(ptr.value)
    out["allocated_mib"] = len(held) * a.step_mib
    return out, held, cuda


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    out, held, cuda = run(a)
    print(json.dumps(out, sort_keys=True), flush=True)
    if held and a.hold_s:
        time.sleep(a.hold_s)
    for ptr in held:
        assert cuda is not None
        cuda.call("cuMemFree_v2", ctypes.c_uint64(ptr))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
