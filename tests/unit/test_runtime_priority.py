"""The runtime priority handed out at Allocate: the mapping (vgpu.priority.runtime_priority), where it goes in each
mode (device_plugin.envs) and that the pod's spec.priority survives the device plugin's trimming of the pod."""

from __future__ import annotations

from typing import Any

import pytest

from device_plugin.envs import HAMI_TASK_PRIORITY_ENV, MPS_CLIENT_PRIORITY_ENV, EnvSettings, container_slice
from device_plugin.pods import pod_record
from vgpu.annotations import ContainerAssignment, DeviceSlice
from vgpu.priority import RUNTIME_HIGH, RUNTIME_LOW, hami_priority_given, runtime_priority

UID = "6f1b3c2a-9d8e-4f70-a1b2-c3d4e5f60718"
ONE = ContainerAssignment("vllm", (DeviceSlice("GPU-a", 0, 20480, 30),))
RES = "nvidia.com/priority"


def _pod(
    priority: int | None = None, *, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "sidecar", "resources": {"limits": {RES: "0"}}},  # another container's word never counts
            {
                "name": "vllm",
                "resources": {"limits": {"nvidia.com/gpu": "1", **(limits or {})}, "requests": requests or {}},
            },
        ]
    }
    if priority is not None:
        spec["priority"] = priority
    return {"spec": spec}


@pytest.mark.parametrize(
    ("priority", "expected"),
    [(None, RUNTIME_LOW), (0, RUNTIME_LOW), (999, RUNTIME_LOW), (1000, RUNTIME_HIGH), (100000, RUNTIME_HIGH)],
)
def test_the_class_value_decides_at_the_threshold(priority: int | None, expected: int) -> None:
    assert runtime_priority(_pod(priority), "vllm", resource=RES, online_min=1000) == expected


def test_the_threshold_is_the_operators() -> None:
    assert runtime_priority(_pod(500), "vllm", resource=RES, online_min=100) == RUNTIME_HIGH
    assert runtime_priority(_pod(500), "vllm", resource=RES, online_min=501) == RUNTIME_LOW


@pytest.mark.parametrize(
    ("priority", "given", "expected"),
    [(100000, "1", RUNTIME_LOW), (100, "0", RUNTIME_LOW), (100, 0, RUNTIME_LOW), (100000, "0", RUNTIME_HIGH)],
)
def test_the_containers_own_hami_priority_lowers_but_never_raises_the_class(
    priority: int, given: Any, expected: int
) -> None:
    assert runtime_priority(_pod(priority, limits={RES: given}), "vllm", resource=RES, online_min=1000) == expected


def test_limits_before_requests_and_only_0_or_1_counts() -> None:
    assert hami_priority_given(_pod(requests={RES: "0"}), "vllm", RES) == 0
    assert hami_priority_given(_pod(limits={RES: "1"}, requests={RES: "0"}), "vllm", RES) == 1
    assert hami_priority_given(_pod(limits={RES: "2"}), "vllm", RES) is None
    assert hami_priority_given(_pod(), "vllm", RES) is None
    assert hami_priority_given(_pod(), "missing", RES) is None
    assert hami_priority_given(_pod(limits={"example.com/prio": "0"}), "vllm", "example.com/prio") == 0
    # an unreadable value falls back to the class, it is not a refusal here (the webhook refuses it earlier)
    assert runtime_priority(_pod(100000, limits={RES: "high"}), "vllm", resource=RES, online_min=1000) == RUNTIME_HIGH


def test_spec_priority_of_the_wrong_type_is_no_priority() -> None:
    assert runtime_priority({"spec": {"priority": True}}, "vllm", resource=RES, online_min=1) == RUNTIME_LOW
    assert runtime_priority({"spec": {"priority": "100000"}}, "vllm", resource=RES, online_min=1) == RUNTIME_LOW


def _envs(settings: EnvSettings, prio: int | None) -> dict[str, str]:
    return container_slice(
        ONE, namespace="ns", pod="p", pod_uid=UID, index=0, settings=settings, runtime_priority=prio
    ).envs


@pytest.mark.parametrize("prio", [RUNTIME_HIGH, RUNTIME_LOW])
def test_each_mode_gets_the_env_its_runtime_reads(prio: int) -> None:
    hami = EnvSettings(hami_core_library="/opt/hami/libvgpu.so")
    assert _envs(hami, prio)[HAMI_TASK_PRIORITY_ENV] == str(prio) and MPS_CLIENT_PRIORITY_ENV not in _envs(hami, prio)
    mps = EnvSettings(mps=True)
    assert _envs(mps, prio)[MPS_CLIENT_PRIORITY_ENV] == str(prio) and HAMI_TASK_PRIORITY_ENV not in _envs(mps, prio)
    both = _envs(EnvSettings(mps=True, hami_core_library="/opt/hami/libvgpu.so"), prio)
    assert both[HAMI_TASK_PRIORITY_ENV] == both[MPS_CLIENT_PRIORITY_ENV] == str(prio)
    plain = _envs(EnvSettings(), prio)
    assert HAMI_TASK_PRIORITY_ENV not in plain and MPS_CLIENT_PRIORITY_ENV not in plain


def test_no_priority_given_sets_no_env_in_any_mode() -> None:
    envs = _envs(EnvSettings(mps=True, hami_core_library="/opt/hami/libvgpu.so"), None)
    assert HAMI_TASK_PRIORITY_ENV not in envs and MPS_CLIENT_PRIORITY_ENV not in envs


def test_the_device_plugin_keeps_spec_priority_and_nothing_else_new() -> None:
    pod: dict[str, Any] = {
        "metadata": {"namespace": "llm", "name": "a", "uid": UID},
        "spec": {
            "priority": 100000,
            "priorityClassName": "online",
            "nodeName": "n",
            "containers": [{"name": "vllm", "image": "x", "resources": {"limits": {RES: "1"}}}],
        },
    }
    spec = pod_record(pod).spec
    assert spec == {"spec": {"priority": 100000, "containers": [{"name": "vllm", "resources": {"limits": {RES: "1"}}}]}}
    assert runtime_priority(spec, "vllm", resource=RES, online_min=1000) == RUNTIME_LOW  # its own word lowers it
    del pod["spec"]["priority"]
    assert "priority" not in pod_record(pod).spec["spec"]
