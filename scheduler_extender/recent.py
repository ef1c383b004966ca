"""The pods the verbs saw lately: each UID's last parse, and for the file source each pod's last /filter body.

kube-scheduler sends /prioritize the very pod /filter got, so a pod equal to the last one parsed for its UID reuses
that parse (a changed pod, or another UID, is parsed anew); an invalid pod is never kept, it raises every time.
The file source has no apiserver to read a pod from, so there /bind takes the body /filter last saw under the
pod's namespace/name (never with the kube source: docs/extender.md).

Used on the event loop's thread only (/filter and /prioritize); /bind reads `body` from a worker thread, a
single dict lookup.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from vgpu.pod import PodInfo, pod_key, pod_uid

RECENT_PODS = 4096


class RecentPods:
    def __init__(
        self, parse: Callable[[dict[str, Any]], PodInfo], *, keep_bodies: bool = False, size: int = RECENT_PODS
    ) -> None:
        self._parse = parse
        self.keep_bodies = keep_bodies
        self.size = size
        self._parsed: OrderedDict[str, tuple[dict[str, Any], PodInfo]] = OrderedDict()  # UID -> pod, its parse
        self._bodies: OrderedDict[str, dict[str, Any]] = OrderedDict()  # namespace/name -> pod

    def parse(self, pod: dict[str, Any]) -> PodInfo:
        """The pod's parse, reused while the same UID comes with an equal pod. Raises what `parse` raises."""
        uid = pod_uid(pod)
        hit = self._parsed.get(uid) if uid else None
        if hit is not None and hit[0] == pod:
            return hit[1]
        info = self._parse(pod)
        if uid:
            self._parsed.pop(uid, None)  # re-insert: the oldest entry is the first one
            self._parsed[uid] = (pod, info)
            if len(self._parsed) > self.size:
                self._parsed.popitem(last=False)
        return info

    def keep(self, pod: dict[str, Any]) -> None:
        """Keep a /filter body for /bind (with `keep_bodies` only; a pod without a UID is never kept)."""
        if not self.keep_bodies or not pod_uid(pod):
            return
        key = pod_key(pod)
        self._bodies[key] = pod
        self._bodies.move_to_end(key)
        if len(self._bodies) > self.size:
            self._bodies.popitem(last=False)

    def body(self, key: str) -> dict[str, Any] | None:
        """The last /filter body kept under namespace/name."""
        return self._bodies.get(key)
