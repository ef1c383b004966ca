"""Scheduling at scale through the real kube-scheduler: with our extender, and the same pods without it.

On the real etcd + kube-apiserver + kube-scheduler the e2e tests build (kube_vgpu_dev), N plain Node objects each
carry our inventory annotation for 8 GPUs. Waves of pods of mixed shapes (llm-d prefill/decode slices, whole cards,
multi-GPU pods) are created at a fixed rate, measured until every pod is bound (or binding stops), checked, and
deleted again (churn). Waves alternate between two arms on ONE kube-scheduler process running the shipped profile
(deploy/scheduler/kube-scheduler-config.yaml):

* ``extender``: the pods ask for vGPUs, so kube-scheduler calls the extender's filter, prioritize and bind verbs;
* ``baseline``: the same pods (same names, labels, CPU requests, node selector) without GPU resources, so the
  extender is not interested in them (managedResources) and kube-scheduler filters, scores and binds on its own.
  The extender's verb counters are read before and after to prove it was not called;
* ``one-node`` (with ``--one-node``): the extender arm's pods with the extender restarted with
  ``--filter-answers-one``, so /filter answers one node and kube-scheduler neither scores nor calls /prioritize. With
  it the extender is restarted before every GPU wave, so both GPU arms start each wave on a fresh extender process
  (its first lists, its planner's caches empty), and the ratios share one baseline. The two GPU arms swap order every
  other wave.

Alternating the arms wave by wave spreads the noise of a shared machine over both. Per arm it reports pods/s
(bound pods over first create to last bind), creation-to-bound p50/p99 (from the client's create call to the pod's
spec.nodeName arriving on a watch), CPU per pod of the extender, kube-scheduler, kube-apiserver and etcd (from
/proc/<pid>/stat), the extender's RSS, and the apiserver requests each client made per pod (from the apiserver's
audit log, written for the users vgpu-extender and system:kube-scheduler only), each of their writes' time at the
apiserver (p50/p90/p99 from the same log: the extender's Binding beside kube-scheduler's events of the same arm), the
apiserver's own means (its /metrics: APF's queue wait by flow schema, the handler after APF, etcd), and the
machine's busy CPU a pod, with what processes outside the benchmark took of it. After each extender wave the
apiserver's annotations are checked: no GPU over its memory, cores or sharers (over-commit), and no unbound pod left
in bind phase ``allocating`` past the bind grace (stale reservation).

    python benchmarks/scale.py --nodes 200 --pods 1000 --rate 100 --waves 2 [--one-node] [--json out.json]

kube-scheduler's client QPS (default 50, burst 100) also limits the baseline arm's own Bindings, so at its default the
baseline binds ~50 pods/s at most; `--scheduler-qps` raises it for both arms, and a rate above both arms' capacity
measures each arm's throughput (docs/performance.md, "At capacity, and kube-scheduler's client QPS").
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import json
import os
import platform
import random
import re
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_vgpu_dev.controlplane import ControlPlane
from kube_vgpu_dev.processes import cpu_seconds, rss_mib
from kube_vgpu_dev.stack import (
    BIND_GRACE_S,
    GPU_MEM,
    SCHEDULER,
    SPLIT,
    Extender,
    inventory,
    scheduler_config,
)
from vgpu import annotations as ann

GPUS_PER_NODE = 8
GROUP = "kube-vgpu.scale/group"
EXTENDER_USER = "vgpu-extender"
SCHEDULER_USER = "system:kube-scheduler"
ARMS = ("baseline", "extender")
ONE_NODE = "one-node"  # the third arm (--one-node): the extender with --filter-answers-one
# Every key the report carries per arm; tests/e2e/test_scale_benchmark_e2e.py checks them all.
ARM_FIELDS = (
    "pods",
    "bound",
    "unbound",
    "pods_per_s",
    "create_rate",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "cpu_ms_per_pod",
    "extender_threads_cpu_ms_per_pod",
    "extender_connections_per_pod",
    "extender_gc_ms_per_pod",
    "watch_events_per_pod",
    "requests_per_pod",
    "apiserver_write_ms",
    "apiserver_mean_ms",
    "machine_cpu_ms_per_pod",
    "extender_verb_calls",
    "extender_ms_per_pod",
    "failed_scheduling",
    "bind_refusals",
)
REPORT_FIELDS = (
    "config",
    "machine",
    "arms",
    "ratio_pods_per_s",
    "ratio_p50",
    "ratio_p99",
    "ratio_cpu_per_pod",
    "extender_rss_mib",
    "extender_peak_rss_mib",
    "over_commits",
    "stale_reservations",
    "setup_s",
)
_AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["{EXTENDER_USER}", "{SCHEDULER_USER}"]
  - level: None
"""


@dataclass(frozen=True)
class Config:
    nodes: int = 200
    pods: int = 1000  # per wave
    rate: float = 100.0  # pods created per second
    waves: int = 2  # per arm
    seed: int = 1
    settle_s: float = 15.0  # a wave ends when no pod has been bound for this long
    wave_timeout_s: float = 600.0
    one_node: bool = False  # also run the one-node arm
    # kube-scheduler's client QPS (burst twice it); None keeps its defaults, 50 and 100. Its own Binding, one a pod in
    # the baseline arm, goes through that client's rate limiter, so at the defaults the baseline cannot bind more
    # than ~50 pods/s whatever the cores allow; the extender arm's Bindings are the extender's, outside that limiter.
    scheduler_qps: float | None = None


@dataclass
class Wave:
    arm: str
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    threads_s: dict[str, float] = field(default_factory=dict)  # the extender's CPU by thread group
    connections: int = 0  # kube-scheduler's connections to the extender seen during the wave
    watch_events: collections.Counter[str] = field(default_factory=collections.Counter)  # the wave's pod events
    requests: dict[str, collections.Counter[str]] = field(default_factory=dict)
    write_ms: dict[str, list[float]] = field(default_factory=dict)  # each write's time at the apiserver (audit)
    apiserver: collections.Counter[str] = field(default_factory=collections.Counter)  # apiserver_timings' delta
    machine_s: dict[str, float] = field(default_factory=dict)  # the machine's busy CPU: all, load generator, others
    verbs: collections.Counter[str] = field(default_factory=collections.Counter)
    failed: collections.Counter[str] = field(default_factory=collections.Counter)


# ---- the workload


def shapes(cfg: Config) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(name suffix, labels, GPU limits) per pod of a wave (each wave's pods have their own names): 60 % llm-d P/D slices, 25 % whole cards, 15 % 2- or 4-GPU pods,
    about 0.9 GPUs a pod on average; the same sequence for every wave and arm."""
    rng = random.Random(cfg.seed)
    out = []
    for i in range(cfg.pods):
        x = rng.random()
        labels = {"llm-d.ai/model": f"m{i % 8}"}
        if x < 0.6:
            mem, cores = rng.choice([(10, 10), (20, 20), (25, 30), (30, 40), (40, 50), (50, 50)])
            labels["llm-d.ai/role"] = rng.choice(["prefill", "decode", "decode"])
            limits = {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem-percentage": str(mem),
                "nvidia.com/gpucores": str(cores),
            }
        elif x < 0.85:
            limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "100"}
        else:
            n = rng.choice([2, 4])
            limits = {"nvidia.com/gpu": str(n), "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "100"}
        out.append((f"p{i:05d}", labels, limits))
    return out


def pod_body(name: str, labels: dict[str, str], limits: dict[str, str] | None, wave: str) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if limits is not None:
        resources["limits"] = limits
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**labels, "wave": wave}},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {GROUP: "scale"},
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest", "resources": resources}],
        },
    }


def add_nodes(cp: ControlPlane, count: int) -> None:
    def one(i: int) -> None:
        name = f"gpu-{i:05d}"
        cp.add_node(
            name,
            {"cpu": "256", "memory": "2Ti", "pods": "250", "nvidia.com/gpu": str(GPUS_PER_NODE * SPLIT)},
            labels={GROUP: "scale"},
            annotations={ann.NODE_INVENTORY: inventory(name, GPUS_PER_NODE)},
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


# ---- measuring


class BindWatch:
    """Watches the namespace's pods (raw JSON, no model objects) and records when each first shows spec.nodeName."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        # Any: raw calls (_preload_content=False) return urllib3 responses, which the client's stubs do not model.
        self.core: Any = client.CoreV1Api(cp.api_client())
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.events_seen: set[str] = set()
        self.kinds: collections.Counter[str] = collections.Counter()  # watch events by type, as every watcher gets them
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the pod watch did not start")

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self.stop.is_set():  # at teardown the apiserver goes away under the stream
                raise

    def _watch(self) -> None:
        rv = self.core.list_namespaced_pod(self.namespace, limit=1).metadata.resource_version
        while not self.stop.is_set():
            resp = self.core.list_namespaced_pod(
                self.namespace, watch=True, resource_version=rv, timeout_seconds=60, _preload_content=False
            )
            self.ready.set()
            buf = b""
            for chunk in resp.stream(65536, decode_content=False):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    if not line:
                        continue
                    ev = orjson.loads(line)
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        rv = self.core.list_namespaced_pod(self.namespace, limit=1).metadata.resource_version
                        continue
                    rv = obj["metadata"]["resourceVersion"]
                    key = obj["metadata"]["name"]
                    self.kinds[ev["type"]] += 1
                    if ev["type"] != "DELETED" and obj["spec"].get("nodeName"):
                        with self.lock:
                            self.bound.setdefault(key, now)
                if self.stop.is_set():
                    break
            resp.release_conn()

    def close(self) -> None:
        self.stop.set()


WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})


@dataclass
class AuditTake:
    """What the audit log held since the last take: requests per user and `verb resource[/sub]`, and each write's
    time at the apiserver in ms (requestReceivedTimestamp to the ResponseComplete stage's stageTimestamp: APF's
    queue, admission, storage; not the client's network or TLS) per `user verb resource[/sub]`."""

    requests: dict[str, collections.Counter[str]]
    write_ms: dict[str, list[float]]


def _audit_time(stamp: str) -> float:
    """An audit timestamp (RFC 3339, microseconds, Z) as epoch seconds."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Audit:
    """Reads the apiserver's audit log from where it last stopped: requests per user and `verb resource[/sub]`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def take(self) -> AuditTake:
        seen: set[str] = set()
        out: dict[str, collections.Counter[str]] = {
            EXTENDER_USER: collections.Counter(),
            SCHEDULER_USER: collections.Counter(),
        }
        write_ms: dict[str, list[float]] = collections.defaultdict(list)
        if not self.path.exists():
            return AuditTake(out, {})
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            ev = orjson.loads(line)
            user = ev.get("user", {}).get("username")
            if user not in out or ev["auditID"] in seen:
                continue
            seen.add(ev["auditID"])  # a watch logs ResponseStarted and ResponseComplete: counted once
            ref = ev.get("objectRef") or {}
            what = ref.get("resource", ev.get("requestURI", "?"))
            if ref.get("subresource"):
                what += "/" + ref["subresource"]
            out[user][f"{ev['verb']} {what}"] += 1
            if ev["verb"] in WRITE_VERBS and ev.get("stage") == "ResponseComplete":
                took = _audit_time(ev["stageTimestamp"]) - _audit_time(ev["requestReceivedTimestamp"])
                write_ms[f"{user} {ev['verb']} {what}"].append(took * 1000)
        return AuditTake(out, dict(write_ms))


# The apiserver's own timings of a wave's writes, from its /metrics (k8s.io/apiserver v0.34.4: APF's
# apiserver_flowcontrol_request_wait_duration_seconds by flow_schema, the handler's apiserver_request_duration_seconds
# after APF, the storage's etcd_request_duration_seconds): (family, labels it must carry, name in the report).
APISERVER_TIMINGS = (
    ("apiserver_flowcontrol_request_wait_duration_seconds", ('execute="true"',), "apf wait {flow_schema}"),
    ("apiserver_request_duration_seconds", ('verb="POST"', 'resource="pods"', 'subresource=""'), "handler POST pods"),
    (
        "apiserver_request_duration_seconds",
        ('verb="POST"', 'resource="pods"', 'subresource="binding"'),
        "handler POST pods/binding",
    ),
    ("apiserver_request_duration_seconds", ('verb="POST"', 'resource="events"'), "handler POST events"),
    ("etcd_request_duration_seconds", ('resource="pods"',), "etcd {operation} pods"),
)


def apiserver_timings(cp: ControlPlane) -> collections.Counter[str]:
    """parse_timings of the apiserver's /metrics as the cluster admin reads it (seconds, requests)."""
    ac = cp.api_client()
    resp = ac.rest_client.pool_manager.request("GET", ac.configuration.host + "/metrics", timeout=60)
    if resp.status != 200:
        raise RuntimeError(f"the apiserver's /metrics answered {resp.status}")
    return parse_timings(resp.data.decode())


def parse_timings(text: str) -> collections.Counter[str]:
    """`sum NAME` and `count NAME` per APISERVER_TIMINGS name in a Prometheus text exposition (series of one name
    added up, e.g. a handler's over its scopes)."""
    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        for family, must, name in APISERVER_TIMINGS:
            for kind in ("sum", "count"):
                prefix = f"{family}_{kind}{{"
                if line.startswith(prefix) and all(m in line for m in must):
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', line[len(prefix) - 1 : line.rindex("}") + 1]))
                    out[f"{kind} {name.format(**labels)}"] += float(line.rsplit(" ", 1)[1])
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far, every core (proc(5), /proc/stat's first line: idle and
    iowait are not busy)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / tick, sum(ticks) / tick


def extender_verbs(ext: Extender) -> collections.Counter[str]:
    """Calls answered and seconds spent per verb (`count filter`, `sum filter`, ...): the extender's own latency
    histogram on /metrics, time from request read to answer inside the extender."""
    # Not ext.probe (5 s): at 1,000 nodes the extender's /metrics (per-GPU series of 8,000 GPUs) took longer on
    # this shared machine and ended a run.
    with urllib.request.urlopen(ext.health_url + "/metrics", timeout=120) as r:
        text = r.read().decode()
    pattern = r'^vgpu_extender_request_duration_seconds_(count|sum)\{verb="(\w+)"\} (\S+)$'
    out = collections.Counter({f"{kind} {verb}": float(v) for kind, verb, v in re.findall(pattern, text, re.M)})
    # The garbage collector's seconds by generation (inside the threads' CPU): `gc 0`, `gc 1`, `gc 2`.
    for gen, v in re.findall(r'^vgpu_extender_gc_seconds_total\{generation="(\d)"\} (\S+)$', text, re.M):
        out[f"gc {gen}"] = float(v)
    return out


# The extender's threads by the name they give the kernel (scheduler_extender.threadnames); its main thread runs
# the event loop (TLS, HTTP, routing, answers).
THREAD_GROUPS = (
    ("verb_", "verb workers"),
    ("bind_", "bind"),
    ("reflector-pods", "pod watch"),
    ("reflector-nodes", "node watch"),
)


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Per thread of `pid`: its group (THREAD_GROUPS, `event loop` for the main thread, else `other`) and its
    utime + stime in seconds (proc(5), /proc/<pid>/task/<tid>/stat). A thread that ended meanwhile is left out."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        tid = int(task.name)
        group = "event loop" if tid == pid else next((g for p, g in THREAD_GROUPS if comm.startswith(p)), "other")
        out[tid] = (group, (int(fields[11]) + int(fields[12])) / tick)
    return out


def threads_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per thread group between two `thread_cpu` reads (a thread started meanwhile counts from 0)."""
    out: collections.Counter[str] = collections.Counter()
    for tid, (group, s) in after.items():
        out[group] += s - before.get(tid, (group, 0.0))[1]
    return dict(out)


class ConnectionSampler:
    """kube-scheduler's TCP connections to the extender's port, sampled from /proc/net/tcp every `period_s` (no
    process spawned per sample): a connection is counted once per peer port seen established. One opened and closed
    between two samples is missed, so this is a floor; each new connection costs the extender a TLS handshake."""

    def __init__(self, port: int, period_s: float = 0.05) -> None:
        self.local = f":{port:04X}"
        self.period_s = period_s
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conn-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        table = Path("/proc/net/tcp")  # the extender listens on 127.0.0.1
        while not self._stop.is_set():
            for line in table.read_text().splitlines()[1:]:
                parts = line.split()  # sl local_address rem_address st ...; st 01 is ESTABLISHED
                if len(parts) > 3 and parts[3] == "01" and parts[1].endswith(self.local):
                    self.seen.add(parts[2])
            self._stop.wait(self.period_s)

    def close(self) -> int:
        self._stop.set()
        self._thread.join(timeout=10)
        return len(self.seen)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# ---- checks from the apiserver


def audit_pods(core: Any, namespace: str, wave: str) -> tuple[int, int]:
    """(over-committed GPUs, stale reservations) among a wave's pods, from the apiserver's annotations."""
    per_gpu: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    stale = 0
    now = time.time()
    pods = core.list_namespaced_pod(namespace, label_selector=f"wave={wave}", _preload_content=False)
    for p in orjson.loads(pods.data)["items"]:
        a = p["metadata"].get("annotations") or {}
        if p["spec"].get("nodeName"):
            if ann.POD_ASSIGNMENT not in a:
                raise AssertionError(f"{p['metadata']['name']}: bound to {p['spec']['nodeName']} without an assignment")
            assignment = ann.decode_assignment(a[ann.POD_ASSIGNMENT])
            if assignment.node != p["spec"]["nodeName"]:
                raise AssertionError(f"{p['metadata']['name']}: assignment on {assignment.node}, bound elsewhere")
            for d in assignment.slices():
                g = per_gpu[d.uuid]
                g[0], g[1], g[2] = g[0] + d.memory_mib, g[1] + d.cores, g[2] + 1
        elif (
            a.get(ann.POD_BIND_PHASE) == ann.BindPhase.ALLOCATING.value
            and now - float(a.get(ann.POD_BIND_TIME) or 0) > BIND_GRACE_S
        ):
            stale += 1
    over = [(u, g) for u, g in per_gpu.items() if g[0] > GPU_MEM or g[1] > 100 or g[2] > SPLIT]
    for u, g in over:
        print(f"  over-commit on {u}: {g[0]} MiB, {g[1]} % cores, {g[2]} sharers", file=sys.stderr)
    return len(over), stale


# ---- the run


def create_pod(core: Any, namespace: str, body: dict[str, Any], attempts: int = 5) -> None:
    """Create a pod, as a controller would: an overloaded apiserver's 429/5xx (a 504 after its 60 s request timeout
    ended one run) or a dropped connection is retried with backoff; a 409 after a retried attempt means the earlier
    attempt landed."""
    for attempt in range(attempts):
        try:
            resp = core.create_namespaced_pod(namespace, body, _preload_content=False)
            # Read to its end so the connection goes back to the pool: an unread raw answer keeps it, and the next
            # create paid a new TLS handshake with the apiserver (its CPU counted in both arms), which a controller's
            # client does not.
            resp.read()
            resp.release_conn()
            return
        except ApiException as exc:
            if exc.status == 409 and attempt:
                return
            if (exc.status != 429 and exc.status < 500) or attempt == attempts - 1:
                raise
        except urllib3.exceptions.HTTPError:
            if attempt == attempts - 1:
                raise
        time.sleep(0.5 * 2**attempt)


def run_wave(
    cfg: Config,
    cp: ControlPlane,
    ext: Extender,
    watch: BindWatch,
    audit: Audit,
    namespace: str,
    arm: str,
    index: int,
) -> tuple[Wave, int, int]:
    """Create one wave at cfg.rate, wait until binding stops, check it (extender arm), delete it."""
    core: Any = client.CoreV1Api(cp.api_client())
    wave_name = f"{arm}-{index}"
    w = Wave(arm)
    pids = {"extender": ext.proc.pid, "kube-scheduler": cp.scheduler.pid}  # type: ignore[union-attr]
    pids |= {p.name: p.pid for p in cp.processes if p.name in ("kube-apiserver", "etcd")}
    cpu0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
    threads0 = thread_cpu(pids["extender"])
    kinds0 = collections.Counter(watch.kinds)
    sampler = ConnectionSampler(ext.port)
    verbs0 = extender_verbs(ext)
    audit.take()
    timings0 = apiserver_timings(cp)
    machine0, own0 = machine_cpu()[0], cpu_seconds(os.getpid())
    bodies = [
        (f"{wave_name}-{n}", pod_body(f"{wave_name}-{n}", labels, limits if arm != "baseline" else None, wave_name))
        for n, labels, limits in shapes(cfg)
    ]
    t0 = time.monotonic()

    def create(i: int) -> None:
        name, body = bodies[i]
        due = t0 + i / cfg.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        started = time.monotonic()
        create_pod(core, namespace, body)
        w.created[name] = started  # from the first attempt: a retried create counts its wait as latency

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(len(bodies))))
    keys = set(w.created)
    last_change, last_count = time.monotonic(), -1
    while True:
        with watch.lock:
            count = sum(1 for k in keys if k in watch.bound)
        now = time.monotonic()
        if count != last_count:
            last_change, last_count = now, count
        if count == len(keys) or now - last_change > cfg.settle_s or now - t0 > cfg.wave_timeout_s:
            break
        time.sleep(0.2)
    w.connections = sampler.close()
    with watch.lock:
        w.bound = {k: watch.bound[k] for k in keys if k in watch.bound}
    over, stale = audit_pods(core, namespace, wave_name) if arm != "baseline" else (0, 0)
    events = orjson.loads(core.list_namespaced_event(namespace, _preload_content=False).data)["items"]
    for e in events:
        if (
            e.get("reason") == "FailedScheduling"
            and e["involvedObject"]["name"] in keys
            and e["metadata"]["name"] not in watch.events_seen
        ):
            watch.events_seen.add(e["metadata"]["name"])
            w.failed[re.sub(r"\d+", "N", e.get("message", ""))[:160]] += e.get("count") or 1
    w.verbs = extender_verbs(ext)
    w.verbs.subtract(verbs0)
    core.delete_collection_namespaced_pod(namespace, label_selector=f"wave={wave_name}", grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod(namespace, label_selector=f"wave={wave_name}", limit=1).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"wave {wave_name} was not deleted in 120 s")
        time.sleep(0.5)
    while any(x["pod"].startswith(namespace + "/") for x in ext.get("/state")["allocations"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the extender still holds slices of wave {wave_name} 120 s after its deletion")
        time.sleep(0.5)
    w.cpu_s = {k: cpu_seconds(pid) - cpu0[k] for k, pid in pids.items()}
    busy, own = machine_cpu()[0] - machine0, cpu_seconds(os.getpid()) - own0
    # "others": every process on the machine but the four measured and this one (its load generator and pod watch):
    # other work sharing the cores, which stretches every request of the wave.
    w.machine_s = {"busy": busy, "load generator": own, "others": max(0.0, busy - own - sum(w.cpu_s.values()))}
    w.apiserver = apiserver_timings(cp)
    w.apiserver.subtract(timings0)
    w.threads_s = threads_delta(threads0, thread_cpu(pids["extender"]))
    w.watch_events = collections.Counter(watch.kinds)
    w.watch_events.subtract(kinds0)
    taken = audit.take()
    w.requests, w.write_ms = taken.requests, taken.write_ms
    return w, over, stale


ONE_NODE_FLAG = "--filter-answers-one"


def restart_extender(cp: ControlPlane, ext: Extender, *, one_node: bool) -> None:
    """Stop the extender and start it again (same port and certificates, so kube-scheduler's config holds) with or
    without --filter-answers-one; it is ready once its first lists are applied."""
    if ext.proc is not None:
        cp.stop_process(ext.proc)
    ext.args = tuple(a for a in ext.args if a != ONE_NODE_FLAG) + ((ONE_NODE_FLAG,) if one_node else ())
    ext.start()


def summarise(waves: list[Wave]) -> dict[str, Any]:
    created = {k: v for w in waves for k, v in w.created.items()}
    lat = [(w.bound[k] - w.created[k]) * 1000 for w in waves for k in w.bound]
    pods = len(created)
    bound = sum(len(w.bound) for w in waves)
    span = sum(max(w.bound.values()) - min(w.created.values()) for w in waves if w.bound)
    create_span = sum(max(w.created.values()) - min(w.created.values()) for w in waves)
    cpu: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    verbs: collections.Counter[str] = collections.Counter()
    reqs: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    write_ms: dict[str, list[float]] = collections.defaultdict(list)
    apiserver: collections.Counter[str] = collections.Counter()
    machine: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = sum((w.failed for w in waves), collections.Counter())
    for w in waves:
        cpu.update(w.cpu_s)
        threads.update(w.threads_s)
        kinds.update(w.watch_events)
        verbs.update(w.verbs)
        for user, c in w.requests.items():
            reqs[user].update(c)
        for what, ms in w.write_ms.items():
            write_ms[what] += ms
        apiserver.update(w.apiserver)
        machine.update(w.machine_s)
    return {
        "pods": pods,
        "bound": bound,
        "unbound": pods - bound,
        "pods_per_s": round(bound / span, 1) if span else 0.0,
        "create_rate": round(pods / create_span, 1) if create_span else 0.0,
        "p50_ms": round(percentile(lat, 0.50), 1),
        "p99_ms": round(percentile(lat, 0.99), 1),
        "max_ms": round(max(lat, default=float("nan")), 1),
        "cpu_ms_per_pod": {k: round(v * 1000 / max(bound, 1), 2) for k, v in sorted(cpu.items())},
        "extender_threads_cpu_ms_per_pod": {
            k: round(v * 1000 / max(bound, 1), 2) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
        },
        # kube-scheduler's connections to the extender (sampled: a floor) per bound pod; 0 in the baseline arm.
        "extender_connections_per_pod": round(sum(w.connections for w in waves) / max(bound, 1), 3),
        # Pod watch events of the wave's namespace per bound pod, by type: what the extender's pod watch decodes.
        "watch_events_per_pod": {k: round(v / max(bound, 1), 2) for k, v in sorted(kinds.items()) if v},
        "requests_per_pod": {
            user: {
                "total": round(sum(c.values()) / max(bound, 1), 2),
                **{k: round(v / max(bound, 1), 3) for k, v in sorted(c.items())},
            }
            for user, c in sorted(reqs.items())
        },
        # Each client's writes at the apiserver (audit log: received to response complete), ms: every writer's
        # requests in the same arm, so one client's slow calls tell apart from an apiserver slow for all.
        "apiserver_write_ms": {
            what: {
                "n": len(ms),
                "p50": round(percentile(ms, 0.50), 1),
                "p90": round(percentile(ms, 0.90), 1),
                "p99": round(percentile(ms, 0.99), 1),
            }
            for what, ms in sorted(write_ms.items())
            if len(ms) >= 10
        },
        # The apiserver's own mean ms per request of the arm (its /metrics): APF's queue wait by flow schema, the
        # handler after APF by request, etcd by operation (all its clients: the load generator's creates too).
        "apiserver_mean_ms": {
            name[4:]: round(apiserver[name] * 1000 / apiserver["count " + name[4:]], 1)
            for name in sorted(apiserver)
            if name.startswith("sum ") and apiserver["count " + name[4:]] >= 10
        },
        # The machine's CPU a bound pod: all of it busy, the benchmark's own process, and others (neither it nor
        # the four processes above): a shared machine shows here.
        "machine_cpu_ms_per_pod": {k: round(v * 1000 / max(bound, 1), 2) for k, v in sorted(machine.items())},
        "extender_verb_calls": int(sum(verbs[f"count {v}"] for v in ("filter", "prioritize", "bind"))),
        # Inside the extender, per bound pod: every call a pod needed (retries too), by verb.
        "extender_ms_per_pod": {
            k.split()[1]: round(v * 1000 / max(bound, 1), 2)
            for k, v in sorted(verbs.items())
            if k.startswith("sum ") and v
        },
        # The extender's garbage collections per bound pod, ms by generation (part of its threads' CPU above).
        "extender_gc_ms_per_pod": {
            k.split()[1]: round(v * 1000 / max(bound, 1), 2) for k, v in sorted(verbs.items()) if k.startswith("gc ")
        },
        "failed_scheduling": dict(failed.most_common(3)),
        # Binds the extender refused or failed (FailedScheduling events of /bind), by cause: the races the soft
        # holds and the reservation at /bind's arrival address are "no longer fits".
        "bind_refusals": {
            "no_longer_fits": sum(n for m, n in failed.items() if m.startswith("bind ") and "no longer fits" in m),
            "outcome_unknown": sum(n for m, n in failed.items() if m.startswith("bind ") and "outcome unknown" in m),
            "total": sum(n for m, n in failed.items() if m.startswith("bind ")),
        },
    }


def cpu_ratio(arm: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """The CPU a bound pod of etcd, the apiserver, kube-scheduler and the extender together, `arm` over `baseline`."""
    mine, base = sum(arm["cpu_ms_per_pod"].values()), sum(baseline["cpu_ms_per_pod"].values())
    return round(mine / base, 3) if base else None


def with_client_qps(config_yaml: str, qps: float | None) -> str:
    """The scheduler config with clientConnection.qps and burst (2 x qps) set, or as it is for None.

    kube-scheduler defaults them to 50 and 100 (kubernetes v1.34.4 pkg/scheduler/apis/config/v1/defaults.go) and gives
    them to the client its DefaultBinder's Binding goes through (cmd/kube-scheduler/app/options/options.go,
    `createKubeConfig`, `createClients`; its events have a client, and a limiter, of their own)."""
    if qps is None:
        return config_yaml
    config = yaml.safe_load(config_yaml)
    config.setdefault("clientConnection", {}).update({"qps": qps, "burst": max(1, int(2 * qps))})
    return str(yaml.safe_dump(config))


def run(cfg: Config) -> dict[str, Any]:
    if cfg.nodes < 1 or cfg.pods < 1 or cfg.rate <= 0 or cfg.waves < 1:
        raise ValueError(f"--nodes, --pods, --waves must be >= 1 and --rate > 0; got {cfg}")
    if cfg.scheduler_qps is not None and cfg.scheduler_qps <= 0:
        raise ValueError(f"--scheduler-qps must be > 0; got {cfg.scheduler_qps}")
    setup0 = time.monotonic()
    cp = ControlPlane(verbosity=1)
    cp.workdir.mkdir(parents=True, exist_ok=True)
    (cp.workdir / "audit-policy.yaml").write_text(_AUDIT_POLICY)
    audit_log = cp.workdir / "audit.log"
    cp.extra_apiserver_args += [
        f"--audit-policy-file={cp.workdir / 'audit-policy.yaml'}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
    ]
    with cp:
        core: Any = client.CoreV1Api(cp.api_client())
        namespace = "scale"
        core.create_namespace({"metadata": {"name": namespace}})
        add_nodes(cp, cfg.nodes)
        ext = Extender(cp)
        ext.start()
        cp.start_scheduler(with_client_qps(scheduler_config(cp, ext), cfg.scheduler_qps))
        watch = BindWatch(cp, namespace)
        audit = Audit(audit_log)
        setup_s = time.monotonic() - setup0
        arms_run = (*ARMS, ONE_NODE) if cfg.one_node else ARMS
        per_arm: dict[str, list[Wave]] = {a: [] for a in arms_run}
        over = stale = 0
        peak_rss = 0.0
        try:
            for i in range(cfg.waves):
                # The two GPU arms swap places every other wave, so neither always runs right after the other.
                for arm in arms_run if i % 2 == 0 else (arms_run[0], *reversed(arms_run[1:])):
                    if cfg.one_node and arm != "baseline":  # each GPU wave on a fresh extender, with its setting
                        peak_rss = max(peak_rss, rss_mib(ext.proc.pid)[1])  # type: ignore[union-attr]
                        restart_extender(cp, ext, one_node=arm == ONE_NODE)
                    w, o, s = run_wave(cfg, cp, ext, watch, audit, namespace, arm, i)
                    per_arm[arm].append(w)
                    over, stale = over + o, stale + s
                    peak_rss = max(peak_rss, rss_mib(ext.proc.pid)[1])  # type: ignore[union-attr]
                    print(
                        f"  wave {arm}-{i}: {len(w.bound)}/{len(w.created)} bound, "
                        f"extender CPU {w.cpu_s['extender']:.1f} s",
                        file=sys.stderr,
                    )
            rss, hwm = rss_mib(ext.proc.pid)  # type: ignore[union-attr]
            leftover = orjson.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
            if leftover:
                raise AssertionError(f"{len(leftover)} pods left after the last wave was deleted")
        finally:
            watch.close()
            cp.stop_scheduler()
            if ext.proc is not None:
                cp.stop_process(ext.proc)
    arms = {a: summarise(ws) for a, ws in per_arm.items()}
    b, e = arms["baseline"], arms["extender"]
    one = arms.get(ONE_NODE)
    one_node_ratios = (
        {}
        if one is None
        else {
            "ratio_pods_per_s_one_node": round(one["pods_per_s"] / b["pods_per_s"], 3) if b["pods_per_s"] else None,
            "ratio_p50_one_node": round(one["p50_ms"] / b["p50_ms"], 2) if b["p50_ms"] else None,
            "ratio_p99_one_node": round(one["p99_ms"] / b["p99_ms"], 2) if b["p99_ms"] else None,
            "ratio_cpu_per_pod_one_node": cpu_ratio(one, b),
        }
    )
    return {
        "config": asdict(cfg),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}",
        "arms": arms,
        "ratio_pods_per_s": round(e["pods_per_s"] / b["pods_per_s"], 3) if b["pods_per_s"] else None,
        "ratio_p50": round(e["p50_ms"] / b["p50_ms"], 2) if b["p50_ms"] else None,
        "ratio_p99": round(e["p99_ms"] / b["p99_ms"], 2) if b["p99_ms"] else None,
        # What bounds the ratio of pods/s where the cores, not a rate limit, are what runs out.
        "ratio_cpu_per_pod": cpu_ratio(e, b),
        **one_node_ratios,
        "extender_rss_mib": round(rss, 1),
        "extender_peak_rss_mib": round(max(hwm, peak_rss), 1),
        "over_commits": over,
        "stale_reservations": stale,
        "setup_s": round(setup_s, 1),
    }


def print_report(r: dict[str, Any]) -> None:
    c = r["config"]
    print(
        f"scale: {c['nodes']} nodes x {GPUS_PER_NODE} GPUs, {c['waves']} waves x {c['pods']} pods per arm at "
        f"{c['rate']:g} pods/s; kube-scheduler client QPS {c.get('scheduler_qps') or 'default (50)'}; {r['machine']}; "
        f"setup {r['setup_s']} s"
    )
    print(f"{'arm':<10}{'bound':>12}{'pods/s':>9}{'create/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for arm, a in r["arms"].items():
        print(
            f"{arm:<10}{a['bound']:>7}/{a['pods']:<4}{a['pods_per_s']:>9}{a['create_rate']:>10}"
            f"{a['p50_ms']:>9}{a['p99_ms']:>9}{a['max_ms']:>9}"
        )
    print(f"ratio extender/baseline: pods/s {r['ratio_pods_per_s']}, p50 {r['ratio_p50']}x, p99 {r['ratio_p99']}x")
    print(f"ratio extender/baseline of the four processes' CPU a bound pod: {r['ratio_cpu_per_pod']}x")
    if "ratio_pods_per_s_one_node" in r:
        print(
            f"ratio one-node/baseline: pods/s {r['ratio_pods_per_s_one_node']}, p50 {r['ratio_p50_one_node']}x, "
            f"p99 {r['ratio_p99_one_node']}x, four processes' CPU a bound pod {r['ratio_cpu_per_pod_one_node']}x"
        )
    for arm, a in r["arms"].items():
        cpu = ", ".join(f"{k} {v}" for k, v in a["cpu_ms_per_pod"].items())
        print(f"CPU ms per bound pod ({arm}): {cpu}")
        threads = ", ".join(f"{k} {v}" for k, v in a["extender_threads_cpu_ms_per_pod"].items())
        print(f"extender CPU ms per bound pod by thread ({arm}): {threads}")
        print(f"pod watch events per bound pod ({arm}): {json.dumps(a['watch_events_per_pod'])}")
        print(f"extender GC ms per bound pod by generation ({arm}): {json.dumps(a['extender_gc_ms_per_pod'])}")
        print(
            f"kube-scheduler connections to the extender per bound pod ({arm}, sampled): {a['extender_connections_per_pod']}"
        )
        for user, reqs in a["requests_per_pod"].items():
            print(f"apiserver requests per bound pod ({arm}, {user}): {json.dumps(reqs)}")
        for what, q in a["apiserver_write_ms"].items():
            print(
                f"apiserver time of writes ({arm}, {what}): n {q['n']}, p50 {q['p50']}, p90 {q['p90']}, p99 {q['p99']} ms"
            )
        print(f"apiserver mean ms per request ({arm}): {json.dumps(a['apiserver_mean_ms'])}")
        print(f"machine CPU ms per bound pod ({arm}): {json.dumps(a['machine_cpu_ms_per_pod'])}")
        print(
            f"extender verb calls ({arm}): {a['extender_verb_calls']}; ms inside it per bound pod: {a['extender_ms_per_pod']}"
        )
        for msg, n in a["failed_scheduling"].items():
            print(f"FailedScheduling x{n} ({arm}): {msg}")
        print(f"binds refused or failed ({arm}): {json.dumps(a['bind_refusals'])}")
    print(f"extender RSS {r['extender_rss_mib']} MiB (peak {r['extender_peak_rss_mib']} MiB)")
    print(f"over-commits {r['over_commits']}, stale reservations {r['stale_reservations']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=Config.nodes, help="Node objects, 8 GPUs each")
    p.add_argument("--pods", type=int, default=Config.pods, help="pods per wave")
    p.add_argument("--rate", type=float, default=Config.rate, help="pods created per second")
    p.add_argument("--waves", type=int, default=Config.waves, help="waves per arm (arms alternate)")
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--settle", type=float, default=Config.settle_s, help="a wave ends after this long with no bind")
    p.add_argument(
        "--one-node",
        action="store_true",
        help="also run the one-node arm: the extender restarted with --filter-answers-one, against the same baseline",
    )
    p.add_argument(
        "--scheduler-qps",
        type=float,
        help="kube-scheduler's client QPS, burst twice it (default: its own, 50 and 100, which caps the baseline "
        "arm's Bindings at ~50 pods/s)",
    )
    p.add_argument("--json", type=Path, help="also write the report here")
    a = p.parse_args(argv)
    try:
        cfg = Config(
            a.nodes, a.pods, a.rate, a.waves, a.seed, a.settle, one_node=a.one_node, scheduler_qps=a.scheduler_qps
        )
        report = run(cfg)
    except ValueError as exc:
        p.error(str(exc))
    print_report(report)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    return 0 if report["over_commits"] == 0 and report["stale_reservations"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
