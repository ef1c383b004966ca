"""llm-d `file-discovery` endpoints file for clusters without Kubernetes routing (Slurm, Ray, bare metal).

Format (YAML or JSON; we write JSON, which is YAML): `{"endpoints": [{"name", "namespace", "address",
"port" (a string), "labels": {}}]}`, at most 1 MiB, reloaded by the router on an atomic rename. We write a
temporary file in the same directory, fsync it and rename it over the target, and only when the content
changed. Labels: the pod's own labels plus the slice facts (`vgpu.io/gpu`, `vgpu.io/gpu-memory-bytes`,
`vgpu.io/gpu-cores`, `vgpu.io/role`, `vgpu.io/model`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from device_plugin.pods import PodRecord
from device_plugin.watchdog.slices import Slice
from vgpu import annotations as ann

log = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024


def endpoints(pods: Iterable[PodRecord], slices: Iterable[Slice], *, port: str) -> list[dict[str, object]]:
    """One endpoint per pod that holds slices and has an IP; slice labels of its first container's GPUs."""
    by_pod: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        by_pod.setdefault((s.id.namespace, s.id.pod), []).append(s)
    out: list[dict[str, object]] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        held = sorted(by_pod.get((pod.namespace, pod.name), []), key=lambda s: (s.id.container, s.gpu_index))
        if not held or not pod.pod_ip:
            continue
        labels = dict(pod.labels)
        labels.update(
            {
                ann.ENDPOINT_GPU: ",".join(s.id.uuid for s in held),
                ann.ENDPOINT_GPU_MEMORY_BYTES: str(sum(s.memory_limit for s in held)),
                ann.ENDPOINT_GPU_CORES: ",".join(str(s.cores) for s in held),
                ann.ENDPOINT_ROLE: held[0].role,
            }
        )
        if held[0].model:
            labels[ann.ENDPOINT_MODEL] = held[0].model
        out.append(
            {"name": pod.name, "namespace": pod.namespace, "address": pod.pod_ip, "port": port, "labels": labels}
        )
    return out


def render(items: list[dict[str, object]]) -> bytes:
    data = json.dumps({"endpoints": items}, indent=1, sort_keys=True).encode() + b"\n"
    if len(data) > MAX_BYTES:
        raise ValueError(f"endpoints file would be {len(data)} bytes > 1 MiB; llm-d refuses it")
    return data


def write_atomic(path: str | Path, data: bytes) -> bool:
    """Replace `path` with `data` by rename (readers see the old or the new file, never half); False if unchanged."""
    target = Path(path)
    try:
        if target.read_bytes() == data:
            return False
    except OSError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


class DiscoveryFileWriter:
    """The watchdog's after_cycle hook: rewrite the file when the endpoints changed."""

    def __init__(self, path: str | Path, *, port: str) -> None:
        self.path = Path(path)
        self.port = port
        self.writes = 0

    def __call__(self, pods: Sequence[PodRecord], slices: Sequence[Slice]) -> None:
        if write_atomic(self.path, render(endpoints(pods, slices, port=self.port))):
            self.writes += 1
            log.info("file-discovery: wrote %s", self.path)
