from __future__ import annotations

import pytest

from device_plugin.envs import EnvSettings, container_slice
from vgpu.annotations import ContainerAssignment, DeviceSlice

UID = "6f1b3c2a-9d8e-4f70-a1b2-c3d4e5f60718"
TWO = ContainerAssignment("vllm", (DeviceSlice("GPU-b", 3, 20480, 30), DeviceSlice("GPU-a", 1, 10240, 30)))


def test_hami_core_limits_follow_assignment_order() -> None:
    s = container_slice(TWO, namespace="ns", pod="p", pod_uid=UID, index=1, settings=EnvSettings())
    assert s.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert s.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"
    assert s.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "10240m"
    assert s.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert s.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(s.mounts[0].container_path)
    assert s.mounts[0].host_path == f"/var/run/vgpu/containers/{UID}_1"  # uid and index, never the name
    assert not any(k.startswith("CUDA_MPS") for k in s.envs)


def test_mps_mode_adds_limits_and_pipe_mounts() -> None:
    s = container_slice(TWO, namespace="ns", pod="p", pod_uid=UID, index=1, settings=EnvSettings(mps=True))
    assert s.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert s.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=10240M"
    paths = {m.container_path: m for m in s.mounts}
    assert paths["/var/run/vgpu/mps/pipe"].host_path == "/var/run/vgpu/mps/pipe"
    assert paths["/var/run/vgpu/mps/log"].read_only
    assert paths["/dev/shm"].host_path == "/var/run/vgpu/mps/shm" and not paths["/dev/shm"].read_only
    assert s.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/vgpu/mps/pipe"


def test_hami_core_library_is_mounted_and_preloaded_only_when_provided() -> None:
    plain = container_slice(TWO, namespace="ns", pod="p", pod_uid=UID, index=0, settings=EnvSettings())
    assert {m.container_path for m in plain.mounts} == {"/var/run/vgpu"}
    s = container_slice(
        TWO,
        namespace="ns",
        pod="p",
        pod_uid=UID,
        index=0,
        settings=EnvSettings(hami_core_library="/opt/hami/libvgpu.so"),
    )
    paths = {m.container_path: m for m in s.mounts}
    assert paths["/usr/local/vgpu/libvgpu.so"].host_path == "/opt/hami/libvgpu.so"
    assert paths["/usr/local/vgpu/libvgpu.so"].read_only
    assert paths["/etc/ld.so.preload"].host_path == "/var/run/vgpu/hami-core/ld.so.preload"
    assert paths["/etc/ld.so.preload"].read_only
    assert not paths["/tmp/vgpulock"].read_only
    assert s.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"  # the same env, now with something reading it


@pytest.mark.parametrize("mps", [False, True])
def test_best_effort_slice_sets_no_sm_limit(mps: bool) -> None:
    c = ContainerAssignment("x", (DeviceSlice("GPU-a", 0, 1024, 0),))
    envs = container_slice(c, namespace="ns", pod="p", pod_uid=UID, index=0, settings=EnvSettings(mps=mps)).envs
    assert "CUDA_DEVICE_SM_LIMIT" not in envs and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs


@pytest.mark.parametrize(
    ("uid", "name", "err"),
    [
        ("../../etc", "vllm", "not a UUID"),
        (UID.upper(), "vllm", "not a UUID"),
        (UID, "x/../../../../../../../../../etc", "not a DNS-1123 label"),
        (UID, "Main", "not a DNS-1123 label"),
    ],
)
def test_no_slice_is_built_from_an_unsafe_uid_or_name(uid: str, name: str, err: str) -> None:
    c = ContainerAssignment(name, TWO.devices)
    with pytest.raises(ValueError, match=err):
        container_slice(c, namespace="ns", pod="p", pod_uid=uid, index=0, settings=EnvSettings())
