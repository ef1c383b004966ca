"""Small hand-made openb-style clusters for the policy tests: build, place, ask the planner's choice."""

from __future__ import annotations

from vgpu.config import PlacementConfig
from vgpu.planner import Planner
from vgpu.replay.trace import NodeRow, PodRow, to_inventory, to_pod_info
from vgpu.state import ClusterState, HostUse

_n = 0


def cluster(policy: str, *nodes: NodeRow) -> Planner:
    state = ClusterState(PlacementConfig(node_policy=policy))
    for n in nodes:
        state.upsert_node(to_inventory(n))
    return Planner(state)


def pod(gpu_milli: int = 1000, num_gpu: int = 1, cpu: int = 1000, mem: int = 1024) -> PodRow:
    global _n
    _n += 1
    return PodRow(f"p{_n}", cpu, mem, num_gpu, gpu_milli if num_gpu else 0)


def place(planner: Planner, node: str, row: PodRow, gpu: int | None = None) -> None:
    """Put a pod on a given node (and GPU), bypassing the policy: sets up the scenario."""
    info = to_pod_info(row, row.name)
    result = planner.evaluate_node(node, info)
    assert result.placement is not None, result.failure
    a = result.placement.assignment(info)
    if gpu is not None:
        from dataclasses import replace

        inv = planner.state.nodes[node].gpus[gpu].device
        c = a.containers[0]
        dev = replace(c.devices[0], uuid=inv.uuid, index=inv.index)
        a = replace(a, containers=(replace(c, devices=(dev,)),))
    planner.state.apply(info.key, a, HostUse(info.cpu_milli, info.memory_mib))


def choice(planner: Planner, row: PodRow) -> tuple[str, list[int]]:
    """The node the policy scores best (ties: name order) and the GPU indices it picks there."""
    info = to_pod_info(row, row.name)
    planner.policy(planner.config.node_policy).observe(info)
    ev = planner.evaluate(info)
    name = max(sorted(ev.feasible), key=lambda n: ev.feasible[n].score)
    placement = ev.feasible[name].placement
    assert placement is not None
    return name, [d.index for c in placement.containers for d in c.devices]


def node(name: str, gpus: int = 4, cpu: int = 64_000, mem: int = 262_144, model: str = "G2") -> NodeRow:
    return NodeRow(name, cpu, mem, gpus, model)
