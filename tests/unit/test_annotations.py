"""The annotation protocol: versioned round trips and CodecErrors that name the key and the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu import annotations as ann
from vgpu.annotations import Assignment, BindPhase, ContainerAssignment, DeviceSlice
from vgpu.devices import GpuDevice
from vgpu.errors import CodecError
from vgpu.roles import Role

_names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)

gpus = st.lists(
    st.builds(
        GpuDevice,
        uuid=_names,
        index=st.integers(0, 63),
        model=_names,
        memory_mib=st.integers(1, 2**20),
        cores=st.integers(1, 100),
        split_count=st.integers(1, 64),
        numa=st.none() | st.integers(0, 7),
        healthy=st.booleans(),
        nvlink_peers=st.lists(_names, max_size=3).map(tuple),
    ),
    max_size=8,
    unique_by=lambda g: g.uuid,
).map(tuple)

slices = st.lists(
    st.builds(
        DeviceSlice,
        uuid=_names,
        index=st.integers(0, 63),
        memory_mib=st.integers(0, 2**20),
        cores=st.integers(0, 100),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda d: d.uuid,
).map(tuple)

assignments = st.builds(
    Assignment,
    node=_names,
    containers=st.lists(st.builds(ContainerAssignment, name=_names, devices=slices), max_size=3).map(tuple),
    role=st.sampled_from(list(Role)),
    model=st.none() | _names,
)


@given(gpus)
def test_inventory_round_trips(value: tuple[GpuDevice, ...]) -> None:
    assert ann.decode_inventory(ann.encode_inventory(value)) == value


@given(assignments)
def test_assignment_round_trips(value: Assignment) -> None:
    assert ann.decode_assignment(ann.encode_assignment(value)) == value


@pytest.mark.parametrize("phase", list(BindPhase))
def test_bind_phase_round_trips(phase: BindPhase) -> None:
    assert ann.decode_bind_phase(phase.value) is phase


def test_wire_format_of_the_inventory() -> None:
    gpu = GpuDevice("GPU-1", 0, "H100", 81920, numa=1, nvlink_peers=("GPU-2",))
    assert json.loads(ann.encode_inventory([gpu])) == {
        "version": "v1",
        "gpus": [
            {
                "uuid": "GPU-1",
                "index": 0,
                "model": "H100",
                "memoryMiB": 81920,
                "cores": 100,
                "split": 10,
                "numa": 1,
                "healthy": True,
                "nvlink": ["GPU-2"],
            }
        ],
    }


def test_wire_format_of_the_assignment() -> None:
    a = Assignment("n1", (ContainerAssignment("vllm", (DeviceSlice("GPU-1", 3, 1024, 20),)),), Role.DECODE, "ns/m")
    assert json.loads(ann.encode_assignment(a)) == {
        "version": "v1",
        "node": "n1",
        "role": "decode",
        "model": "ns/m",
        "containers": [{"name": "vllm", "devices": [{"uuid": "GPU-1", "index": 3, "memoryMiB": 1024, "cores": 20}]}],
    }


def test_assignment_role_defaults_to_aggregated_and_optional_inventory_fields() -> None:
    a = ann.decode_assignment('{"version":"v1","node":"n","containers":[]}')
    assert (a.role, a.model, a.containers) == (Role.PREFILL_DECODE, None, ())
    g = ann.decode_inventory(
        '{"version":"v1","gpus":[{"uuid":"u","index":0,"model":"m","memoryMiB":1,"cores":1,"split":1,"healthy":true}]}'
    )
    assert (g[0].numa, g[0].nvlink_peers) == (None, ())


_GPU: dict[str, Any] = {
    "uuid": "GPU-0",
    "index": 0,
    "model": "H100",
    "memoryMiB": 81920,
    "cores": 100,
    "split": 10,
    "numa": 0,
    "healthy": True,
    "nvlink": [],
}


def _inv(**changes: Any) -> str:
    gpu = {k: v for k, v in {**_GPU, **changes}.items() if v is not _DROP}
    return json.dumps({"version": "v1", "gpus": [gpu]})


_DROP = object()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{not json", "not JSON"),
        ("", "not JSON"),
        ("[]", "expected a JSON object"),
        ('"v1"', "expected a JSON object"),
        ('{"gpus": []}', "unsupported version None"),
        ('{"version": "v2", "gpus": []}', "unsupported version 'v2'"),
        ('{"version": 1, "gpus": []}', "unsupported version 1"),
        ('{"version": "v1"}', "missing field 'gpus'"),
        ('{"version": "v1", "gpus": {}}', "field 'gpus' must be list, got dict"),
        ('{"version": "v1", "gpus": [7]}', "gpus[0]: expected an object"),
        (_inv(uuid=_DROP), "gpus[0]: missing field 'uuid'"),
        (_inv(memoryMiB=_DROP), "gpus[0]: missing field 'memoryMiB'"),
        (_inv(index="0"), "gpus[0]: field 'index' must be int, got str"),
        (_inv(index=1.0), "gpus[0]: field 'index' must be int, got float"),
        (_inv(memoryMiB=True), "gpus[0]: field 'memoryMiB' must be int, got a boolean"),
        (_inv(split=False), "gpus[0]: field 'split' must be int, got a boolean"),
        (_inv(healthy="yes"), "gpus[0]: field 'healthy' must be bool, got str"),
        (_inv(healthy=1), "gpus[0]: field 'healthy' must be bool, got int"),
        (_inv(uuid=5), "gpus[0]: field 'uuid' must be str, got int"),
        (_inv(numa="0"), "gpus[0]: field 'numa' must be int or null"),
        (_inv(numa=True), "gpus[0]: field 'numa' must be int or null"),
        (_inv(nvlink="GPU-1"), "gpus[0]: field 'nvlink' must be a list of GPU uuids"),
        (_inv(nvlink=[1]), "gpus[0]: field 'nvlink' must be a list of GPU uuids"),
        (_inv(memoryMiB=-1), "gpus[0]: GPU GPU-0: memory_mib must be > 0"),
        (_inv(memoryMiB=0), "memory_mib must be > 0"),
        (_inv(cores=101), "gpus[0]: GPU GPU-0: cores must be 1..100"),
        (_inv(cores=0), "cores must be 1..100"),
        (_inv(index=-1), "index must be >= 0"),
        (_inv(split=0), "split_count must be >= 1"),
        (_inv(uuid=""), "uuid must not be empty"),
        (json.dumps({"version": "v1", "gpus": [_GPU, {**_GPU, "index": 1}]}), "duplicate GPU uuid"),
    ],
)
def test_bad_inventory(value: str, reason: str) -> None:
    with pytest.raises(CodecError) as info:
        ann.decode_inventory(value)
    assert info.value.key == ann.NODE_INVENTORY
    assert reason in info.value.reason
    assert str(info.value).startswith(f"annotation {ann.NODE_INVENTORY}: ")


_SLICE: dict[str, Any] = {"uuid": "GPU-0", "index": 0, "memoryMiB": 1024, "cores": 20}


def _asg(slice_changes: dict[str, Any] | None = None, **changes: Any) -> str:
    dev = {k: v for k, v in {**_SLICE, **(slice_changes or {})}.items() if v is not _DROP}
    obj = {
        "version": "v1",
        "node": "n1",
        "role": "decode",
        "model": None,
        "containers": [{"name": "c", "devices": [dev]}],
    }
    obj.update(changes)
    return json.dumps({k: v for k, v in obj.items() if v is not _DROP})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("nope", "not JSON"),
        ("[1]", "expected a JSON object"),
        (_asg(version=_DROP), "unsupported version None"),
        (_asg(version="v0"), "unsupported version 'v0'"),
        (_asg(node=_DROP), "assignment: missing field 'node'"),
        (_asg(node=""), "'node' must not be empty"),
        (_asg(node=3), "field 'node' must be str, got int"),
        (_asg(role="router"), "unknown role 'router'; allowed: prefill, decode"),
        (_asg(role="both"), "unknown role 'both'"),
        (_asg(model=7), "'model' must be a string or null"),
        (_asg(containers=_DROP), "missing field 'containers'"),
        (_asg(containers={}), "field 'containers' must be list"),
        (_asg(containers=["c"]), "containers[0]: expected an object"),
        (_asg(containers=[{"name": "c"}]), "containers[0]: missing field 'devices'"),
        (_asg(containers=[{"devices": []}]), "containers[0]: missing field 'name'"),
        (_asg(containers=[{"name": "c", "devices": [1]}]), "containers[0].devices[0]: expected an object"),
        (_asg({"uuid": _DROP}), "containers[0].devices[0]: missing field 'uuid'"),
        (_asg({"memoryMiB": -1}), "containers[0].devices[0]: field 'memoryMiB' must be >= 0"),
        (_asg({"cores": 101}), "containers[0].devices[0]: field 'cores' must be 0..100"),
        (_asg({"cores": -1}), "field 'cores' must be 0..100"),
        (_asg({"index": -1}), "containers[0].devices[0]: field 'index' must be >= 0"),
        (_asg({"cores": True}), "field 'cores' must be int, got a boolean"),
        (_asg({"memoryMiB": "1Gi"}), "field 'memoryMiB' must be int, got str"),
        (
            _asg(containers=[{"name": "c", "devices": [_SLICE, _SLICE]}]),
            "containers[0]: a container's vGPUs must be on distinct GPUs",
        ),
    ],
)
def test_bad_assignment(value: str, reason: str) -> None:
    with pytest.raises(CodecError) as info:
        ann.decode_assignment(value)
    assert info.value.key == ann.POD_ASSIGNMENT
    assert reason in info.value.reason
    assert ann.POD_ASSIGNMENT in str(info.value)


def test_two_containers_may_share_a_gpu() -> None:
    value = _asg(containers=[{"name": "a", "devices": [_SLICE]}, {"name": "b", "devices": [_SLICE]}])
    assert len(ann.decode_assignment(value).slices()) == 2


@pytest.mark.parametrize("value", ["bound", "", "Allocated", " allocating"])
def test_unknown_bind_phase(value: str) -> None:
    with pytest.raises(CodecError) as info:
        ann.decode_bind_phase(value)
    assert info.value.key == ann.POD_BIND_PHASE
    assert "allowed: allocating, allocated, failed" in str(info.value)


def test_long_values_are_shortened_in_messages() -> None:
    with pytest.raises(CodecError) as info:
        ann.decode_inventory("x" * 1000)
    assert len(str(info.value)) < 300
    assert "..." in str(info.value)


def test_keys_live_under_the_vgpu_prefix() -> None:
    keys = [ann.NODE_INVENTORY, ann.POD_ASSIGNMENT, ann.POD_BIND_PHASE, ann.POD_BIND_TIME, ann.POD_NODE_POLICY]
    assert all(k.startswith("vgpu.io/") for k in keys)
    assert len(set(keys)) == len(keys)


def test_decoding_reads_what_orjson_refuses_as_the_standard_library_does() -> None:
    """orjson parses first; NaN (which it refuses) and malformed JSON give the standard library's answers."""
    a = Assignment(node="n1", containers=(ContainerAssignment("c", (DeviceSlice("GPU-0", 0, 1024, 10),)),))
    obj = json.loads(ann.encode_assignment(a))
    obj["model"] = float("nan")
    with pytest.raises(CodecError, match="model"):  # NaN read (as json.loads does), then refused by type
        ann.decode_assignment(json.dumps(obj))
    with pytest.raises(CodecError, match=r"not JSON \(Expecting property name enclosed in double quotes at char 1\)"):
        ann.decode_assignment("{")
    assert ann.decode_assignment(ann.encode_assignment(a)) == a
