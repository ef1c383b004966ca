"""Carries out ladder actions against the apiserver, or only logs and counts them in dry-run.

Every action, in every mode, is logged; outside dry-run every action also posts a Kubernetes Event on the
pod, so an eviction is always preceded by (and explained in) an Event. Eviction goes through the Eviction
API (policy/v1), which the apiserver refuses with 429 while a PodDisruptionBudget forbids it: that is
reported as outcome "blocked" and retried by the ladder at its next step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from device_plugin.watchdog.ladder import Action, Step
from device_plugin.watchdog.slices import Slice
from vgpu import annotations as ann

log = logging.getLogger(__name__)

EVENT_REASONS = {Step.EVENT: "VGPUSliceViolation", Step.ANNOTATE: "VGPUSliceViolation", Step.EVICT: "VGPUSliceEvicted"}


class KubeActions(Protocol):
    """What the enforcer needs from the apiserver (implemented by device_plugin.kube.KubePodSource)."""

    def create_pod_event(
        self, *, namespace: str, pod: str, uid: str, reason: str, message: str, event_type: str = "Warning"
    ) -> None: ...
    def patch_pod_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...
    def evict_pod(self, *, namespace: str, name: str, uid: str) -> bool:
        """True if evicted, False if a PodDisruptionBudget refused it (HTTP 429). Only the pod with this UID."""
        ...


def violation_annotation(s: Slice, action: Action, at: str) -> str:
    """The `vgpu.io/violation` value for this slice and action (codec: vgpu.annotations.encode_violation)."""
    kinds = tuple(k.value for k in action.kinds)
    return ann.encode_violation(
        ann.Violation(container=s.id.container, gpu=s.id.uuid, kinds=kinds, reason=action.reason, time=at)
    )


class Enforcer:
    """Executes actions; returns the outcome label: done | dry-run | blocked | failed | skipped."""

    def __init__(self, kube: KubeActions | None, *, dry_run: bool = False) -> None:
        self.kube = kube
        self.dry_run = dry_run or kube is None
        self._evicted: set[str] = set()

    def new_cycle(self) -> None:
        self._evicted.clear()

    def execute(self, s: Slice, action: Action, *, now_iso: str) -> str:
        sid = s.id
        what = f"{action.step.label} {sid.namespace}/{sid.pod} container {sid.container} on {sid.uuid}: {action.reason}"
        if self.dry_run:
            log.warning("dry-run, would %s", what)
            return "dry-run"
        if action.step is Step.EVICT and s.pod_uid in self._evicted:
            return "skipped"  # another slice of the same pod already evicted it this cycle
        assert self.kube is not None
        log.warning("enforcing: %s", what)
        try:
            message = f"{action.reason} (container {sid.container}, GPU {sid.uuid}); action: {action.step.label}"
            self.kube.create_pod_event(
                namespace=sid.namespace, pod=sid.pod, uid=s.pod_uid, reason=EVENT_REASONS[action.step], message=message
            )
            if action.step is Step.ANNOTATE:
                self.kube.patch_pod_annotations(
                    namespace=sid.namespace,
                    name=sid.pod,
                    annotations={ann.POD_VIOLATION: violation_annotation(s, action, now_iso)},
                )
            if action.step is Step.EVICT:
                self._evicted.add(s.pod_uid)
                if not self.kube.evict_pod(namespace=sid.namespace, name=sid.pod, uid=s.pod_uid):
                    log.warning("eviction of %s/%s refused by a PodDisruptionBudget", sid.namespace, sid.pod)
                    return "blocked"
        except Exception as exc:
            log.error("cannot %s: %s", what, exc)
            return "failed"
        return "done"
