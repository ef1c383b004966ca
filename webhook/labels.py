"""The pod labels the webhook stamps: static slice facts that kube-vgpu's scheduler and llm-d's EPP read.

EPP copies every pod label onto its endpoints (docs/architecture.md, "Pod roles"), so these are visible to its filters and
scorers without a plugin. Values are always valid label values (≤ 63 chars, alphanumeric at both ends).
The per-vGPU facts describe the pod's first GPU-asking app container — the serving engine in vLLM and
SGLang pods; `vgpu.io/vgpus` is the pod's total. The keys are the core's (`vgpu.annotations.WEBHOOK_LABELS`).
"""

from __future__ import annotations

import re

from vgpu import annotations as ann
from vgpu.requests import PodRequest
from vgpu.roles import RoleDecision

_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_valid_value(value: str) -> bool:
    """Kubernetes label value syntax (apimachinery IsValidLabelValue)."""
    return len(value) <= 63 and _VALUE.match(value) is not None


def slice_labels(request: PodRequest, decision: RoleDecision) -> dict[str, str]:
    """The labels for a pod that asks for vGPUs (request must not be empty)."""
    first = request.containers[0]
    labels = {
        ann.LABEL_MANAGED: "true",
        ann.LABEL_ROLE: decision.role.value,
        ann.LABEL_ROLE_SOURCE: decision.source,
        ann.LABEL_VGPUS: str(request.total_vgpus),
        ann.LABEL_PRIORITY: str(first.priority),
    }
    if first.memory_mib is not None:
        labels[ann.LABEL_GPUMEM] = str(first.memory_mib)
    else:
        labels[ann.LABEL_GPUMEM_PERCENTAGE] = str(first.memory_percentage)
    if first.cores is not None:
        labels[ann.LABEL_GPUCORES] = str(first.cores)
    elif first.memory_percentage is not None:
        labels[ann.LABEL_GPUCORES] = str(min(100, first.memory_percentage))  # proportional to a known share
    else:
        labels[ann.LABEL_GPUCORES] = "proportional"
    return {k: v for k, v in labels.items() if is_valid_value(v)}


def stale(labels: dict[str, str]) -> list[str]:
    """Our label keys a pod may carry (copied specs) that `labels` does not set: removed on admission."""
    return [key for key in ann.WEBHOOK_LABELS if key not in labels]
