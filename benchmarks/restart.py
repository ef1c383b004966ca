"""Restart, relist and leader handover of the extender with tens of thousands of pods in the apiserver.

On the real etcd + kube-apiserver (+ kube-scheduler for the handover) the e2e tests build (kube_vgpu_dev), N plain
Node objects carry our inventory annotation for 8 GPUs each, and K pods are created ALREADY BOUND: spec.nodeName set
and our assignment annotation (vgpu.annotations encoders) on one GPU each, consistent with the inventory, as a
running cluster leaves them. Then, per pod count (10k, then 40k on the same control plane):

* ``start``: the extender process (`--source kube`, as shipped) from exec to /readyz ok, i.e. nodes and every pod
  listed and the state rebuilt from their annotations; its RSS (VmRSS, peak VmHWM) and CPU then. The floor in the
  same run: the same two lists (nodes, active pods) by a plain client in this process (raw JSON parsed by orjson),
  the least any extender must do before it is ready;
* ``restart``: kill -9 and start again (the first start was one as well: the apiserver holds the same objects).

At the largest count:

* ``relist``: a watch that ends in 410 Gone and the relist after it. A second kube-apiserver on the same etcd serves
  pods without a watch cache (`--watch-cache-sizes=pods#0`), so a watch goes to etcd; the extender watches it with a
  10 s server-side timeout, the benchmark compacts etcd past the extender's resourceVersion, and the next watch gets
  410. Timed from the extender's own log: from the failed watch to its "pods listed" line (list and apply);
* ``handover``: two replicas with --leader-elect (shipped lease timings), kube-scheduler calling them through a TCP
  proxy that routes to the pod labelled vgpu.io/extender-leader=true (what the Service does), GPU pods created at a
  fixed rate; the leader is killed (-9), later the new leader steps down (SIGTERM). Timed: from kill to the standby
  serving, and to the first pod it binds; reported: whether each new leader kept its lease for ~30 s. The shipped
  FlowSchema (Lease calls at the leader-election priority level) is applied first, unless --no-flowschema;
* the apiserver requests the extender makes, from the apiserver's audit log: per minute while idle (watches, lease
  renewals) and per bound pod under load.

    python benchmarks/restart.py --nodes 5000 --pods 10000 40000 [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures
import contextlib
import json
import os
import platform
import select
import signal
import socket
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client

from benchmarks.scale import BindWatch
from kube_vgpu_dev import components
from kube_vgpu_dev.controlplane import ControlPlane
from kube_vgpu_dev.processes import cpu_seconds, free_port, rss_mib
from kube_vgpu_dev.stack import GPU_MEM, SCHEDULER, SPLIT, Extender, inventory, lease_rbac, scheduler_config
from vgpu import annotations as ann

GPUS_PER_NODE = 8
NS = "restart"
LEASE_NS = "kube-system"
GROUP = "kube-vgpu.restart/group"
EXTENDER_USER = "vgpu-extender"
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"  # the extender's own field selector
# (memory %, cores %) of the running pods, one pod per GPU: whole cards and llm-d prefill/decode slices.
SHAPES = ((100, 100), (50, 50), (25, 30), (40, 50))
_AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["{EXTENDER_USER}"]
  - level: None
"""


@dataclass(frozen=True)
class Config:
    nodes: int = 5000
    pods: tuple[int, ...] = (10_000, 40_000)
    threads: int = 16
    handover_rate: float = 4.0  # GPU pods created per second during the handover
    handover_s: float = 60.0  # how long pods keep coming in the handover phase
    relist: bool = True
    handover: bool = True
    flowschema: bool = True  # the shipped FlowSchema (leader-election priority level) for the replicas' Lease calls


# ---- the objects


def add_nodes(core: Any, count: int, threads: int) -> None:
    def one(i: int) -> None:
        name = f"gpu-{i:05d}"
        cap = {"cpu": "256", "memory": "2Ti", "pods": "250", "nvidia.com/gpu": str(GPUS_PER_NODE * SPLIT)}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, GROUP: "restart"},
                "annotations": {ann.NODE_INVENTORY: inventory(name, GPUS_PER_NODE)},
            },
        }
        core.create_node(body, _preload_content=False)
        status = {"status": {"capacity": cap, "allocatable": cap, "conditions": [{"type": "Ready", "status": "True"}]}}
        core.patch_node_status(name, status, _preload_content=False)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))


def bound_pod(i: int, nodes: int) -> dict[str, Any]:
    """Pod i, bound to GPU i (node i // 8, index i % 8) with our assignment on it, as a bind leaves it; a vLLM
    container with the env, args and mounts such a pod carries, so the objects have a realistic size."""
    gpus = nodes * GPUS_PER_NODE
    if i >= gpus:
        raise ValueError(f"pod {i}: one pod per GPU and there are only {gpus} GPUs")
    node, index = f"gpu-{i // GPUS_PER_NODE:05d}", i % GPUS_PER_NODE
    mem, cores = SHAPES[i % len(SHAPES)]
    role = ann.Role.PREFILL_DECODE if mem == 100 else (ann.Role.PREFILL if i % 2 else ann.Role.DECODE)
    model = f"org/model-{i % 16}"
    assignment = ann.Assignment(
        node=node,
        containers=(
            ann.ContainerAssignment(
                "vllm", (ann.DeviceSlice(f"GPU-{node}-{index}", index, GPU_MEM * mem // 100, cores),)
            ),
        ),
        role=role,
        model=model,
    )
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": str(mem), "nvidia.com/gpucores": str(cores)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"r-{i:05d}",
            "labels": {"llm-d.ai/model": f"model-{i % 16}", "llm-d.ai/role": role.value, "app": "vllm"},
            "annotations": {
                ann.POD_ASSIGNMENT: ann.encode_assignment(assignment),
                ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATED.value,
                ann.POD_BIND_TIME: "1764590000.000",
            },
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeName": node,
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": ["--model", model, "--port", "8000", "--max-model-len", "8192"],
                    "env": [{"name": f"VLLM_VAR_{k}", "value": f"value-{k}"} for k in range(6)],
                    "ports": [{"containerPort": 8000, "name": "http"}],
                    "resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": limits},
                    "volumeMounts": [{"name": "cache", "mountPath": "/root/.cache"}],
                }
            ],
            "volumes": [{"name": "cache", "emptyDir": {}}],
        },
    }


def create_pods(core_of: Any, start: int, stop: int, nodes: int, threads: int) -> float:
    """Create pods start..stop-1, bound; returns creates per second."""
    t0 = time.monotonic()

    def one(i: int) -> None:
        core_of().create_namespaced_pod(NS, bound_pod(i, nodes), _preload_content=False)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(start, stop)))
    return (stop - start) / (time.monotonic() - t0)


# ---- measuring


def audit_count(path: Path, since: float) -> collections.Counter[str]:
    """The extender's requests in the audit log from `since` (unix time) on, by `verb resource[/sub]`; a watch once."""
    out: collections.Counter[str] = collections.Counter()
    if not path.exists():
        return out
    seen: set[str] = set()
    for line in path.read_bytes().splitlines():
        ev = orjson.loads(line)
        if ev.get("user", {}).get("username") != EXTENDER_USER or ev["auditID"] in seen:
            continue
        if _unix(ev["requestReceivedTimestamp"]) < since:
            continue
        seen.add(ev["auditID"])
        ref = ev.get("objectRef") or {}
        what = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
        out[f"{ev['verb']} {what}"] += 1
    return out


def _unix(ts: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def floor_s(core: Any) -> tuple[float, int]:
    """The same two lists the extender makes before it is ready (every node; every active pod), parsed with orjson
    into dicts: seconds, and the pod list's size in bytes."""
    t0 = time.monotonic()
    orjson.loads(core.list_node(_preload_content=False).data)
    data = core.list_pod_for_all_namespaces(field_selector=ACTIVE_PODS, _preload_content=False).data
    orjson.loads(data)
    return time.monotonic() - t0, len(data)


_FLOOR_PROC = """
import sys, orjson
from kubernetes import client, config
config.load_kube_config(config_file=sys.argv[1])
core = client.CoreV1Api()
orjson.loads(core.list_node(_preload_content=False).data)
orjson.loads(core.list_pod_for_all_namespaces(field_selector=sys.argv[2], _preload_content=False).data)
"""


def floor_process_s(kubeconfig: Path) -> float:
    """The same two lists from a fresh Python process that imports the same client: what a restart of any Python
    extender costs before it does anything of its own (interpreter, imports, TLS, lists)."""
    import subprocess

    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", _FLOOR_PROC, str(kubeconfig), ACTIVE_PODS], check=True)
    return time.monotonic() - t0


def timed_start(ext: Extender) -> dict[str, float]:
    t0 = time.monotonic()
    ext.start(ready_timeout_s=600)
    ready = time.monotonic() - t0
    assert ext.proc is not None
    rss, hwm = rss_mib(ext.proc.pid)
    return {
        "ready_s": round(ready, 2),
        "rss_mib": round(rss),
        "peak_rss_mib": round(hwm),
        "cpu_s": round(cpu_seconds(ext.proc.pid), 2),
    }


def held(ext: Extender) -> int:
    """Pods whose slices the extender's state holds (/state)."""
    with urllib.request.urlopen(ext.url + "/state", context=ext.ctx, timeout=120) as r:
        return len(orjson.loads(r.read())["allocations"])


def measure_size(cp: ControlPlane, pods: int, audit_log: Path) -> dict[str, Any]:
    core = client.CoreV1Api(cp.api_client())
    floor, size = floor_s(core)
    ext = Extender(cp, name=f"ext-{pods}")
    since = time.time()
    first = timed_start(ext)
    requests = audit_count(audit_log, since)  # before the process floor, which lists as the same user
    process_floor = floor_process_s(ext.kubeconfig)
    count = held(ext)
    if count != pods:
        raise AssertionError(f"the extender holds slices of {count} pods, {pods} are bound")
    ext.kill()
    again = timed_start(ext)
    again_held = held(ext)
    assert ext.proc is not None
    cp.stop_process(ext.proc)
    if again_held != pods:
        raise AssertionError(f"after kill -9 and restart the extender holds {again_held} pods, {pods} are bound")
    return {
        "pods": pods,
        "pod_list_mib": round(size / 2**20, 1),
        "floor_s": round(floor, 2),
        "start": first,
        "restart": again,
        "floor_process_s": round(process_floor, 2),
        "ratio_restart_to_floor": round(again["ready_s"] / floor, 2),
        "ratio_restart_to_process_floor": round(again["ready_s"] / process_floor, 2),
        "start_requests": dict(requests),
    }


# ---- relist after 410


def etcd_call(cp: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's v3 JSON gateway (on its client URL)."""
    req = urllib.request.Request(cp.etcd_url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def second_apiserver(cp: ControlPlane) -> str:
    """Another kube-apiserver on the same etcd, serving pods without a watch cache: a watch then reads etcd, whose
    compaction expires an old resourceVersion (410), as the watch cache's window does in a busy cluster."""
    port = free_port()
    argv = components.apiserver_argv(
        cp.bin_dir / "kube-apiserver",
        etcd_url=cp.etcd_url,
        port=port,
        pki=cp.pki,
        cert_dir=cp.workdir / "apiserver-b-certs",
        verbosity=1,
        disable_admission_plugins=cp.disable_admission_plugins,
        extra=["--watch-cache-sizes=pods#0"],
    )
    proc = cp.spawn("kube-apiserver-b", argv)
    import ssl

    from kube_vgpu_dev.processes import http_ok

    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.load_cert_chain(str(cp.admin_cert), str(cp.admin_key))
    url = f"https://127.0.0.1:{port}"
    proc.wait_ready("kube-apiserver-b", lambda: http_ok(f"{url}/readyz", ctx=ctx), 120)
    return url


def log_events(ext: Extender) -> list[dict[str, Any]]:
    assert ext.proc is not None
    out = []
    for line in ext.proc.log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if isinstance(ev, dict):
                out.append(ev)
    return out


def measure_relist(cp: ControlPlane, pods: int) -> dict[str, Any]:
    server_b = second_apiserver(cp)
    ext = Extender(cp, name="ext-relist", args=("--watch-timeout-seconds", "10"))
    ext.kubeconfig.write_text(ext.kubeconfig.read_text().replace(cp.server, server_b))
    ext.start(ready_timeout_s=600)
    assert ext.proc is not None
    time.sleep(2)  # the pod watch is open
    core = client.CoreV1Api(cp.api_client())
    for n in range(2):  # revisions past the extender's: it watches from its resourceVersion + 1
        core.create_namespaced_config_map(NS, {"metadata": {"name": f"bump-{n}"}})
    rev = int(etcd_call(cp, "/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})["header"]["revision"])
    etcd_call(cp, "/v3/kv/compaction", {"revision": rev, "physical": True})
    compacted = time.time()
    deadline = time.monotonic() + 120
    expired = listed = None
    while time.monotonic() < deadline and listed is None:
        time.sleep(0.5)
        for ev in log_events(ext):
            ts = _unix(ev["ts"])
            if ts < compacted:
                continue
            msg = ev.get("msg") or ev.get("message") or ""
            if expired is None and ev.get("reflector") == "pods" and ("410" in msg or "relisting" in msg):
                expired = (ts, msg, str(ev.get("error", "")))
            elif expired is not None and msg == "pods listed" and not ev.get("first"):
                listed = (ts, ev)
    rss, hwm = rss_mib(ext.proc.pid)
    cp.stop_process(ext.proc)
    if expired is None or listed is None:
        raise AssertionError(
            f"no 410 and relist seen in the extender's log within 120 s of the compaction:\n{ext.proc.tail(20)}"
        )
    return {
        "pods": pods,
        "watch_error": f"{expired[1]}: {expired[2]}"[:200],
        "relist_s": round(listed[0] - expired[0], 2),
        "apply_s": listed[1].get("apply_s"),
        "rss_mib_after": round(rss),
        "peak_rss_mib": round(hwm),
    }


# ---- handover


class LeaderProxy:
    """TCP proxy in front of the replicas (TLS passes through): each new connection goes to the replica whose pod
    carries vgpu.io/extender-leader=true, read every 0.2 s, as a Service selecting that label routes."""

    def __init__(self, cp: ControlPlane, replicas: dict[str, Extender]) -> None:
        self.core = client.CoreV1Api(cp.api_client())
        self.replicas = replicas  # pod name -> replica
        self.leader: Extender | None = None
        self.port = free_port()
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._route, daemon=True).start()
        threading.Thread(target=self._accept, daemon=True).start()

    def _route(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                items = orjson.loads(
                    self.core.list_namespaced_pod(
                        LEASE_NS, label_selector=f"{ann.EXTENDER_LEADER_LABEL}=true", _preload_content=False
                    ).data
                )["items"]
                live = [self.replicas[p["metadata"]["name"]] for p in items if p["metadata"]["name"] in self.replicas]
                live = [e for e in live if e.proc is not None and e.proc.alive()]
                self.leader = live[0] if live else None
            self.stop.wait(0.2)

    def _accept(self) -> None:
        while not self.stop.is_set():
            conn, _ = self.sock.accept()
            target = self.leader
            if target is None:
                conn.close()
                continue
            try:
                up = socket.create_connection(("127.0.0.1", target.port), timeout=2)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=_pipe, args=(conn, up), daemon=True).start()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [], 60)
            if not ready:
                continue
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return
    finally:
        a.close()
        b.close()


def new_pod(i: int) -> dict[str, Any]:
    """A pending GPU pod (a 10 % llm-d decode slice) for kube-scheduler and the extender to place."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "10", "nvidia.com/gpucores": "10"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"h-{i:05d}", "labels": {"llm-d.ai/role": "decode", "llm-d.ai/model": "model-0"}},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {GROUP: "restart"},
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "resources": {"limits": limits}}],
        },
    }


def apply_flowschema(cp: ControlPlane) -> None:
    """The shipped FlowSchema (deploy/manifests/extender.yaml) for the benchmark's replicas, which authenticate as the
    user vgpu-extender (a client certificate) rather than the ServiceAccount: the same rule, that subject."""
    docs = yaml.safe_load_all((Path(__file__).resolve().parent.parent / "deploy/manifests/extender.yaml").read_text())
    fs = next(d for d in docs if d and d["kind"] == "FlowSchema")
    fs["spec"]["rules"][0]["subjects"] = [{"kind": "User", "user": {"name": "vgpu-extender"}}]
    fs["metadata"].pop("labels", None)
    client.FlowcontrolApiserverV1Api(cp.api_client()).create_flow_schema(fs)


def _held_for(proxy: LeaderProxy, leader: Extender, seconds: float) -> float | None:
    """Watch the new leader for `seconds`: when it stopped leading (lost the lease and exited), None if it kept it."""
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        alive = leader.proc is not None and leader.proc.alive()
        if not alive or (proxy.leader is not None and proxy.leader is not leader):
            return round(elapsed, 1)
        time.sleep(0.5)
    return None


def measure_handover(cp: ControlPlane, cfg: Config, audit_log: Path) -> dict[str, Any]:
    lease = "vgpu-extender-bench"
    lease_rbac(cp, lease)
    if cfg.flowschema:
        apply_flowschema(cp)
    core = client.CoreV1Api(cp.api_client())
    replicas: dict[str, Extender] = {}
    first_ca: Path | None = None
    for name in ("ext-a", "ext-b"):
        pod = f"{lease}-{name}"
        core.create_namespaced_pod(  # the replica's own pod, as the downward API names it; never scheduled
            LEASE_NS,
            {
                "metadata": {"name": pod},
                "spec": {"schedulerName": "none", "containers": [{"name": "x", "image": "x"}]},
            },
        )
        args = [
            "--leader-elect",
            "--leader-elect-resource-name",
            lease,
            "--leader-elect-resource-namespace",
            LEASE_NS,
            "--pod-name",
            pod,
            "--pod-namespace",
            LEASE_NS,
        ]
        if first_ca is not None:  # kube-scheduler presents one client certificate to whichever replica leads
            args += ["--client-ca-file", str(first_ca)]
        ext = Extender(cp, name=name, args=tuple(args))
        first_ca = first_ca or ext.client_ca_file
        replicas[pod] = ext
    exts = list(replicas.values())
    t_start = time.monotonic()
    for e in exts:
        e.start(ready_timeout_s=600)
    proxy = LeaderProxy(cp, replicas)
    leader = _wait_leader(proxy, 120)
    lead_s = time.monotonic() - t_start
    front = exts[0]
    config = scheduler_config(cp, front).replace(front.url, f"https://127.0.0.1:{proxy.port}")
    cp.start_scheduler(config)
    watch = BindWatch(cp, NS)
    stop = threading.Event()
    created: dict[str, float] = {}
    since = time.time()

    def feed() -> None:
        c = client.CoreV1Api(cp.api_client())
        i = 0
        t0 = time.monotonic()
        while not stop.is_set():
            due = t0 + i / cfg.handover_rate
            if (d := due - time.monotonic()) > 0:
                time.sleep(d)
            name = f"h-{i:05d}"
            created[name] = time.monotonic()
            with contextlib.suppress(Exception):
                c.create_namespaced_pod(NS, new_pod(i), _preload_content=False)
            i += 1

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    out: dict[str, Any] = {
        "lease_s": 15.0,
        "renew_s": 10.0,
        "retry_s": 2.0,
        "first_leader_s": round(lead_s, 2),
        "flowschema": cfg.flowschema,
    }
    try:
        time.sleep(cfg.handover_s / 3)
        for how in ("kill", "sigterm"):
            old = leader
            assert old.proc is not None
            t_kill = time.monotonic()
            if how == "kill":
                old.kill()
            else:
                old.proc.popen.send_signal(signal.SIGTERM)
            new = _wait_leader(proxy, 120, not_=old)
            t_serve = time.monotonic()
            t_bind = _first_bind_after(watch, t_serve, 120)
            out[how] = {
                "standby_serves_s": round(t_serve - t_kill, 2),
                "first_bind_s": round(t_bind - t_kill, 2),
            }
            t_back = time.monotonic()
            old.start(ready_timeout_s=600)  # back as a standby
            leader = new
            # A new leader that cannot renew gives the lease up again (it did at 40k pods, 11-32 s after winning).
            lost = _held_for(proxy, new, max(cfg.handover_s / 3, 30.0) - (time.monotonic() - t_back))
            out[how]["lost_lease_after_s"] = None if lost is None else round(time.monotonic() - t_serve, 1)
    finally:
        stop.set()
        feeder.join()
    time.sleep(5)
    bound = sum(1 for k in created if k in watch.bound)
    requests = audit_count(audit_log, since)
    watch.stop.set()
    proxy.stop.set()
    cp.stop_scheduler()
    for e in exts:
        if e.proc is not None:
            cp.stop_process(e.proc)
    lat = sorted(watch.bound[k] - created[k] for k in created if k in watch.bound)
    out |= {
        "pods_created": len(created),
        "pods_bound": bound,
        "p50_s": round(lat[len(lat) // 2], 2) if lat else None,
        "max_s": round(lat[-1], 2) if lat else None,
        "extender_requests": dict(requests),
        "extender_requests_per_bound_pod": round(sum(requests.values()) / max(bound, 1), 2),
    }
    return out


def _wait_leader(proxy: LeaderProxy, timeout: float, not_: Extender | None = None) -> Extender:
    """The replica that serves /filter (a standby answers 503) once the proxy routes to it. Every replica trusts the
    first one's client CA (kube-scheduler's certificate), so the probe presents that certificate."""
    ctx = next(iter(proxy.replicas.values())).ctx
    deadline = time.monotonic() + timeout
    body = json.dumps(
        {"Pod": {"metadata": {"name": "probe", "namespace": "default", "uid": "u-probe"}, "spec": {}}, "NodeNames": []}
    ).encode()
    while time.monotonic() < deadline:
        e = proxy.leader
        if e is not None and e is not not_:
            req = urllib.request.Request(e.url + "/filter", data=body, headers={"Content-Type": "application/json"})
            with contextlib.suppress(Exception), urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                if r.status == 200:
                    return e
        time.sleep(0.05)
    raise TimeoutError("no replica took over")


def _first_bind_after(watch: BindWatch, t: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with watch.lock:
            after = [v for v in watch.bound.values() if v >= t]
        if after:
            return min(after)
        time.sleep(0.05)
    raise TimeoutError("no pod bound after the handover")


# ---- the run


def run(cfg: Config) -> dict[str, Any]:
    sizes = sorted(cfg.pods)
    if cfg.nodes < 1 or not sizes or sizes[0] < 1 or sizes[-1] > cfg.nodes * GPUS_PER_NODE:
        raise ValueError(f"--pods must be 1..{cfg.nodes * GPUS_PER_NODE} (one per GPU of --nodes); got {cfg}")
    cp = ControlPlane(verbosity=1)
    cp.workdir.mkdir(parents=True, exist_ok=True)
    (cp.workdir / "audit-policy.yaml").write_text(_AUDIT_POLICY)
    audit_log = cp.workdir / "audit.log"
    cp.extra_apiserver_args += [
        f"--audit-policy-file={cp.workdir / 'audit-policy.yaml'}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
    ]
    report: dict[str, Any] = {
        "config": asdict(cfg),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at start",
        "sizes": [],
    }
    with cp:
        core = client.CoreV1Api(cp.api_client())
        core.create_namespace({"metadata": {"name": NS}})
        local = threading.local()

        def core_of() -> Any:
            if not hasattr(local, "core"):
                local.core = client.CoreV1Api(cp.api_client())
            return local.core

        t0 = time.monotonic()
        add_nodes(core_of(), cfg.nodes, cfg.threads)
        report["nodes_s"] = round(time.monotonic() - t0, 1)
        print(f"  {cfg.nodes} nodes in {report['nodes_s']} s", file=sys.stderr)
        have = 0
        for size in sizes:
            rate = create_pods(core_of, have, size, cfg.nodes, cfg.threads)
            print(f"  {size - have} bound pods created at {rate:.0f}/s", file=sys.stderr)
            have = size
            r = measure_size(cp, size, audit_log)
            r["created_per_s"] = round(rate)
            print(f"  {size} pods: {json.dumps(r)}", file=sys.stderr)
            report["sizes"].append(r)
        if cfg.relist:
            report["relist"] = measure_relist(cp, have)
            print(f"  relist: {json.dumps(report['relist'])}", file=sys.stderr)
        if cfg.handover:
            report["handover"] = measure_handover(cp, cfg, audit_log)
            print(f"  handover: {json.dumps(report['handover'])}", file=sys.stderr)
    return report


def print_report(r: dict[str, Any]) -> None:
    c = r["config"]
    print(f"restart: {c['nodes']} nodes x {GPUS_PER_NODE} GPUs; {r['machine']}")
    print(
        f"{'pods':>7}{'list MiB':>10}{'floor s':>9}{'start s':>9}{'restart s':>11}{'x floor':>9}{'proc floor s':>14}{'x proc':>8}{'RSS MiB':>9}{'peak MiB':>10}{'CPU s':>7}"
    )
    for s in r["sizes"]:
        a = s["restart"]
        print(
            f"{s['pods']:>7}{s['pod_list_mib']:>10}{s['floor_s']:>9}{s['start']['ready_s']:>9}{a['ready_s']:>11}"
            f"{s['ratio_restart_to_floor']:>9}{s['floor_process_s']:>14}{s['ratio_restart_to_process_floor']:>8}{a['rss_mib']:>9}{a['peak_rss_mib']:>10}{a['cpu_s']:>7}"
        )
        print(f"    apiserver requests while starting: {s['start_requests']}")
    if "relist" in r:
        x = r["relist"]
        print(
            f"relist after 410 at {x['pods']} pods: {x['relist_s']} s (apply {x['apply_s']} s), RSS {x['rss_mib_after']} "
            f"MiB (peak {x['peak_rss_mib']}); watch ended with: {x['watch_error']}"
        )
    if "handover" in r:
        h = r["handover"]
        for how in ("kill", "sigterm"):
            if how in h:
                print(
                    f"handover after {how}: standby serves in {h[how]['standby_serves_s']} s, first bind "
                    f"{h[how]['first_bind_s']} s (lease {h['lease_s']} s, retry {h['retry_s']} s); new leader "
                    + (
                        "kept the lease"
                        if h[how].get("lost_lease_after_s") is None
                        else f"lost the lease {h[how]['lost_lease_after_s']} s after serving"
                    )
                    + f" (FlowSchema {'on' if h.get('flowschema') else 'off'})"
                )
        print(
            f"handover run: {h['pods_bound']}/{h['pods_created']} pods bound, p50 {h['p50_s']} s, max {h['max_s']} s; "
            f"extender requests {h['extender_requests_per_bound_pod']} per bound pod: {h['extender_requests']}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=Config.nodes, help="Node objects, 8 GPUs each")
    p.add_argument("--pods", type=int, nargs="+", default=list(Config.pods), help="bound pods, one size after another")
    p.add_argument("--threads", type=int, default=Config.threads, help="client threads creating objects")
    p.add_argument("--handover-rate", type=float, default=Config.handover_rate, help="pods/s during the handover")
    p.add_argument("--handover-seconds", type=float, default=Config.handover_s)
    p.add_argument("--no-relist", action="store_true")
    p.add_argument("--no-handover", action="store_true")
    p.add_argument("--no-flowschema", action="store_true", help="handover without the shipped FlowSchema")
    p.add_argument("--json", type=Path, help="also write the report here")
    a = p.parse_args(argv)
    try:
        cfg = Config(
            a.nodes,
            tuple(a.pods),
            a.threads,
            a.handover_rate,
            a.handover_seconds,
            not a.no_relist,
            not a.no_handover,
            not a.no_flowschema,
        )
        report = run(cfg)
    except ValueError as exc:
        p.error(str(exc))
    print_report(report)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
