"""The extender's ready path in one process, without an apiserver: from the list responses' JSON to the state.

benchmarks/restart.py times a restart end to end on the real control plane, where a loaded 2-core machine makes
the apiserver's and the interpreter's share noisy. This times only what the extender itself does before it is
ready, CPU and memory: its KubeSource lists nodes and pods through the same Reflector code (the responses served
from memory, in the pages asked for) and applies them to the state. Each variant runs in a fresh process, in turns.

Compare two checkouts by running it from each (the script is self-contained; `--root` names the code to load):

    python benchmarks/restart_apply.py --nodes 5000 --pods 40000 --root . --root /tmp/old-checkout
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_CHILD = r"""
import gc, json, re, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
nodes_file, pods_file = sys.argv[2], sys.argv[3]
import orjson

def hwm():
    got = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M))
    return int(got["VmRSS"]) / 1024, int(got["VmHWM"]) / 1024

from scheduler_extender.service import ExtenderService
from scheduler_extender.sources.kube import KubeSource
from vgpu.config import PlacementConfig
from vgpu.state import ClusterState

class Listed:
    # A list call answered from memory as the apiserver pages it (limit / continue).
    def __init__(self, path):
        self.items = orjson.loads(Path(path).read_bytes())
    def __call__(self, **kw):
        start = int(kw.get("_continue") or 0)
        limit = kw.get("limit") or len(self.items)
        end = min(start + limit, len(self.items))
        meta = {"resourceVersion": "1"}
        if end < len(self.items):
            meta["continue"] = str(end)
        return type("R", (), {"data": orjson.dumps({"metadata": meta, "items": self.items[start:end]})})()

api = type("Api", (), {})()
api.list_node, api.list_pod_for_all_namespaces = Listed(nodes_file), Listed(pods_file)
# the served objects are held by the fake apiserver; what the extender adds is measured above them
gc.collect()
Path("/proc/self/clear_refs").write_text("5")  # proc(5): resets VmHWM to the current RSS
base_rss, _ = hwm()
svc = ExtenderService(ClusterState(PlacementConfig()), binder=None)
source = KubeSource(api, svc)
t0 = time.process_time()
source.nodes._list()
source.pods._list()
cpu = time.process_time() - t0
rss, peak = hwm()
held = len(svc.state.assignments)
print(json.dumps({"cpu_s": round(cpu, 2), "rss_mib": round(rss - base_rss), "peak_mib": round(peak - base_rss), "held": held}))
"""


def objects(nodes: int, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.restart import GROUP, bound_pod
    from kube_vgpu_dev.stack import inventory
    from vgpu import annotations as ann

    node_list = []
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        node_list.append(
            {
                "metadata": {
                    "name": name,
                    "labels": {GROUP: "restart"},
                    "annotations": {ann.NODE_INVENTORY: inventory(name, 8)},
                    "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1"}],
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    pod_list = []
    for i in range(pods):
        p = bound_pod(i, nodes)
        # as the apiserver returns it: identity, creation time, the create's managedFields, a status
        p["metadata"] |= {
            "namespace": "restart",
            "uid": f"0000-{i:08d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-12-01T13:00:00Z",
            "managedFields": [
                {
                    "manager": "OpenAPI-Generator",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-12-01T13:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:annotations": {f"f:{k}": {} for k in p["metadata"]["annotations"]}},
                        "f:spec": {"f:containers": {'k:{"name":"vllm"}': {"f:args": {}, "f:env": {}, "f:image": {}}}},
                    },
                }
            ],
        }
        p["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        pod_list.append(p)
    return node_list, pod_list


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=40000)
    p.add_argument("--root", type=Path, action="append", help="a checkout whose code to time (repeatable)")
    p.add_argument("--turns", type=int, default=2, help="runs per root, in turns")
    a = p.parse_args(argv)
    if a.pods > a.nodes * 8 or a.nodes < 1 or a.turns < 1:
        p.error(f"--pods must be at most 8 x --nodes ({a.nodes * 8}), --nodes and --turns >= 1")
    roots = [r.resolve() for r in (a.root or [Path(__file__).resolve().parent.parent])]
    import orjson

    nodes, pods = objects(a.nodes, a.pods)
    work = Path(f"/tmp/restart-apply-{a.nodes}-{a.pods}")
    work.mkdir(exist_ok=True)
    (work / "nodes.json").write_bytes(orjson.dumps(nodes))
    (work / "pods.json").write_bytes(orjson.dumps(pods))
    print(f"{a.nodes} nodes, {a.pods} pods; pod list {(work / 'pods.json').stat().st_size / 2**20:.1f} MiB")
    results: dict[str, list[dict[str, Any]]] = {str(r): [] for r in roots}
    for _ in range(a.turns):
        for r in roots:
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(r), str(work / "nodes.json"), str(work / "pods.json")],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            got["wall_s"] = round(time.monotonic() - t0, 1)
            if got["held"] != a.pods:
                raise AssertionError(f"{r}: the state holds {got['held']} pods, {a.pods} were listed")
            results[str(r)].append(got)
            print(f"  {r}: {got}")
    for r, runs in results.items():
        best = min(runs, key=lambda x: x["cpu_s"])
        print(
            f"{r}: CPU to ready {best['cpu_s']} s (best of {len(runs)}), memory above the served lists "
            f"{best['rss_mib']} MiB, peak {max(x['peak_mib'] for x in runs)} MiB"
        )
    if len(roots) == 2:
        a0, b0 = (min(x["cpu_s"] for x in results[str(r)]) for r in roots)
        print(f"ratio CPU {roots[0]} / {roots[1]}: {a0 / b0:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
