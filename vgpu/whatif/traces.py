"""Trace formats the what-if reads and writes. Pure: functions of text lines, errors as ValueError
naming the line and what is allowed.

- JSON lines (ours): one object per request, `arrival` (seconds), `prompt` and `output` (tokens), and
  optionally `prefixes` ([[key, tokens], ...], shortest first, each at most the prompt) and `key` (what
  a later request names to reuse this prompt). `dump_jsonl` writes a generated workload in it.
- Azure LLM inference trace (AzurePublicDataset, 2023 code/conversation and 2024 week-long files):
  CSV with the header `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps `YYYY-MM-DD HH:MM:SS.fffffff`
  (AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv). It has no prefix information: no request
  shares a cached prefix, so the cache layer reads 0 for every router.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from vgpu.whatif.workload import Request

JSONL_FIELDS = "arrival (s), prompt (tokens), output (tokens), optional prefixes [[key, tokens], ...] and key"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"

_Raw = tuple[float, int, int, tuple[tuple[str, int], ...], str]


def _finish(raw: list[_Raw], what: str, *, rebase: bool) -> list[Request]:
    """Sorted by arrival, ids in that order; with `rebase` the first arrival becomes 0 (wall-clock traces)."""
    if not raw:
        raise ValueError(f"{what}: no requests")
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0] if rebase else 0.0
    return [Request(i, a - t0, p, o, pre, k) for i, (a, p, o, pre, k) in enumerate(raw)]


def parse_jsonl(lines: Iterable[str]) -> list[Request]:
    raw: list[_Raw] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            arrival, prompt, output = float(obj["arrival"]), int(obj["prompt"]), int(obj["output"])
            prefixes = tuple(sorted(((str(k), int(t)) for k, t in obj.get("prefixes", [])), key=lambda x: x[1]))
            key = str(obj.get("key", f"line{n}"))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"line {n}: expected a JSON object with {JSONL_FIELDS}") from None
        if arrival < 0 or prompt < 1 or output < 1 or any(not 0 < t <= prompt for _, t in prefixes):
            raise ValueError(f"line {n}: arrival must be >= 0, prompt and output >= 1, each prefix 1..prompt tokens")
        raw.append((arrival, prompt, output, prefixes, key))
    return _finish(raw, "JSON-lines trace", rebase=False)


def _azure_time(text: str) -> float:
    whole, _, frac = text.strip().partition(".")
    t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    return t + (float("0." + frac) if frac else 0.0)


def parse_azure(lines: Iterable[str]) -> list[Request]:
    it = iter(lines)
    head = next(it, "").strip()
    if head != AZURE_HEADER:
        raise ValueError(f"line 1: expected the Azure header {AZURE_HEADER!r}, got {head[:60]!r}")
    raw: list[_Raw] = []
    for n, line in enumerate(it, 2):
        if not line.strip():
            continue
        try:
            ts, ctx, gen = line.split(",")
            arrival, prompt, output = _azure_time(ts), int(ctx), int(gen)
        except ValueError:
            raise ValueError(f"line {n}: expected 'YYYY-MM-DD HH:MM:SS.fff,ContextTokens,GeneratedTokens'") from None
        if prompt < 1 or output < 1:
            raise ValueError(f"line {n}: ContextTokens and GeneratedTokens must be >= 1")
        raw.append((arrival, prompt, output, (), f"line{n}"))
    return _finish(raw, "Azure trace", rebase=True)


def parse(text: str) -> list[Request]:
    """Either format, told apart by the first line."""
    lines = text.splitlines()
    if lines and lines[0].strip() == AZURE_HEADER:
        return parse_azure(lines)
    return parse_jsonl(lines)


def dump_jsonl(requests: Iterable[Request]) -> str:
    return "".join(
        json.dumps(
            {"arrival": round(r.arrival, 6), "prompt": r.prompt, "output": r.output,
             "prefixes": [list(p) for p in r.prefixes], "key": r.key}
        ) + "\n"
        for r in requests
    )  # fmt: skip
