"""The report `demo` and `show` print: per node, per GPU, who holds what, then totals and failures.

Built once as plain JSON-ready data, so `--json` and the table show exactly the same facts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from vgpu.simulate import Placed, Rejected
from vgpu.state import ClusterState


def _pct(used: int, total: int) -> float:
    return round(100.0 * used / total, 1) if total else 0.0


def _holders(state: ClusterState) -> dict[str, list[dict[str, Any]]]:
    """Every slice by GPU uuid, with the container that holds it (the state's holders know only pods)."""
    by_uuid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod_key, a in state.assignments.items():
        for c in a.containers:
            for d in c.devices:
                by_uuid[d.uuid].append(
                    {
                        "pod": pod_key,
                        "container": c.name,
                        "role": a.role.value,
                        "model": a.model,
                        "memoryMiB": d.memory_mib,
                        "cores": d.cores,
                    }
                )
    return by_uuid


def build_report(
    state: ClusterState,
    *,
    placed: list[Placed] | None = None,
    rejected: list[Rejected] | None = None,
) -> dict[str, Any]:
    """Nodes/GPUs/holders of the state, totals, and (for a replay) each pod's outcome."""
    holders = _holders(state)
    nodes: list[dict[str, Any]] = []
    for node in state.nodes.values():
        gpus = []
        for u in node.gpus:
            d = u.device
            gpus.append(
                {
                    "index": d.index,
                    "uuid": d.uuid,
                    "model": d.model,
                    "numa": d.numa,
                    "healthy": d.healthy,
                    "cordoned": d.uuid in node.inventory.cordoned,
                    "memoryMiB": d.memory_mib,
                    "memoryUsedMiB": u.memory_used,
                    "cores": d.cores,
                    "coresUsed": u.cores_used,
                    "sharers": u.sharers,
                    "split": d.split_count,
                    "holders": holders.get(d.uuid, []),
                }
            )
        nodes.append(
            {
                "name": node.name,
                "labels": dict(node.inventory.labels),
                "gpus": gpus,
                "cordonedGpus": sorted(node.inventory.cordoned),
            }
        )
    t = state.totals()
    in_use = sum(1 for n in state.nodes.values() for u in n.gpus if u.sharers)
    report: dict[str, Any] = {
        "policy": {"node": state.config.node_policy, "gpu": state.config.gpu_policy},
        "nodes": nodes,
        "totals": {
            "nodes": t["nodes"],
            "gpus": t["gpus"],
            "gpusInUse": in_use,
            "slices": t["slices"],
            "memoryMiB": t["memory_mib"],
            "memoryUsedMiB": t["memory_used_mib"],
            "memoryAllocatedPct": _pct(t["memory_used_mib"], t["memory_mib"]),
            "cores": t["cores"],
            "coresUsed": t["cores_used"],
            "smAllocatedPct": _pct(t["cores_used"], t["cores"]),
            "podsPlaced": t["pods"] if placed is None else len(placed),
            "podsFailed": len(rejected or []),
        },
    }
    if placed is not None:
        report["placed"] = [
            {
                "pod": p.pod.key,
                "node": p.assignment.node,
                "role": p.pod.role.value,
                "roleSource": p.pod.role_source,
                "model": p.pod.model,
                "score": round(p.score, 4),
                "feasibleNodes": p.feasible_nodes,
            }
            for p in placed
        ]
    report["failed"] = [
        {
            "pod": r.pod_key,
            "role": r.pod.role.value if r.pod else None,
            "reason": r.reason,
            "nodes": dict(r.node_reasons),
        }
        for r in rejected or []
    ]
    return report


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
