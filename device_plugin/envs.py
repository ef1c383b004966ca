"""What a container gets for its slice: HAMi-core compatible limits, MPS limits and mounts. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpu.annotations import ContainerAssignment


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


@dataclass(frozen=True, slots=True)
class EnvSettings:
    mps: bool = False
    cache_dir_in_container: str = "/var/run/vgpu"
    cache_dir_on_host: str = "/var/run/vgpu/containers"
    mps_pipe_dir: str = "/tmp/nvidia-mps"
    mps_log_dir: str = "/var/log/nvidia-mps"


def container_slice(
    c: ContainerAssignment, *, namespace: str, pod: str, pod_uid: str, settings: EnvSettings
) -> ContainerSlice:
    """Env and mounts for one container. Device order is the assignment's, so CUDA device i ↔ limit _i.
    cores 0 (best effort) sets no SM limit."""
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in c.devices)}
    for i, d in enumerate(c.devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d.memory_mib}m"
    cores = max((d.cores for d in c.devices), default=0)
    if cores > 0:
        envs["CUDA_DEVICE_SM_LIMIT"] = str(cores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{settings.cache_dir_in_container}/vgpu.cache"
    mounts = [Mount(settings.cache_dir_in_container, f"{settings.cache_dir_on_host}/{pod_uid}_{c.name}")]
    if settings.mps:
        if cores > 0:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={d.memory_mib}M" for i, d in enumerate(c.devices))
        envs["CUDA_MPS_PIPE_DIRECTORY"] = settings.mps_pipe_dir
        envs["CUDA_MPS_LOG_DIRECTORY"] = settings.mps_log_dir
        mounts.append(Mount(settings.mps_pipe_dir, settings.mps_pipe_dir))
        mounts.append(Mount(settings.mps_log_dir, settings.mps_log_dir, read_only=True))
    annotations = {"vgpu.io/pod": f"{namespace}/{pod}", "vgpu.io/container": c.name}
    return ContainerSlice(envs=envs, mounts=tuple(mounts), annotations=annotations)
