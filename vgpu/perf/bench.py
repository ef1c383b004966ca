"""The P/D packing benchmark: play a generated workload through the planner under each compared
configuration, evaluate the model at every checkpoint, average. Pure (the CLI prints and plots).

Each pod goes through `vgpu.simulate.place` (Planner.evaluate, best node, ClusterState.apply), exactly the
extender's path; deleted pods are released and pending pods retried in creation order after every change,
as kube-scheduler retries unschedulable pods when the cluster changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vgpu.config import PlacementConfig, RequestDefaults, ResourceNames, RoleRules
from vgpu.errors import RequestError
from vgpu.perf import cluster
from vgpu.perf.pairing import PairingChances
from vgpu.perf.params import PerfParams
from vgpu.perf.workload import Checkpoint, Create, Delete, Workload
from vgpu.planner import Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.simulate import Placed, build_state, place

# HAMi's request default: a container without nvidia.com/gpucores gets no SM limit (best effort).
HAMI_DEFAULTS = RequestDefaults(cores=0)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    name: str
    placement: PlacementConfig
    defaults: RequestDefaults = RequestDefaults()
    note: str = ""


def configs() -> list[BenchConfig]:
    """The compared configurations (docs/pd-packing.md, "Configurations"), baselines first."""
    off = RoleRules.off()
    return [
        BenchConfig(
            "hami",
            PlacementConfig(node_policy="binpack", gpu_policy="spread", roles=off),
            HAMI_DEFAULTS,
            "HAMi defaults: node binpack, GPU spread, unset gpucores = no SM limit",
        ),
        BenchConfig(
            "hami-cores",
            PlacementConfig(node_policy="binpack", gpu_policy="spread", roles=off),
            note="HAMi placement with our request default (proportional SMs)",
        ),
        BenchConfig("binpack", PlacementConfig(node_policy="binpack", roles=off), note="node and GPU binpack"),
        BenchConfig("spread", PlacementConfig(node_policy="spread", roles=off), note="node and GPU spread"),
        BenchConfig(
            "fragaware-noroles",
            PlacementConfig(node_policy="fragaware", roles=off),
            note="our packing policy, role rules off",
        ),
        BenchConfig("default", PlacementConfig(), note="our default: fragaware + role rules"),
    ]


@dataclass(slots=True)
class RunResult:
    config: str
    seed: int
    # s_sat -> metric -> mean over checkpoints
    metrics: dict[float, dict[str, float]] = field(default_factory=dict)
    pending_share: float = 0.0  # mean over checkpoints of unallocated requested GPU-equivalents
    pending_pods: float = 0.0


def _share(info: PodInfo, gpu_mib: int) -> float:
    return sum(
        c.count * max(c.memory_on(gpu_mib) / gpu_mib, c.cores_on(gpu_mib) / 100) for c in info.request.containers
    )


def run(work: Workload, bench: BenchConfig, seed: int, s_sats: Sequence[float], params: PerfParams) -> RunResult:
    state = build_state(work.nodes, config=bench.placement)
    planner = Planner(state)
    gpu_mib = work.nodes[0].gpus[0].memory_mib
    names = ResourceNames()
    pending: dict[str, PodInfo] = {}
    out = RunResult(bench.name, seed)
    rows: dict[float, list[dict[str, float]]] = {s: [] for s in s_sats}
    shares: list[float] = []
    waiting: list[float] = []
    chances = PairingChances()

    def placed(info: PodInfo) -> bool:
        feasible = chances.before_place(state, info)
        if not isinstance(place(planner, info), Placed):
            return False
        chances.placed(state, info, feasible)
        return True

    def retry() -> None:
        for key in list(pending):
            if placed(pending[key]):
                del pending[key]

    for ev in work.events:
        if isinstance(ev, Create):
            try:
                info = pod_info(ev.pod, names, bench.defaults)
            except RequestError:
                continue
            if not placed(info):
                pending[info.key] = info
        elif isinstance(ev, Delete):
            if pending.pop(ev.key, None) is None and state.release(ev.key) is not None:
                chances.released(ev.key)
                retry()
        elif isinstance(ev, Checkpoint):
            retry()
            for s in s_sats:
                metrics, _ = cluster.evaluate(state, ev.deployments, work.gpu, params.with_(s_sat=s), chances)
                rows[s].append(metrics.as_dict())
            want = sum(_share(p, gpu_mib) for p in pending.values())
            total = want + sum(
                max(s.memory_mib / gpu_mib, s.cores / 100) for a in state.assignments.values() for s in a.slices()
            )
            shares.append(want / total if total else 0.0)
            waiting.append(float(len(pending)))
    out.metrics = {s: cluster.mean(r) for s, r in rows.items()}
    out.pending_share = sum(shares) / len(shares) if shares else 0.0
    out.pending_pods = sum(waiting) / len(waiting) if waiting else 0.0
    return out
