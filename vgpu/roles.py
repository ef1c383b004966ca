"""Pod roles in llm-d prefill/decode disaggregation, detected by llm-d's conventions (docs/architecture.md, "Pod roles")."""

from __future__ import annotations

import enum
import json
import re
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


def _flag_value(args: list[str], flag: str) -> str | None:
    """Value of `--flag=v` or `--flag v`, also inside shell strings such as `sh -c "vllm serve ..."`."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1 :]
    joined = " ".join(args)
    m = re.search(re.escape(flag) + r"(?:=|\s+)('([^']*)'|\"((?:[^\"\\]|\\.)*)\"|(\S+))", joined)
    if m is None:
        return None
    if m.group(3) is not None:  # double-quoted shell word: undo \" and \\ as the shell would
        return re.sub(r"\\(.)", r"\1", m.group(3))
    return m.group(2) if m.group(2) is not None else m.group(4)


def _kv_role(raw: str) -> str | None:
    try:
        cfg = json.loads(raw)
    except ValueError:
        m = re.search(r"""["']?kv_role["']?\s*:\s*["']?(kv_\w+)""", raw)
        return m.group(1) if m else None
    if isinstance(cfg, Mapping):
        value = cfg.get("kv_role")
        return str(value) if value is not None else None
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
