"""`vgpu show`: validate a cluster file and print its nodes, GPUs and allocations."""

from __future__ import annotations

import argparse

from vgpu.clusterfile import ClusterFileError
from vgpu.simulate import build_state
from vgpu_cli import files, report, table
from vgpu_cli.common import EXIT_OK, CliError, Subparsers


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "show",
        help="validate a cluster file and print who holds which GPU slice",
        description=(
            "Checks a cluster file (every field, and that its allocations fit the GPUs they name) and prints "
            "per node and per GPU who holds what, and the totals. A malformed file exits with code 2 and a "
            "message naming the bad field."
        ),
    )
    p.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (docs/cluster-file.md)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    nodes, allocations = files.load_cluster(args.cluster)
    try:
        state = build_state(nodes, allocations)
    except ClusterFileError as exc:
        raise CliError(f"{args.cluster}: {exc}") from None
    data = report.build_report(state)
    if args.json:
        print(report.to_json(data))
    else:
        print(table.render(data, f"{args.cluster}: {len(nodes)} nodes, {len(allocations)} allocations"), end="")
    return EXIT_OK
