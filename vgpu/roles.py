"""Pod roles in llm-d prefill/decode disaggregation, detected by llm-d's conventions (docs/architecture.md, "Pod roles")."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ROLE_LABEL = "llm-d.ai/role"
MODEL_LABELS = ("llm-d.ai/model", "llm-d.ai/inferenceServing", "llm-d.ai/inference-serving", "llm-d.ai/guide")
SIDECAR_NAMES = frozenset({"routing-sidecar", "routing-proxy"})


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    PREFILL_DECODE = "prefill-decode"
    ENCODE = "encode"
    ENCODE_PREFILL = "encode-prefill"
    ENCODE_PREFILL_DECODE = "encode-prefill-decode"

    @property
    def does_prefill(self) -> bool:
        """Compute-bound roles whose SMs must never be oversubscribed."""
        return self in _PREFILL_ROLES

    @property
    def does_decode(self) -> bool:
        return self is Role.DECODE


_PREFILL_ROLES = frozenset({Role.PREFILL, Role.ENCODE_PREFILL})


_LABEL_VALUES: dict[str, Role] = {r.value: r for r in Role} | {"both": Role.PREFILL_DECODE}


@dataclass(frozen=True, slots=True)
class RoleDecision:
    role: Role
    source: str  # which signal decided: "label", "sglang-arg", "routing-sidecar", "kv-transfer-config", "default"


def _args(container: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("command", "args"):
        value = container.get(key) or []
        if isinstance(value, list):
            out.extend(str(v) for v in value)
    return out


# The flags are looked for in at most this much of a container's command and args (joined): real vLLM and SGLang
# command lines are a few KB; beyond the cap a flag is not seen (the role falls back to the default).
MAX_SCAN_CHARS = 256 * 1024


def _flag_value(args: list[str], flag: str) -> str | None:
    """Value of `--flag=v` or `--flag v`, also inside shell strings such as `sh -c "vllm serve ..."`."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1 :]
    return flag_in_text(" ".join(args)[:MAX_SCAN_CHARS], flag)


def flag_in_text(text: str, flag: str) -> str | None:
    """The first `flag=WORD` or `flag WORD` in shell text, WORD '...', "..." (\\ escapes undone) or unquoted.

    A forward scan, not a regex: each occurrence of `flag` is looked at once and each character at most a bounded
    number of times, so a pod author's text costs linear time whatever it holds (tests/unit/test_roles.py checks it
    against the regex it replaces: flag (?:=|\\s+) ('([^']*)'|"((?:[^"\\\\]|\\\\.)*)"|(\\S+)))."""
    n, start = len(text), 0
    while (i := text.find(flag, start)) >= 0:
        start = i + 1
        j = i + len(flag)
        if j < n and text[j] == "=":
            j += 1
        else:
            k = j
            while k < n and text[k].isspace():
                k += 1
            if k == j:
                continue  # neither = nor whitespace: a longer flag
            j = k
        if j >= n or text[j].isspace():
            continue
        if text[j] == "'" and (close := text.find("'", j + 1)) >= 0:
            return text[j + 1 : close]
        if text[j] == '"' and (quoted := _double_quoted(text, j + 1)) is not None:
            return quoted
        k = j
        while k < n and not text[k].isspace():
            k += 1
        return text[j:k]
    return None


def _double_quoted(text: str, p: int) -> str | None:
    """The shell word from `p` (after an opening ") to the closing ", with \\x read as x; None if unclosed or a
    backslash ends a line (the regex's `\\.` does not match a newline)."""
    out: list[str] = []
    n = len(text)
    while p < n:
        c = text[p]
        if c == '"':
            return "".join(out)
        if c == "\\":
            if p + 1 >= n or text[p + 1] == "\n":
                return None
            out.append(text[p + 1])
            p += 2
            continue
        out.append(c)
        p += 1
    return None


def _kv_role(raw: str) -> str | None:
    try:
        cfg = json.loads(raw)
    except ValueError:
        return kv_role_in_text(raw[:MAX_SCAN_CHARS])
    if isinstance(cfg, Mapping):
        value = cfg.get("kv_role")
        return str(value) if value is not None else None
    return None


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def kv_role_in_text(text: str) -> str | None:
    """`kv_role: kv_x` in a config that is not JSON (quotes optional): the first kv_x, by a forward scan (as the
    regex it replaces: ["']?kv_role["']?\\s*:\\s*["']?(kv_\\w+))."""
    n, start = len(text), 0
    while (i := text.find("kv_role", start)) >= 0:
        start = i + 1
        j = i + len("kv_role")
        if j < n and text[j] in "\"'":
            j += 1
        while j < n and text[j].isspace():
            j += 1
        if j >= n or text[j] != ":":
            continue
        j += 1
        while j < n and text[j].isspace():
            j += 1
        if j < n and text[j] in "\"'":
            j += 1
        if not text.startswith("kv_", j):
            continue
        k = j + 3
        while k < n and _is_word(text[k]):
            k += 1
        if k > j + 3:
            return text[j:k]
    return None


def _containers(pod: Mapping[str, Any], key: str) -> Iterable[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    for c in spec.get(key) or []:
        if isinstance(c, Mapping):
            yield c


def detect_role(pod: Mapping[str, Any]) -> RoleDecision:
    """Role from the llm-d label, then SGLang's flag, the routing sidecar, vLLM's kv_role."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    label = labels.get(ROLE_LABEL)
    if isinstance(label, str) and label in _LABEL_VALUES:
        return RoleDecision(_LABEL_VALUES[label], "label")
    app = list(_containers(pod, "containers"))
    for c in app:
        mode = _flag_value(_args(c), "--disaggregation-mode")
        if mode in ("prefill", "decode"):
            return RoleDecision(Role(mode), "sglang-arg")
    for init in _containers(pod, "initContainers"):
        if init.get("restartPolicy") == "Always" and init.get("name") in SIDECAR_NAMES:
            return RoleDecision(Role.DECODE, "routing-sidecar")
    for c in app:
        raw = _flag_value(_args(c), "--kv-transfer-config")
        if raw is None:
            continue
        kv = _kv_role(raw)
        if kv == "kv_producer":
            return RoleDecision(Role.PREFILL, "kv-transfer-config")
        if kv == "kv_consumer":
            return RoleDecision(Role.DECODE, "kv-transfer-config")
    return RoleDecision(Role.PREFILL_DECODE, "default")


def model_identity(pod: Mapping[str, Any]) -> str | None:
    """The model/pool a pod serves, for P/D locality; namespaced so pools in two namespaces differ."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key in MODEL_LABELS:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return f"{meta.get('namespace') or 'default'}/{value}"
    return None
