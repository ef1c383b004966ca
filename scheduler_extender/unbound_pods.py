"""The unbound pods that ask for our resources, as the pod watch last delivered them: what /bind binds.

/bind must bind the pod the apiserver holds, never a body a caller sent (docs/extender.md, "Security"). Reading it
with a GET cost a round trip per bind; the watch already delivered it. /bind takes the pod from here when its UID is
the one the bind names, and sends its Binding conditional on its resourceVersion (scheduler_extender.bind), so a
version the watch has not caught up with yet is refused by the apiserver (409) and read again, never applied.
A pod not here (the watch is behind kube-scheduler's, or the book is full) is read with a GET as before.

Only unbound, active pods naming one of our resources are kept (bound pods are never bound again), as the very
dicts the watch decoded, at most `max_pods` of them. Not thread-safe: callers hold the state lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vgpu.config import ResourceNames
from vgpu.pod import bound_node, is_finished, pod_key

MAX_PODS = 20_000


class UnboundPods:
    def __init__(self, names: ResourceNames, *, max_pods: int = MAX_PODS) -> None:
        self._ours = frozenset((names.count, names.memory, names.memory_percentage, names.cores))
        self.max_pods = max_pods
        self._pods: dict[str, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._pods.get(key)

    def event(self, kind: str, pod: dict[str, Any]) -> None:
        """A watch event: keep the pod while it is unbound, active and asks for our resources; otherwise drop it."""
        key = pod_key(pod)
        if kind == "DELETED" or not self._wanted(pod):
            self._pods.pop(key, None)
        elif key in self._pods or len(self._pods) < self.max_pods:
            self._pods[key] = pod

    def replace(self, pods: Iterable[dict[str, Any]]) -> None:
        """A (re)list: exactly the listed pods that qualify."""
        self._pods.clear()
        for pod in pods:
            if len(self._pods) >= self.max_pods:
                break
            if self._wanted(pod):
                self._pods[pod_key(pod)] = pod

    def _wanted(self, pod: Mapping[str, Any]) -> bool:
        if bound_node(pod) or is_finished(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        spec = pod.get("spec") or {}
        for c in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
            res = (c.get("resources") or {}) if isinstance(c, dict) else {}
            for part in (res.get("limits"), res.get("requests")):
                if isinstance(part, dict) and not self._ours.isdisjoint(part):
                    return True
        return False
