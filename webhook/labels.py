"""The pod labels the webhook stamps: static slice facts that kube-vgpu's scheduler and llm-d's EPP read.

EPP copies every pod label onto its endpoints (docs/architecture.md, "Pod roles"), so these are visible to its filters and
scorers without a plugin. Values are always valid label values (≤ 63 chars, alphanumeric at both ends).
The per-vGPU facts describe the pod's first GPU-asking app container — the serving engine in vLLM and
SGLang pods; `vgpu.io/vgpus` is the pod's total.
"""

from __future__ import annotations

import re

from vgpu.requests import PodRequest
from vgpu.roles import RoleDecision

PREFIX = "vgpu.io/"
MANAGED = PREFIX + "managed"  # "true": the webhook admitted this pod as a vGPU pod
ROLE = PREFIX + "role"  # prefill | decode | prefill-decode | encode | encode-prefill | encode-prefill-decode
ROLE_SOURCE = PREFIX + "role-source"  # label | sglang-arg | routing-sidecar | kv-transfer-config | default
VGPUS = PREFIX + "vgpus"  # total vGPUs of the pod
GPUMEM = PREFIX + "gpumem"  # MiB per vGPU (when asked in MiB)
GPUMEM_PERCENTAGE = PREFIX + "gpumem-percentage"  # percent of the card per vGPU (asked or defaulted)
GPUCORES = PREFIX + "gpucores"  # percent of SMs per vGPU, or "proportional" (= memory share, per card)
PRIORITY = PREFIX + "priority"  # 0 high, 1 low
OPT_OUT = PREFIX + "webhook"  # "disabled" on a pod or namespace: the webhook is not called at all
OPT_OUT_VALUE = "disabled"

ALL = (MANAGED, ROLE, ROLE_SOURCE, VGPUS, GPUMEM, GPUMEM_PERCENTAGE, GPUCORES, PRIORITY)

_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_valid_value(value: str) -> bool:
    """Kubernetes label value syntax (apimachinery IsValidLabelValue)."""
    return len(value) <= 63 and _VALUE.match(value) is not None


def slice_labels(request: PodRequest, decision: RoleDecision) -> dict[str, str]:
    """The labels for a pod that asks for vGPUs (request must not be empty)."""
    first = request.containers[0]
    labels = {
        MANAGED: "true",
        ROLE: decision.role.value,
        ROLE_SOURCE: decision.source,
        VGPUS: str(request.total_vgpus),
        PRIORITY: str(first.priority),
    }
    if first.memory_mib is not None:
        labels[GPUMEM] = str(first.memory_mib)
    else:
        labels[GPUMEM_PERCENTAGE] = str(first.memory_percentage)
    if first.cores is not None:
        labels[GPUCORES] = str(first.cores)
    elif first.memory_percentage is not None:
        labels[GPUCORES] = str(min(100, first.memory_percentage))  # proportional to a known share
    else:
        labels[GPUCORES] = "proportional"
    return {k: v for k, v in labels.items() if is_valid_value(v)}


def stale(labels: dict[str, str]) -> list[str]:
    """Our label keys a pod may carry (copied specs) that `labels` does not set: removed on admission."""
    return [key for key in ALL if key not in labels]
