"""Host PID -> (pod UID, container ID) from /proc/<pid>/cgroup, for every layout the kubelet produces.

Shapes handled (see tests/data/cgroup/):
- cgroup v2 (one `0::<path>` line) and v1 (`<id>:<controllers>:<path>` lines; the first line that names a
  pod wins, so `memory`, `cpu,cpuacct`, `name=systemd` all work),
- systemd driver (`kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`) and cgroupfs driver
  (`kubepods/burstable/pod<uid>/<id>`), Guaranteed pods without a QoS level, nested kubelets
  (`kubelet-kubepods-...`), and a private cgroup namespace (`/../../kubepods...`),
- runtime prefixes `cri-containerd-`, `crio-`, `docker-`, none; CRI-O's `crio-conmon-<id>` is the monitor
  process, not the container, and is not attributed.
Static (mirror) pods carry their 32-hex config hash as UID in the cgroup path, which is also accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """Where a process lives: its pod UID, container ID (runtime prefix stripped) and cgroup path."""

    pod_uid: str
    container_id: str
    runtime: str  # "containerd", "crio", "docker" or "" (cgroupfs: the runtime is not in the path)
    path: str  # the cgroup path as read (relative to the reader's cgroup namespace root)
    version: int  # 1 or 2


def parse_cgroup_file(text: str) -> ContainerRef | None:
    """The container of a /proc/<pid>/cgroup text, or None for a process that is not in a pod container."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    version = 2 if lines and all(p[0] == "0" and p[1] == "" for p in lines) else 1
    for _, _, path in sorted(lines, key=lambda p: p[0] != "0"):  # the unified line first when both exist
        ref = parse_cgroup_path(path, version=version)
        if ref is not None:
            return ref
    return None


def parse_cgroup_path(path: str, *, version: int = 2) -> ContainerRef | None:
    """Find `pod<uid>` and the container component after it; anything else (conmon, pause-less pod dir) is None."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        pod = _POD.search(part)
        if pod is None:
            continue
        for comp in parts[i + 1 :]:
            m = _CONTAINER.match(comp)
            if m is not None:
                runtime = "containerd" if m.group(1) == "cri-containerd" else (m.group(1) or "")
                uid = pod.group(1).replace("_", "-")
                return ContainerRef(pod_uid=uid, container_id=m.group(2), runtime=runtime, path=path, version=version)
        return None
    return None


def host_cgroup_dir(ref: ContainerRef, cgroup_root: str) -> str:
    """The container's cgroup directory on the host (for nvmlDeviceSetMemoryLimits_v1's nameSpace).

    A process in another cgroup namespace shows `/../..` components; the kubepods hierarchy always starts at
    the host's root, so the path is re-anchored at its first kubepods/kubelet component.
    """
    parts = [p for p in ref.path.split("/") if p and p != ".."]
    for i, part in enumerate(parts):
        if part.startswith(("kubepods", "kubelet")):
            parts = parts[i:]
            break
    return str(Path(cgroup_root, *parts))


class CgroupResolver:
    """Reads <proc_root>/<pid>/cgroup; proc_root is configurable so tests point it at tests/data."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = Path(proc_root)

    def resolve(self, pid: int) -> ContainerRef | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:  # the process exited, or /proc is not the host's (no hostPID)
            return None
        return parse_cgroup_file(text)
