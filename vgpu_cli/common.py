"""What every subcommand shares: the subparsers type, exit codes and the error that carries one."""

from __future__ import annotations

import argparse
from typing import TypeAlias

# What `ArgumentParser.add_subparsers()` returns; a string because argparse's class is generic only for type checkers.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran but what it checked is wrong
EXIT_USAGE = 2  # bad arguments or a malformed input file (argparse's own code for usage errors)


class CliError(Exception):
    """A user-facing failure: printed as one line on stderr, then the process exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code
