"""What a container gets for its slice: HAMi-core compatible limits, MPS limits and mounts. Pure.

The HAMi-core variables (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT) only act when HAMi-core's
library is loaded in the container: with `hami_core_library` set, the library and an /etc/ld.so.preload naming
it are mounted as HAMi's device plugin does (Project-HAMi/HAMi
pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go at commit 057ea14b: libvgpu.so read-only, the host's
ld.so.preload over /etc/ld.so.preload read-only, /tmp/vgpulock shared); without it they are inert.
MPS clients get the daemon's pipe folder, its log folder and the shared memory folder the daemon uses as
/dev/shm (NVIDIA k8s-device-plugin internal/plugin/mps.go at commit 13985c2b mounts the same two).

Host paths are built only from the operator's settings, the pod UID (checked to be a UUID) and the container's
position in the assignment — never from a name a pod author wrote (docs/device-plugin.md, "What is checked").
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from vgpu import annotations as ann
from vgpu.annotations import ContainerAssignment
from vgpu.assignment_check import is_dns1123_label, is_pod_uid, shown
from vgpu.priority import DEFAULT_ONLINE_PRIORITY_MIN


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerSlice:
    """The protocol-free form of a ContainerAllocateResponse."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)


# Where HAMi-core's pieces go in the container (HAMi's paths: images built for HAMi expect them there).
HAMI_CORE_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
HAMI_CORE_LOCK_DIR_IN_CONTAINER = "/tmp/vgpulock"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"

# The runtime priority (vgpu.priority.runtime_priority, 0 high / 1 low) under each runtime that reads one:
# HAMi pkg/util/types.go `TaskPriority`; NVIDIA's Multi-Process Service guide, "Environment Variables".
HAMI_TASK_PRIORITY_ENV = "CUDA_TASK_PRIORITY"
MPS_CLIENT_PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"


@dataclass(frozen=True, slots=True)
class EnvSettings:
    mps: bool = False
    cache_dir_in_container: str = "/var/run/vgpu"
    cache_dir_on_host: str = "/var/run/vgpu/containers"
    mps_pipe_dir: str = "/var/run/vgpu/mps/pipe"
    mps_log_dir: str = "/var/run/vgpu/mps/log"
    mps_shm_dir: str = "/var/run/vgpu/mps/shm"
    # HAMi-core (host paths): "" = not provided, its variables are inert. The preload file and lock folder
    # are written by the plugin at start (device_plugin.hami_core).
    hami_core_library: str = ""
    hami_core_preload_file: str = "/var/run/vgpu/hami-core/ld.so.preload"
    hami_core_lock_dir: str = "/var/run/vgpu/hami-core/vgpulock"
    # PriorityClass value from which a pod counts as online for the runtime priority (vgpu.priority).
    online_priority_min: int = DEFAULT_ONLINE_PRIORITY_MIN


def cache_dir_on_host(settings: EnvSettings, *, pod_uid: str, index: int) -> str:
    """`<cache_dir_on_host>/<pod uid>_<index>`: a direct child of the configured folder, or ValueError."""
    if not is_pod_uid(pod_uid):
        raise ValueError(f"pod UID {shown(pod_uid)} is not a UUID; no host path is built from it")
    if index < 0:
        raise ValueError(f"container index must be >= 0, got {index}")
    base = posixpath.normpath(settings.cache_dir_on_host)
    path = posixpath.join(base, f"{pod_uid}_{index}")
    if posixpath.dirname(path) != base:  # cannot happen with a UUID and an int; kept as the invariant
        raise ValueError(f"host path {path!r} is not directly under {base!r}")
    return path


def container_slice(
    c: ContainerAssignment,
    *,
    namespace: str,
    pod: str,
    pod_uid: str,
    index: int,
    settings: EnvSettings,
    runtime_priority: int | None = None,
) -> ContainerSlice:
    """Env and mounts for one container (`index`: its position in the assignment). Device order is the
    assignment's, so CUDA device i ↔ limit _i. cores 0 (best effort) sets no SM limit. `runtime_priority`
    (0 high, 1 low) goes to the runtimes that read one — HAMi-core when its library is provided, MPS when on —
    and nowhere in plain mode, where nothing would read it."""
    if not is_dns1123_label(c.name):
        raise ValueError(f"container name {shown(c.name)} is not a DNS-1123 label")
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in c.devices)}
    for i, d in enumerate(c.devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d.memory_mib}m"
    cores = max((d.cores for d in c.devices), default=0)
    if cores > 0:
        envs["CUDA_DEVICE_SM_LIMIT"] = str(cores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{settings.cache_dir_in_container}/vgpu.cache"
    mounts = [Mount(settings.cache_dir_in_container, cache_dir_on_host(settings, pod_uid=pod_uid, index=index))]
    if settings.mps:
        if cores > 0:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={d.memory_mib}M" for i, d in enumerate(c.devices))
        envs["CUDA_MPS_PIPE_DIRECTORY"] = settings.mps_pipe_dir
        envs["CUDA_MPS_LOG_DIRECTORY"] = settings.mps_log_dir
        mounts.append(Mount(settings.mps_pipe_dir, settings.mps_pipe_dir))
        mounts.append(Mount(settings.mps_log_dir, settings.mps_log_dir, read_only=True))
        mounts.append(Mount("/dev/shm", settings.mps_shm_dir))
        if runtime_priority is not None:
            envs[MPS_CLIENT_PRIORITY_ENV] = str(runtime_priority)
    if settings.hami_core_library:
        mounts.append(Mount(HAMI_CORE_LIBRARY_IN_CONTAINER, settings.hami_core_library, read_only=True))
        mounts.append(Mount(PRELOAD_IN_CONTAINER, settings.hami_core_preload_file, read_only=True))
        mounts.append(Mount(HAMI_CORE_LOCK_DIR_IN_CONTAINER, settings.hami_core_lock_dir))
        if runtime_priority is not None:
            envs[HAMI_TASK_PRIORITY_ENV] = str(runtime_priority)
    annotations = {ann.CRI_POD: f"{namespace}/{pod}", ann.CRI_CONTAINER: c.name}
    return ContainerSlice(envs=envs, mounts=tuple(mounts), annotations=annotations)
