"""`vgpu discovery merge`: the per-host llm-d file-discovery files into the one file the router reads.

Each node daemon (Kubernetes or standalone) writes its own host's endpoints; the router's file-discovery
plugin reads one file. An admin runs this where the router runs, over a shared folder (NFS, a Slurm shared
file system, files copied in by the hosts), once or with `--every` as a small long-running service. The
output is replaced atomically (temp file, fsync, rename), and only when it changed, so a router with
`watchFile: true` reloads whole sets. A missing or malformed input leaves the output as it was: the router
keeps routing to the last good set rather than losing a host's endpoints to a half-copied file.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from device_plugin.telemetry.discovery_file import render, write_atomic
from vgpu.endpoints import EndpointFileError, merge_endpoints
from vgpu_cli.common import EXIT_OK, CliError, Subparsers

SUFFIXES = (".yaml", ".yml", ".json")


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "discovery",
        help="llm-d file-discovery files: merge the per-host files into the router's one",
        description="Tools for llm-d's file-discovery endpoints files (docs/telemetry.md, 'File discovery').",
    )
    sub = p.add_subparsers(title="subcommands", metavar="SUBCOMMAND", required=True)
    m = sub.add_parser(
        "merge",
        help="merge per-host endpoints files into one, atomically",
        description=(
            "Reads every INPUT (a file, or a folder: its *.yaml, *.yml, *.json, re-listed each round), checks "
            "each endpoint as the router would (IP address, port 1-65535, string labels, namespace/name unique "
            "across hosts) and writes them sorted into OUT by atomic rename, only when the content changed. "
            "Exit code 2 and a message naming the file, endpoint and field when an input is wrong."
        ),
    )
    m.add_argument("inputs", nargs="+", metavar="INPUT", help="per-host endpoints file, or a folder of them")
    m.add_argument("--out", required=True, metavar="FILE", help="the merged file the router's file-discovery reads")
    m.add_argument(
        "--every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep running and re-merge every SECONDS (0: merge once and exit; default %(default)s)",
    )
    m.set_defaults(func=run_merge)


def _files(inputs: Sequence[str], out: Path) -> list[Path]:
    found: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            found += sorted(
                p
                for p in path.iterdir()
                if p.suffix in SUFFIXES and p.is_file() and not p.name.startswith(".") and p.resolve() != out.resolve()
            )
        elif path.is_file():
            found.append(path)
        else:
            raise CliError(f"{raw}: no such file or folder (an input of 'vgpu discovery merge')")
    return found


def merge_once(inputs: Sequence[str], out: Path) -> tuple[int, bool]:
    """(endpoints written, whether OUT changed); CliError when an input is missing or wrong."""
    docs: list[tuple[str, Any]] = []
    for path in _files(inputs, out):
        try:
            docs.append((str(path), yaml.safe_load(path.read_bytes())))
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise CliError(f"{path}: not YAML/JSON: {exc}".splitlines()[0]) from None
    try:
        merged = merge_endpoints(docs)
        data = render(merged)
    except (EndpointFileError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return len(merged), write_atomic(out, data)


def run_merge(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.every < 0:
        raise CliError(f"--every must be 0 (once) or a positive number of seconds, got {args.every}")
    if not args.every:
        n, changed = merge_once(args.inputs, out)
        print(f"{out}: {n} endpoints{'' if changed else ' (unchanged)'}")
        return EXIT_OK
    while True:
        try:
            n, changed = merge_once(args.inputs, out)
            if changed:
                print(f"{out}: {n} endpoints", flush=True)
        except CliError as exc:
            print(f"vgpu: error: {exc}; {out} left as it was", file=sys.stderr, flush=True)
        time.sleep(args.every)
