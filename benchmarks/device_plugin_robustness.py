"""The device plugin under junk Allocate calls and long refusals, over real gRPC on a Unix socket.

Starts the plugin (fake NVML, 8 x H100, in-memory pods, a test kubelet) in this process and measures:
  1. baseline: a valid Allocate with nothing ahead of it (median of --repeat);
  2. the same valid Allocate sent 0.1 s after N concurrent junk calls of each kind: device IDs that do not
     exist, an assignment that over-asks (refused by vgpu.assignment_check) and IDs no pod waits for (the
     only kind that is re-read, for allocate_retry_s) — before the fail-fast change 10 junk calls delayed a valid one by 20.9 s;
  3. how long each kind of junk takes to be refused;
  4. a refusal whose text is ~15 KB: status code and length as the client sees them (was RESOURCE_EXHAUSTED).
Loopback only, stops by itself (bounded by --repeat and allocate_retry_s).

    python benchmarks/device_plugin_robustness.py [--junk 10] [--repeat 5] [--retry-s 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb  # noqa: E402
from device_plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc  # noqa: E402
from device_plugin.app import Plugin  # noqa: E402
from device_plugin.config import PluginConfig  # noqa: E402
from device_plugin.nvml import real  # noqa: E402
from device_plugin.pods import PodRecord  # noqa: E402
from device_plugin.testing.fake_nvml import FakeNvml  # noqa: E402
from device_plugin.testing.kubelet import FakeKubelet  # noqa: E402
from device_plugin.testing.pods import MemoryPods  # noqa: E402
from device_plugin.testing.workload import PlacedPod, pod_uid  # noqa: E402
from vgpu import annotations as ann  # noqa: E402

NODE = "bench-node"
SCENARIO = REPO / "tests" / "data" / "nvml" / "h100x8.yaml"


def allocate(stub: pb_grpc.DevicePluginStub, ids: list[str]) -> tuple[float, grpc.StatusCode, str]:
    t0 = time.monotonic()
    try:
        stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=60)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), str(exc.details())  # type: ignore[attr-defined]
    return time.monotonic() - t0, code, details


class Bench:
    def __init__(self, retry_s: float) -> None:
        self.dir = tempfile.mkdtemp(prefix="dpbench")
        self.kubelet = FakeKubelet(self.dir, f"{self.dir}-pr.sock")
        self.kubelet.start()
        self.pods = MemoryPods()
        conf = PluginConfig(
            node_name=NODE,
            plugin_dir=self.dir,
            pod_resources_socket=f"{self.dir}-pr.sock",
            allocate_retry_s=retry_s,
            watchdog=False,
            reconcile_s=3600,
        )
        # kubelet=None: no PodResources view, so one pending pod at a time is unambiguous
        self.plugin = Plugin(
            conf, nvml=FakeNvml.from_file(SCENARIO), pods=self.pods, kubelet=None, is_nvml_error=real.NVMLError
        )
        self.plugin.start()
        assert self.kubelet.wait(lambda: len(self.kubelet.state.devices) == 80)
        self.uuids = [g.uuid for g in self.plugin.gpus]
        self.channel = grpc.insecure_channel(f"unix://{self.plugin.server.paths.plugin}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.n = 0

    def pod(self, gpu: int, memory: int = 1024, cores: int = 1) -> PodRecord:
        self.n += 1
        a = ann.Assignment(
            NODE, (ann.ContainerAssignment("main", (ann.DeviceSlice(self.uuids[gpu], gpu, memory, cores),)),)
        )
        return PlacedPod(f"p{self.n}", pod_uid(16, self.n), a).record(
            namespace="bench", node=NODE, bind_time=f"{self.n:06d}"
        )

    def valid(self) -> float:
        """Add one pending pod on GPU 7 and allocate it; retire it afterwards (Succeeded)."""
        p = self.pod(7)
        self.pods.add(p)
        took, code, details = allocate(self.stub, [f"{self.uuids[7]}::0"])
        assert code == grpc.StatusCode.OK, details
        self.pods.add(dataclasses.replace(p, phase="Succeeded"))
        return took

    def stop(self) -> None:
        self.channel.close()
        self.plugin.stop()
        self.kubelet.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def junk_kinds(b: Bench) -> dict[str, list[str]]:
    return {
        "unknown device IDs": ["GPU-0badc0de-0000-0000-0000-000000000000::0"],
        "malformed device ID": ["../../etc/passwd"],
        "two vGPUs on one GPU": [f"{b.uuids[1]}::0", f"{b.uuids[1]}::1"],
        "no pod waits (re-read)": [f"{b.uuids[2]}::0"],
    }


def junk_then_valid(b: Bench, ids: list[str], n: int) -> tuple[float, list[float]]:
    results: list[float] = []
    threads = [threading.Thread(target=lambda: results.append(allocate(b.stub, ids)[0])) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    took = b.valid()
    for t in threads:
        t.join()
    return took, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junk", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--retry-s", type=float, default=2.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # every refusal is logged by the plugin; not the point here
    b = Bench(args.retry_s)
    try:
        base = [b.valid() for _ in range(args.repeat)]
        print(
            f"baseline: valid Allocate alone: median {statistics.median(base) * 1000:.1f} ms, max {max(base) * 1000:.1f} ms"
        )
        print(
            "before the fail-fast change (measured once, not in this run): valid Allocate after 10 junk calls: 20,900 ms"
        )
        for kind, ids in junk_kinds(b).items():
            valid, junk = junk_then_valid(b, ids, args.junk)
            print(
                f"after {args.junk} x {kind:<24}: valid Allocate {valid * 1000:7.1f} ms "
                f"({valid / statistics.median(base):.1f}x baseline); junk refused in "
                f"median {statistics.median(junk) * 1000:.1f} ms, max {max(junk) * 1000:.1f} ms"
            )
        # over-asking assignment: refused by vgpu.assignment_check, final
        greedy = b.pod(3, memory=200_000)
        b.pods.add(greedy)
        took, code, details = allocate(b.stub, [f"{b.uuids[3]}::0"])
        print(f"over-commit assignment refused: {code.name} in {took * 1000:.1f} ms: {details[:90]}...")
        b.pods.add(dataclasses.replace(greedy, phase="Failed"))
        # a ~15 KB refusal: 200 pods pending at once make "ambiguous" list them all
        crowd = [b.pod(4) for _ in range(200)]
        for p in crowd:
            b.pods.add(p)
        took, code, details = allocate(b.stub, [f"{b.uuids[4]}::0"])
        full = 200 * len(f"bench/{crowd[0].name}[main] on {b.uuids[4]}, ")
        print(
            f"~{full // 1000} KB refusal: client sees {code.name} with {len(details.encode())} bytes "
            f"(was RESOURCE_EXHAUSTED over 8 KB): ...{details[-40:]}"
        )
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
