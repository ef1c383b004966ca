"""llm-d `file-discovery` endpoints file for clusters without Kubernetes routing (Slurm, Ray, bare metal).

Format (YAML or JSON; we write JSON, which is YAML): `{"endpoints": [{"name", "namespace", "address",
"port" (a string), "labels": {}}]}`, at most 1 MiB. The router reads it once unless its file-discovery
plugin has `watchFile: true`; with it, an atomic rename is picked up (it re-attaches its watch to the new
inode: pkg/epp/framework/plugins/datalayer/discovery/file/plugin.go @ 06986a05). We write a temporary file
in the same directory, fsync it and rename it over the target, and only when the content changed.

Labels: the pod's own labels, the labels the router's own filters read (`llm-d.ai/role` for prefill-filter /
decode-filter, `llm-d.ai/model`), and the slice facts (`vgpu.io/gpu`: each GPU once, `vgpu.io/gpu-cores`:
the SM share per listed GPU, `vgpu.io/gpu-memory-bytes`, `vgpu.io/role`, `vgpu.io/model`).

The router's DCGM source scrapes `<endpoint address>:<feed port>` in file-discovery mode (there is no node
address), so the feed is only reachable when the endpoint address is the host's: host processes (standalone
mode, device_plugin.standalone) or hostNetwork pods. The extractor matches the feed's `pod` label against the
endpoint name, which is the pod name here.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from device_plugin.pods import PodRecord
from device_plugin.watchdog.slices import Slice
from vgpu import annotations as ann
from vgpu.roles import MODEL_LABELS, ROLE_LABEL

log = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024


MODEL_LABEL = MODEL_LABELS[0]


def slice_labels(held: Sequence[Slice]) -> dict[str, str]:
    """The labels of one endpoint from its slices: each GPU once (in index order), its SM share summed over
    the endpoint's containers on it, the role and model for the router's filters and ours."""
    cores: dict[str, int] = {}
    order = sorted({(s.gpu_index, s.id.uuid) for s in held})
    for s in held:
        cores[s.id.uuid] = cores.get(s.id.uuid, 0) + s.cores
    labels = {
        ann.ENDPOINT_GPU: ",".join(u for _, u in order),
        ann.ENDPOINT_GPU_MEMORY_BYTES: str(sum(s.memory_limit for s in held)),
        ann.ENDPOINT_GPU_CORES: ",".join(str(cores[u]) for _, u in order),
        ann.ENDPOINT_ROLE: held[0].role,
        ROLE_LABEL: held[0].role,
    }
    model = next((s.model for s in held if s.model), "")
    if model:
        labels[ann.ENDPOINT_MODEL] = model
        labels[MODEL_LABEL] = model
    return labels


def endpoints(
    pods: Iterable[PodRecord], slices: Iterable[Slice], *, port: str | Callable[[PodRecord], str]
) -> list[dict[str, object]]:
    """One endpoint per pod that holds slices and has an IP (named as the pod: the feed's `pod` label)."""
    by_pod: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        by_pod.setdefault((s.id.namespace, s.id.pod), []).append(s)
    out: list[dict[str, object]] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        held = sorted(by_pod.get((pod.namespace, pod.name), []), key=lambda s: (s.id.container, s.gpu_index))
        if not held or not pod.pod_ip:
            continue
        labels = dict(pod.labels)
        labels.update(slice_labels(held))
        out.append(
            {
                "name": pod.name,
                "namespace": pod.namespace,
                "address": pod.pod_ip,
                "port": port if isinstance(port, str) else port(pod),
                "labels": labels,
            }
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

    def __init__(self, path: str | Path, *, port: str | Callable[[PodRecord], str]) -> None:
        self.path = Path(path)
        self.port = port
        self.writes = 0

    def __call__(self, pods: Sequence[PodRecord], slices: Sequence[Slice]) -> None:
        if write_atomic(self.path, render(endpoints(pods, slices, port=self.port))):
            self.writes += 1
            log.info("file-discovery: wrote %s", self.path)
