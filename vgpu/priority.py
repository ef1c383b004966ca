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


# --- Runtime priority handed to the container at Allocate ------------------------------------------------------
#
# Both runtimes that can favour one client over another on a shared GPU take 0 for "high" and 1 for "low":
# - HAMi-core's CUDA_TASK_PRIORITY (HAMi pkg/util/types.go `TaskPriority = "CUDA_TASK_PRIORITY"`, set by HAMi's
#   webhook from `nvidia.com/priority` in pkg/device/nvidia/device.go MutateAdmission; HAMi-core
#   src/multiprocess/multiprocess_memory_limit.c stores it in the container's shared region, 1 when unset);
# - MPS's CUDA_MPS_CLIENT_PRIORITY (NVIDIA Multi-Process Service guide, "Environment Variables",
#   CUDA_MPS_CLIENT_PRIORITY: 0 normal, the default, 1 below normal).
RUNTIME_HIGH = 0
RUNTIME_LOW = 1
# PriorityClass values at or above this are "online" by default (kube-vgpu's examples: online 100000, batch 100;
# Kubernetes' own system classes are 2000000000 and above).
DEFAULT_ONLINE_PRIORITY_MIN = 1000


def hami_priority_given(pod: Mapping[str, Any], container: str, resource: str) -> int | None:
    """The container's own HAMi priority (`resource` in its limits, else requests) when it is 0 or 1; None when
    absent or not one of those (the webhook refuses other values before a pod gets this far)."""
    spec = pod.get("spec") or {}
    for section in ("containers", "initContainers"):
        for c in spec.get(section) or []:
            if not isinstance(c, Mapping) or c.get("name") != container:
                continue
            resources = c.get("resources") or {}
            for part in ("limits", "requests"):
                raw = (resources.get(part) or {}).get(resource)
                if raw is None:
                    continue
                text = str(raw).strip()
                return int(text) if text in ("0", "1") else None
            return None
    return None


def runtime_priority(pod: Mapping[str, Any], container: str, *, resource: str, online_min: int) -> int:
    """RUNTIME_HIGH or RUNTIME_LOW for one container: high when the pod's PriorityClass value is at least
    `online_min`. The container's own HAMi priority may lower that, never raise it: the pod author writes it, and
    on GPUs shared between tenants a batch pod must not claim an online pod's runtime priority (HAMi lets it)."""
    by_class = RUNTIME_HIGH if spec_priority(pod) >= online_min else RUNTIME_LOW
    given = hami_priority_given(pod, container, resource)
    return by_class if given is None else max(by_class, given)
