"""`vgpu demo`: replay the bundled llm-d P/D workload onto the embedded cluster, no cluster or network needed."""

from __future__ import annotations

import argparse
import logging

from vgpu.clusterfile import ClusterFileError
from vgpu.config import PlacementConfig
from vgpu.errors import UnknownPolicyError
from vgpu.placement import registry
from vgpu.planner import Planner
from vgpu.simulate import build_state, replay
from vgpu_cli import files, report, table
from vgpu_cli.common import EXIT_OK, CliError, Subparsers

log = logging.getLogger("vgpu.demo")


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="replay a P/D workload onto a cluster file and print who holds which GPU slice",
        description=(
            "Replays Pod objects, in order, through the extender's own placement code (evaluate, best node, "
            "apply) onto a cluster file, then prints per node and per GPU who holds what, the totals, and "
            "every pod that could not be placed with each node's reason. Without --cluster/--workload it "
            "uses the bundled 4-node cluster and a small llm-d prefill/decode mix."
        ),
    )
    p.add_argument("--cluster", metavar="FILE", help="cluster file (docs/cluster-file.md); default: bundled demo")
    p.add_argument("--workload", metavar="FILE", help="YAML/JSON Pod objects (multi-document or a List)")
    p.add_argument(
        "--policy",
        default=PlacementConfig().node_policy,
        choices=registry.names(),
        help="node placement policy (default: %(default)s, the extender's own default)",
    )
    p.add_argument(
        "--gpu-policy",
        choices=registry.GPU_POLICIES,
        help="order of GPUs inside the chosen node (default: the node policy's own)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    nodes, allocations = files.load_cluster(args.cluster)
    pods = files.load_workload(args.workload)
    config = PlacementConfig(node_policy=args.policy, gpu_policy=args.gpu_policy)
    try:
        state = build_state(nodes, allocations, config)
        planner = Planner(state)
    except (ClusterFileError, UnknownPolicyError) as exc:
        raise CliError(str(exc)) from None
    result = replay(planner, pods, track_host_resources=True)
    for placed in result.placed:
        log.info(
            "placed %s on %s",
            placed.pod.key,
            placed.assignment.node,
            extra={"pod": placed.pod.key, "node": placed.assignment.node, "score": round(placed.score, 4)},
        )
    for rejected in result.rejected:
        log.info("cannot place %s: %s", rejected.pod_key, rejected.reason, extra={"pod": rejected.pod_key})
    data = report.build_report(state, placed=result.placed, rejected=result.rejected)
    if args.json:
        print(report.to_json(data))
    else:
        print(table.render(data, f"vgpu demo: {len(pods)} pods onto {len(nodes)} nodes"), end="")
    return EXIT_OK
