"""Placement in the loop: place a P/D deployment with the planner under one of `vgpu pd-bench`'s
configurations (our default, HAMi's defaults, binpack, spread...) and turn what it placed into the what-if's
pool, with each slice's effective SM share and co-residence slowdown from `vgpu.perf.cluster.gpu_view`
(bandwidth shared by co-resident decodes, a prefill's co-run penalty, unpartitioned SMs). Pure.

Every pod goes through `vgpu.simulate.place` (Planner.evaluate, the best node, ClusterState.apply), what the
extender does for it; `neighbours` are other deployments placed first (in rollout order, like the target)
that share the GPUs but are not simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vgpu.annotations import Assignment
from vgpu.config import PlacementConfig, ResourceNames
from vgpu.devices import NodeInventory
from vgpu.perf import cluster
from vgpu.perf.bench import BenchConfig
from vgpu.perf.params import GpuSpec, PerfParams
from vgpu.perf.workload import RACK_LABEL, Deployment, pod
from vgpu.planner import Planner
from vgpu.pod import PodInfo, pod_info
from vgpu.roles import Role
from vgpu.simulate import Placed, build_state, place
from vgpu.state import ClusterState
from vgpu.whatif.deployment import Instance, Pool


@dataclass(frozen=True, slots=True)
class Placement:
    config: str
    pool: Pool
    unplaced: tuple[str, ...]  # pods of the target deployment the planner could not place


def _pods(dep: Deployment) -> list[dict[str, object]]:
    """Prefills and decodes interleaved, as a rollout creates them."""
    out: list[dict[str, object]] = []
    for i in range(max(dep.prefill, dep.decode)):
        if i < dep.prefill:
            out.append(pod(dep, "prefill", i))
        if i < dep.decode:
            out.append(pod(dep, "decode", i))
    return out


def place_pool(
    target: Deployment,
    nodes: Sequence[NodeInventory],
    config: BenchConfig,
    gpu: GpuSpec,
    params: PerfParams,
    neighbours: Sequence[Deployment] = (),
) -> Placement:
    """Place `neighbours` then `target` under `config`; the target's placed slices as a what-if pool."""
    state = build_state(nodes, config=config.placement)
    planner = Planner(state)
    names = ResourceNames()
    unplaced: list[str] = []
    for dep in (*neighbours, target):
        for manifest in _pods(dep):
            info = pod_info(manifest, names, config.defaults)
            if not isinstance(place(planner, info), Placed) and dep is target:
                unplaced.append(info.key)
    instances = _instances(state, target.identity, params)
    return Placement(config.name, Pool(target.template.model, gpu, tuple(instances)), tuple(unplaced))


def _instances(state: ClusterState, identity: str, params: PerfParams) -> list[Instance]:
    """The placed prefill and decode slices of the pool `identity`, with SM share and slowdown on their GPUs."""
    views = {u.device.uuid: cluster.gpu_view(u, params) for n in state.nodes.values() for u in n.gpus if u.holders}
    instances: list[Instance] = []
    for key, a in sorted(state.assignments.items()):
        if a.model != identity or a.role not in (Role.PREFILL, Role.DECODE):
            continue
        slices = a.slices()
        prefill = a.role is Role.PREFILL
        share = min(views[s.uuid].sm_share[key] for s in slices)
        slow = max(views[s.uuid].prefill_slowdown if prefill else views[s.uuid].decode_slowdown for s in slices)
        instances.append(
            Instance(
                name=key.split("/", 1)[1],
                role="prefill" if prefill else "decode",
                sm_share=min(1.0, share),
                memory_gb=max(s.memory_mib for s in slices) * 1024**2 / 1e9,
                gpu=slices[0].uuid,
                node=a.node,
                rack=state.nodes[a.node].inventory.labels.get(RACK_LABEL, a.node),
                tp=len(slices),
                slowdown=slow,
            )
        )
    return instances


@dataclass(frozen=True, slots=True)
class PlacedPods:
    """Each model pool's placed instances (by model identity, in first-seen order) and what was not placed."""

    pools: dict[str, list[Instance]]
    unplaced: dict[str, str]  # pod key -> why the planner did not place it


def place_pods(
    pods: Sequence[PodInfo],
    nodes: Sequence[NodeInventory],
    allocations: Sequence[tuple[str, Assignment]],
    config: PlacementConfig,
    params: PerfParams,
) -> PlacedPods:
    """Place the user's pods in order on a cluster already holding `allocations`, as the extender would;
    pods of a model pool (vgpu.roles.model_identity) come back grouped by pool."""
    state = build_state(nodes, allocations, config=config)
    planner = Planner(state)
    unplaced: dict[str, str] = {}
    for info in pods:
        result = place(planner, info)
        if not isinstance(result, Placed):
            unplaced[info.key] = result.reason
    models = list(dict.fromkeys(i.model for i in pods if i.model is not None))
    return PlacedPods({m: _instances(state, m, params) for m in models}, unplaced)
