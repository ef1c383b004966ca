"""A pod's priority for preemption: its PriorityClass value decides, HAMi's `nvidia.com/priority` breaks ties.

kube-scheduler preempts only pods whose `spec.priority` is strictly lower than the preemptor's (its DefaultPreemption
removes exactly those in the dry run: pkg/scheduler/framework/preemption/preemption.go, Kubernetes v1.34), so the
PriorityClass value alone decides *who may be* a victim. HAMi's per-container `nvidia.com/priority` (0 high, 1 low:
HAMi's task priority, CUDA_TASK_PRIORITY "0 high, 1 low" in HAMi's priority lab, dynamia-ai/workshop
lab6-priority.md) never makes a pod preemptible on its own; among pods of the same PriorityClass value a HAMi-low
pod is evicted before a HAMi-high one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.requests import PodRequest

# HAMi's values (vgpu.config.RequestDefaults.priority): 0 latency-critical, 1 low.
HAMI_HIGH = 0
HAMI_LOW = 1


@dataclass(frozen=True, slots=True, order=True)
class Priority:
    """Ordered: a larger Priority is more important. `value` is spec.priority (0 when the pod has none, as
    Kubernetes assumes without a global default PriorityClass); `hami_high` is True when any GPU container asks
    HAMi priority 0."""

    value: int
    hami_high: bool = False

    def may_preempt(self, other: Priority) -> bool:
        """Kubernetes' rule: only a strictly lower PriorityClass value is preemptible (HAMi's key never is)."""
        return other.value < self.value

    def __str__(self) -> str:
        return f"{self.value}/{'hami-high' if self.hami_high else 'hami-low'}"


def spec_priority(pod: Mapping[str, Any]) -> int:
    """spec.priority as the admission controller resolved it from priorityClassName; 0 when absent or not an int."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_priority(pod: Mapping[str, Any], request: PodRequest) -> Priority:
    """Combine spec.priority with the HAMi priority of the pod's GPU containers (the highest of them counts)."""
    hami_high = any(c.priority == HAMI_HIGH for c in request.containers)
    return Priority(spec_priority(pod), hami_high)
