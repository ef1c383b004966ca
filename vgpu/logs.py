"""Structured logging shared by the services: text for people, JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra={...}` fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: msg key=value ...` with the extra fields appended."""

    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_"))
        text = f"{base} {extras}" if extras else base
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(level: str = "info", fmt: str = "text") -> None:
    """Replace the root logger's handlers with one on stderr (idempotent: repeated calls do not stack).

    Stderr only, so a command's stdout carries just its result and can be piped."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: allowed text, json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
