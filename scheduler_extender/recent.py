"""The pods the verbs saw lately: each UID's last parse, and for the file source each pod's last /filter body.

kube-scheduler sends /prioritize the very pod /filter got, so a pod equal to the last one parsed for its UID reuses
that parse (a changed pod, or another UID, is parsed anew); an invalid pod is never kept, it raises every time.
Only a 16-byte digest of the pod is kept to recognise it, never the pod: 6 x 8 MB pods once held 1.2 GiB here.
The file source has no apiserver to read a pod from, so there /bind takes the body /filter last saw under the
pod's namespace/name (never with the kube source: docs/extender.md), kept as compact JSON bytes.

Both books are bounded by entries and by bytes (a parse counts its annotations, which a pod may fill with up to
256 KiB). The verbs run on worker threads, so each book is guarded by its own small lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from vgpu.pod import PodInfo, pod_key, pod_uid

RECENT_PODS = 4096
RECENT_BYTES = 64 * 1024 * 1024
_ENTRY_OVERHEAD = 512  # a PodInfo and its request without annotations, roughly


def _digest(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=16).digest()


def _encode(pod: dict[str, Any]) -> bytes:
    """The pod as canonical JSON (sorted keys). orjson stops at 64-bit integers, which JSON and a hostile body do
    not: those pods take the standard library's slower path."""
    try:
        return orjson.dumps(pod, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(pod, sort_keys=True, separators=(",", ":")).encode()


def _info_bytes(info: PodInfo) -> int:
    return _ENTRY_OVERHEAD + sum(len(k) + len(v) for k, v in info.annotations.items())


class RecentPods:
    def __init__(
        self,
        parse: Callable[[dict[str, Any]], PodInfo],
        *,
        keep_bodies: bool = False,
        size: int = RECENT_PODS,
        max_bytes: int = RECENT_BYTES,
    ) -> None:
        self._parse = parse
        self.keep_bodies = keep_bodies
        self.size = size
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._parsed: OrderedDict[str, tuple[bytes, PodInfo, int]] = OrderedDict()  # UID -> digest, parse, bytes
        self._parsed_bytes = 0
        self._bodies: OrderedDict[str, bytes] = OrderedDict()  # namespace/name -> the pod as JSON
        self._bodies_bytes = 0

    @property
    def held_bytes(self) -> int:
        """What both books count against `max_bytes` each (for tests and the benchmark)."""
        return self._parsed_bytes + self._bodies_bytes

    def parse(self, pod: dict[str, Any]) -> PodInfo:
        """The pod's parse, reused while the same UID comes with an equal pod. Raises what `parse` raises."""
        uid = pod_uid(pod)
        if not uid:
            return self._parse(pod)
        digest = _digest(_encode(pod))
        with self._lock:
            hit = self._parsed.get(uid)
        if hit is not None and hit[0] == digest:
            return hit[1]
        info = self._parse(pod)
        cost = _info_bytes(info)
        if cost > self.max_bytes:
            return info
        with self._lock:
            old = self._parsed.pop(uid, None)  # re-insert: the oldest entry is the first one
            self._parsed_bytes += cost - (old[2] if old else 0)
            self._parsed[uid] = (digest, info, cost)
            while len(self._parsed) > self.size or self._parsed_bytes > self.max_bytes:
                self._parsed_bytes -= self._parsed.popitem(last=False)[1][2]
        return info

    def keep(self, pod: dict[str, Any]) -> None:
        """Keep a /filter body for /bind (with `keep_bodies` only; a pod without a UID is never kept)."""
        if not self.keep_bodies or not pod_uid(pod):
            return
        key = pod_key(pod)
        encoded = _encode(pod)
        if len(encoded) > self.max_bytes:
            return
        with self._lock:
            old = self._bodies.pop(key, None)
            self._bodies_bytes += len(encoded) - (len(old) if old else 0)
            self._bodies[key] = encoded
            while len(self._bodies) > self.size or self._bodies_bytes > self.max_bytes:
                self._bodies_bytes -= len(self._bodies.popitem(last=False)[1])

    def body(self, key: str) -> dict[str, Any] | None:
        """The last /filter body kept under namespace/name."""
        with self._lock:
            encoded = self._bodies.get(key)
        if encoded is None:
            return None
        pod: dict[str, Any] = json.loads(encoded)  # not orjson: it reads integers over 64 bits as floats
        return pod
