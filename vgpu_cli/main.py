"""Entry point of the `vgpu` command: global flags, the subcommand list, error-to-exit-code mapping."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from vgpu import logs
from vgpu_cli import demo, discovery, pd_bench, replay, show, validate
from vgpu_cli.common import CliError, Subparsers

# Every subcommand: a module exposing add_parser(subparsers) that sets `func` (args -> exit code).
# Add new ones here, in the order `vgpu --help` should list them (e.g. replay.add_parser from vgpu_cli/replay.py).
SUBCOMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    demo.add_parser,
    show.add_parser,
    replay.add_parser,
    pd_bench.add_parser,
    validate.add_parser,
    discovery.add_parser,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu",
        description=(
            "kube-vgpu: role-aware fractional GPUs for LLM inference on Kubernetes. "
            "Shows who holds which slice of which GPU and replays workloads through the scheduler "
            "extender's placement code, with or without a cluster."
        ),
        epilog="Run 'vgpu demo' to see placement on a bundled cluster; 'vgpu COMMAND --help' for a command's flags.",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=logs.LEVELS, help="log verbosity on stderr (default: %(default)s)"
    )
    parser.add_argument(
        "--log-format", default="text", choices=logs.FORMATS, help="log line format (default: %(default)s)"
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for add_parser in SUBCOMMANDS:
        add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"vgpu: error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `vgpu demo | head`
        return 0
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
