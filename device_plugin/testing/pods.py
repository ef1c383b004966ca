"""In-memory PodSource (the apiserver side) for tests and demos."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping

from device_plugin.pods import PodRecord
from vgpu import annotations as ann


class MemoryPods:
    """Thread-safe pod/node annotation store implementing PodSource; `fail` makes every call raise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pods: dict[str, PodRecord] = {}
        self.node_annotations: dict[str, dict[str, str]] = {}
        self.fail: Exception | None = None
        self.lists = 0

    def add(self, pod: PodRecord) -> None:
        with self._lock:
            self.pods[pod.key] = pod

    def get(self, key: str) -> PodRecord:
        with self._lock:
            return self.pods[key]

    def list_node_pods(self, *, node: str) -> list[PodRecord]:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            self.lists += 1
            return [p for p in self.pods.values() if p.node == node]

    def patch_pod_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            key = f"{namespace}/{name}"
            pod = self.pods[key]
            phase = annotations.get(ann.POD_BIND_PHASE)
            if phase is not None:
                self.pods[key] = dataclasses.replace(pod, bind_phase=ann.BindPhase(phase))

    def patch_node_annotations(self, *, node: str, annotations: Mapping[str, str | None]) -> None:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            current = self.node_annotations.setdefault(node, {})
            for k, v in annotations.items():
                if v is None:
                    current.pop(k, None)
                else:
                    current[k] = v
