"""Parsing a pod's HAMi-compatible vGPU resources: every bad input, explicit defaults, custom names."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import make_container, make_pod
from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import RequestError
from vgpu.requests import ContainerRequest, parse_container, parse_pod_request

GPU, MEM, PCT, CORES, PRIO = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)


def _parse(limits: dict[str, Any], defaults: RequestDefaults = RequestDefaults()) -> ContainerRequest | None:
    return parse_container({"name": "vllm", "resources": {"limits": limits}}, ResourceNames(), defaults)


@pytest.mark.parametrize(
    ("limits", "resource", "value", "allowed"),
    [
        ({GPU: "-1"}, GPU, "-1", "1..64"),
        ({GPU: -1}, GPU, -1, "must not be negative"),
        ({GPU: "0.5"}, GPU, "0.5", "whole number"),
        ({GPU: "500m"}, GPU, "500m", "whole number"),
        ({GPU: 1.5}, GPU, 1.5, "whole number"),
        ({GPU: "two"}, GPU, "two", "not a Kubernetes quantity"),
        ({GPU: 65}, GPU, 65, "1..64"),
        ({GPU: "1k"}, GPU, "1k", "1..64"),
        ({GPU: True}, GPU, True, "boolean"),
        ({GPU: None}, GPU, None, "unsupported type"),
        ({MEM: "-100"}, MEM, "-100", "positive integer number of MiB"),
        ({MEM: 0}, MEM, 0, "positive integer number of MiB"),
        ({MEM: "1.5"}, MEM, "1.5", "whole number"),
        ({MEM: False}, MEM, False, "boolean"),
        ({PCT: 0}, PCT, 0, "1..100"),
        ({PCT: 101}, PCT, 101, "1..100"),
        ({PCT: "50.5"}, PCT, "50.5", "whole number"),
        ({PCT: "-5"}, PCT, "-5", "1..100"),
        ({CORES: 101}, CORES, 101, "0..100"),
        ({CORES: "150"}, CORES, "150", "0..100"),
        ({CORES: -1}, CORES, -1, "0..100"),
        ({CORES: "12.5"}, CORES, "12.5", "whole number"),
        ({PRIO: 2}, PRIO, 2, "0 (high) or 1 (low)"),
        ({PRIO: -1}, PRIO, -1, "0 (high) or 1 (low)"),
        ({PRIO: True}, PRIO, True, "boolean"),
        ({GPU: 1, MEM: 1000, PCT: 50}, f"{MEM}+{PCT}", {MEM: 1000, PCT: 50}, f"only one of {MEM}"),
        ({GPU: 0, MEM: 1000}, GPU, 0, "at least 1"),
        ({GPU: 0, PCT: 20}, GPU, 0, "at least 1"),
        ({GPU: "0", CORES: 20}, GPU, "0", "at least 1"),
    ],
)
def test_bad_input_names_container_resource_value_and_range(
    limits: dict[str, Any], resource: str, value: object, allowed: str
) -> None:
    with pytest.raises(RequestError) as info:
        _parse(limits)
    err = info.value
    assert (err.container, err.resource, err.value) == ("vllm", resource, value)
    assert allowed in err.allowed
    text = str(err)
    assert "'vllm'" in text and resource in text and repr(value) in text and allowed in text


def test_vgpu_resources_on_an_init_container_are_rejected() -> None:
    pod = make_pod(init_containers=[make_container("warmup", gpu=1)], containers=[make_container("vllm", gpu=1)])
    with pytest.raises(RequestError) as info:
        parse_pod_request(pod)
    assert info.value.container == "warmup"
    assert "app containers only" in info.value.allowed


def test_a_bad_value_in_an_init_container_names_the_init_container() -> None:
    pod = make_pod(init_containers=[make_container("warmup", gpucores=300)])
    with pytest.raises(RequestError) as info:
        parse_pod_request(pod)
    assert (info.value.container, info.value.resource) == ("warmup", CORES)


def test_init_containers_without_vgpus_are_fine() -> None:
    sidecar = {"name": "routing-proxy", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1"}}}
    req = parse_pod_request(make_pod(init_containers=[sidecar]))
    assert [c.container for c in req.containers] == ["main"]


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # `gpu` alone: the whole GPU (100 % memory, cores proportional = 100 %), as HAMi users expect.
        ({GPU: 1}, (1, None, 100, None, 1)),
        ({GPU: "2", MEM: "1000"}, (2, 1000, None, None, 1)),
        ({GPU: "1", MEM: "40k"}, (1, 40000, None, None, 1)),  # how the apiserver writes 40000 back
        ({GPU: "1", MEM: 2048}, (1, 2048, None, None, 1)),
        # gpumem only: one vGPU.
        ({MEM: 4096}, (1, 4096, None, None, 1)),
        ({PCT: "25"}, (1, None, 25, None, 1)),
        ({CORES: 30}, (1, None, 100, 30, 1)),
        ({GPU: 1, PCT: 50, CORES: 30, PRIO: 0}, (1, None, 50, 30, 0)),
        ({GPU: 1, CORES: 0}, (1, None, 100, 0, 1)),
        ({GPU: 64, MEM: 1}, (64, 1, None, None, 1)),
        ({GPU: 3.0, PCT: 100, CORES: 100, PRIO: "1"}, (3, None, 100, 100, 1)),
    ],
)
def test_good_inputs_and_explicit_defaults(
    limits: dict[str, Any], expected: tuple[int, int | None, int | None, int | None, int]
) -> None:
    req = _parse(limits)
    assert req is not None
    assert (req.count, req.memory_mib, req.memory_percentage, req.cores, req.priority) == expected


def test_gpu_alone_is_a_whole_gpu() -> None:
    req = _parse({GPU: 1})
    assert req is not None
    assert (req.memory_on(81920), req.cores_on(81920)) == (81920, 100)
    assert (req.memory_on(24576), req.cores_on(24576)) == (24576, 100)


@pytest.mark.parametrize(
    ("limits", "gpu_mib", "memory", "cores"),
    [
        ({PCT: 30}, 81920, 24576, 30),
        ({MEM: 1000}, 3000, 1000, 34),  # 33.3 % rounded up: never reserve fewer SMs than memory share
        ({MEM: 8192}, 81920, 8192, 10),
        ({MEM: 100_000}, 81920, 100_000, 100),  # capped; fit rejects the card as too small
        ({MEM: 1000, CORES: 5}, 3000, 1000, 5),
    ],
)
def test_proportional_cores_follow_the_memory_share(
    limits: dict[str, Any], gpu_mib: int, memory: int, cores: int
) -> None:
    req = _parse(limits)
    assert req is not None
    assert (req.memory_on(gpu_mib), req.cores_on(gpu_mib)) == (memory, cores)


@pytest.mark.parametrize(
    ("defaults", "limits", "expected"),
    [
        (RequestDefaults(cores=0), {GPU: 1}, (1, None, 100, 0, 1)),
        (RequestDefaults(cores=20), {MEM: 1000}, (1, 1000, None, 20, 1)),
        (RequestDefaults(cores=20), {GPU: 1, CORES: 50}, (1, None, 100, 50, 1)),
        (RequestDefaults(count=2, memory_percentage=50, priority=0), {CORES: 10}, (2, None, 50, 10, 0)),
        (RequestDefaults(memory_percentage=25), {GPU: 1, MEM: 512}, (1, 512, None, None, 1)),
    ],
)
def test_configured_defaults(
    defaults: RequestDefaults,
    limits: dict[str, Any],
    expected: tuple[int, int | None, int | None, int | None, int],
) -> None:
    req = _parse(limits, defaults)
    assert req is not None
    assert (req.count, req.memory_mib, req.memory_percentage, req.cores, req.priority) == expected


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {GPU: 0}},
        {"limits": {"cpu": "4", "memory": "8Gi"}},
        {},
        {"limits": None},
        {"limits": ["nvidia.com/gpu"]},
    ],
)
def test_containers_without_a_vgpu_ask_parse_to_none(resources: dict[str, Any]) -> None:
    assert parse_container({"name": "c", "resources": resources}) is None


def test_limits_win_over_requests() -> None:
    c = make_container("vllm", requests={GPU: 1, MEM: 1000, CORES: 10}, gpumem=2000)
    req = parse_container(c)
    assert req is not None
    assert (req.count, req.memory_mib, req.cores) == (1, 2000, 10)


def test_requests_alone_are_read() -> None:
    req = parse_container({"name": "c", "resources": {"requests": {GPU: 2, PCT: 40}}})
    assert req is not None
    assert (req.count, req.memory_percentage) == (2, 40)


def test_a_bad_request_is_reported_even_when_limits_are_good() -> None:
    c = make_container("vllm", requests={CORES: 500}, gpu=1)
    with pytest.raises(RequestError) as info:
        parse_container(c)
    assert (info.value.resource, info.value.value) == (CORES, 500)


def test_custom_resource_names() -> None:
    names = ResourceNames(
        count="example.com/vgpu",
        memory="example.com/vgpu-memory",
        memory_percentage="example.com/vgpu-memory-pct",
        cores="example.com/vgpu-cores",
        priority="example.com/vgpu-priority",
    )
    c = {"name": "c", "resources": {"limits": {"example.com/vgpu": 2, "example.com/vgpu-cores": 40, GPU: 7}}}
    req = parse_container(c, names)
    assert req is not None
    assert (req.count, req.cores, req.memory_percentage) == (2, 40, 100)  # nvidia.com/gpu is not ours now
    assert parse_container({"name": "c", "resources": {"limits": {GPU: 1}}}, names) is None
    with pytest.raises(RequestError) as info:
        parse_container({"name": "c", "resources": {"limits": {"example.com/vgpu-memory-pct": 0}}}, names)
    assert info.value.resource == "example.com/vgpu-memory-pct"


def test_pod_request_keeps_spec_order_and_skips_plain_containers() -> None:
    pod = make_pod(
        containers=[
            make_container("prefill", gpu=2, gpumem=1000),
            {"name": "proxy", "resources": {"limits": {"cpu": "1"}}},
            make_container("decode", gpumem_percentage=30),
        ]
    )
    req = parse_pod_request(pod)
    assert [c.container for c in req.containers] == ["prefill", "decode"]
    assert req.total_vgpus == 3
    assert not req.is_empty
    assert req.shape == ((2, 1000, None, None), (1, None, 30, None))


@pytest.mark.parametrize("pod", [{}, {"spec": {}}, {"spec": {"containers": None}}, make_pod(containers=[])])
def test_pods_without_gpu_containers_have_an_empty_request(pod: dict[str, Any]) -> None:
    req = parse_pod_request(pod)
    assert req.is_empty and req.total_vgpus == 0


def test_unnamed_container_is_named_in_errors() -> None:
    with pytest.raises(RequestError, match="<unnamed>"):
        parse_container({"resources": {"limits": {GPU: -3}}})


@pytest.mark.parametrize("raw", ["20Gi", "1Ki", "500Mi", "2Ti"])
def test_gpumem_with_a_binary_unit_suffix_is_refused_with_the_mib_hint(raw: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_container({"name": "vllm", "resources": {"limits": {GPU: "1", MEM: raw}}})
    assert exc.value.resource == MEM and exc.value.value == raw
    assert "without a binary unit suffix" in str(exc.value) and "20480 for 20 GiB" in str(exc.value)
