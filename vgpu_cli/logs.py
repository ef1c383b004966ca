"""Logging setup for the CLI: human text or one JSON object per line, always on stderr.

Stdout carries only the command's result (a table or JSON) so it can be piped; logs never mix in.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
_STANDARD = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...extra}`: what log shippers parse without a regex."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, sort_keys=False)


def configure(level: str, fmt: str) -> None:
    """Replace the root logger's handlers (idempotent, so repeated in-process runs do not stack)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
