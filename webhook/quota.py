"""Per-namespace vGPU memory and core quotas at admission (vgpu.quota): the policy file and the namespace's pods.

The policy is the data key `quotas.yaml` of ConfigMap `vgpu-quotas`, mounted (optional) at `QUOTA_FILE`; it is
re-read when the file changes, so an edit applies within the kubelet's ConfigMap sync. Usage is read from the
apiserver when a vGPU pod is admitted in a namespace the policy names (one pod list of that namespace; other
namespaces cost nothing). Pods admitted at the same instant are not serialised: two may each pass with the room
of one, as with any check outside the apiserver's own quota controller.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import RequestError
from vgpu.quota import (
    QuotaPolicy,
    QuotaPolicyError,
    namespace_usage,
    parse_policy,
    pod_is_counted,
    pod_usage,
    violation,
)
from vgpu.requests import PodRequest, parse_pod_request

log = logging.getLogger(__name__)

QUOTA_FILE = Path("/etc/vgpu-webhook/quotas/quotas.yaml")
SOURCE = "ConfigMap vgpu-quotas"


class QuotaGuard:
    def __init__(
        self,
        path: Path,
        list_pods: Callable[[str], list[Mapping[str, Any]]],
        *,
        names: ResourceNames = ResourceNames(),
        defaults: RequestDefaults = RequestDefaults(),
    ) -> None:
        self.path = path
        self.list_pods = list_pods
        self.names = names
        self.defaults = defaults
        self._stamp: tuple[float, int] | None = None
        self._policy: QuotaPolicy | None = None
        self._error: str | None = None

    def policy(self) -> QuotaPolicy | None:
        """The current policy (None: no file); raises QuotaPolicyError while the file is invalid."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._policy, self._error = None, None, None
            return None
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._policy, self._error = parse_policy(self.path.read_text(), f"{SOURCE} ({self.path})"), None
            except QuotaPolicyError as exc:
                log.error("quota policy invalid; vGPU pods in quota'd namespaces are denied", extra={"error": str(exc)})
                self._policy, self._error = None, str(exc)
        if self._error is not None:
            raise QuotaPolicyError(self._error)
        return self._policy

    def check(self, namespace: str, request: PodRequest, card_mib: int) -> str | None:
        """The denial for this pod, or None. `card_mib`: the largest GPU in the inventory (0 = unknown)."""
        try:
            policy = self.policy()
        except QuotaPolicyError as exc:
            return f"vGPU quota policy invalid, pods asking for vGPUs are denied until it is fixed: {exc}"
        if policy is None:
            return None
        limits = policy.for_namespace(namespace)
        if not limits:
            return None
        if not card_mib and any(c.memory_percentage is not None for c in request.containers):
            return (
                f"namespace {namespace}: a quota applies and {self.names.memory_percentage} cannot be counted in MiB "
                "until a node reports its GPU inventory; ask for absolute memory instead"
            )
        used = namespace_usage(self._requests(self.list_pods(namespace)), card_mib)
        return violation(namespace, limits, used, pod_usage(request, card_mib), SOURCE)

    def _requests(self, pods: list[Mapping[str, Any]]) -> Iterator[PodRequest]:
        for pod in pods:
            if not pod_is_counted(pod):
                continue
            try:
                r = parse_pod_request(pod, self.names, self.defaults)
            except RequestError:
                continue  # never admitted by us; the extender will not place it either
            if not r.is_empty:
                yield r
