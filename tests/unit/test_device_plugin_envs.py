from __future__ import annotations

import pytest

from device_plugin.envs import EnvSettings, container_slice
from vgpu.annotations import ContainerAssignment, DeviceSlice

TWO = ContainerAssignment("vllm", (DeviceSlice("GPU-b", 3, 20480, 30), DeviceSlice("GPU-a", 1, 10240, 30)))


def test_hami_core_limits_follow_assignment_order() -> None:
    s = container_slice(TWO, namespace="ns", pod="p", pod_uid="u1", settings=EnvSettings())
    assert s.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert s.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"
    assert s.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "10240m"
    assert s.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert s.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(s.mounts[0].container_path)
    assert s.mounts[0].host_path.endswith("u1_vllm")
    assert not any(k.startswith("CUDA_MPS") for k in s.envs)


def test_mps_mode_adds_limits_and_pipe_mounts() -> None:
    s = container_slice(TWO, namespace="ns", pod="p", pod_uid="u1", settings=EnvSettings(mps=True))
    assert s.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert s.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=10240M"
    paths = {m.container_path: m for m in s.mounts}
    assert "/tmp/nvidia-mps" in paths and paths["/var/log/nvidia-mps"].read_only


@pytest.mark.parametrize("mps", [False, True])
def test_best_effort_slice_sets_no_sm_limit(mps: bool) -> None:
    c = ContainerAssignment("x", (DeviceSlice("GPU-a", 0, 1024, 0),))
    envs = container_slice(c, namespace="ns", pod="p", pod_uid="u", settings=EnvSettings(mps=mps)).envs
    assert "CUDA_DEVICE_SM_LIMIT" not in envs and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs
