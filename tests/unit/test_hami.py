"""vgpu.hami: HAMi's selection and policy annotations, with HAMi's semantics, merged with kube-vgpu's own keys."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_info
from vgpu import annotations as ann
from vgpu import hami
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.pod import PodInfo
from vgpu.state import ClusterState, GpuUsage

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
GPUS = (
    GpuDevice("GPU-00000000-0000-0000-0000-000000000000", 0, A100, 40960),
    GpuDevice("GPU-11111111-1111-1111-1111-111111111111", 1, H100, 81920),
    GpuDevice("GPU-22222222-2222-2222-2222-222222222222", 2, L4, 23034),
    GpuDevice("GPU-33333333-3333-3333-3333-333333333333", 3, H100, 81920),
)
U0, U1, U2, U3 = (g.uuid for g in GPUS)


def _allowed(annotations: dict[str, str]) -> list[str]:
    """The UUIDs a one-vGPU pod with these annotations may use on the four-GPU node, through fit_node."""
    pod = make_info(annotations=annotations, gpumem=1000)
    out = []
    for g in GPUS:
        state = ClusterState()
        state.upsert_node(NodeInventory("n", (g,)))
        fit = fit_node(state.nodes["n"], pod, state.config, _first)
        if isinstance(fit, NodePlacement):
            out.append(g.uuid)
    return out


def _first(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return 0.0


# ---- each annotation alone, as HAMi reads it


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("A100", [U0]),  # a substring of the type
        ("h100", [U1, U3]),  # upper-cased on both sides
        ("NVIDIA-NVIDIA L4", [U2]),  # HAMi's full type string: "NVIDIA-" + the NVML name
        ("A100,L4", [U0, U2]),  # comma-separated, any entry
        (" A100 , L4 ", [U0, U2]),  # entries trimmed
        ("V100", []),
    ],
)
def test_use_gputype_is_a_case_insensitive_substring_of_hamis_type(value: str, allowed: list[str]) -> None:
    assert _allowed({hami.USE_GPU_TYPE: value}) == allowed


@pytest.mark.parametrize(
    ("value", "allowed"),
    [("H100", [U0, U2]), ("a100,l4", [U1, U3]), ("NVIDIA", []), ("T4", [U0, U1, U2, U3])],
)
def test_nouse_gputype_excludes_every_type_that_contains_an_entry(value: str, allowed: list[str]) -> None:
    assert _allowed({hami.NOUSE_GPU_TYPE: value}) == allowed


def test_use_gpuuuid_is_an_exact_list_and_nouse_gpuuuid_excludes() -> None:
    assert _allowed({hami.USE_GPU_UUID: f"{U1},{U2}"}) == [U1, U2]
    assert _allowed({hami.USE_GPU_UUID: U1[:-1]}) == []  # exact, not a prefix
    assert _allowed({hami.NOUSE_GPU_UUID: f"{U0}, {U3}"}) == [U1, U2]


def test_policies_map_onto_kube_vgpus() -> None:
    info = make_info(annotations={hami.NODE_POLICY: "spread", hami.GPU_POLICY: "binpack"})
    assert (info.node_policy, info.gpu_policy) == ("spread", "binpack")
    sel = hami.select({hami.GPU_POLICY: "topology-aware"})
    assert sel.overrides.gpu_policy is None and "cluster's GPU order" in sel.notes[0]


# ---- combinations and precedence


def test_types_and_uuids_combine() -> None:
    both = {hami.USE_GPU_TYPE: "H100", hami.NOUSE_GPU_UUID: U1}
    assert _allowed(both) == [U3]
    assert _allowed({hami.USE_GPU_TYPE: "H100", hami.NOUSE_GPU_TYPE: "80GB"}) == []
    assert _allowed({hami.USE_GPU_TYPE: "NVIDIA", hami.NOUSE_GPU_TYPE: "L4", hami.USE_GPU_UUID: f"{U2},{U3}"}) == [U3]


def test_use_gpuuuid_makes_hami_ignore_nouse_gpuuuid_and_the_webhook_says_so() -> None:
    annotations = {hami.USE_GPU_UUID: f"{U1},{U2}", hami.NOUSE_GPU_UUID: U1}
    assert _allowed(annotations) == [U1, U2]  # HAMi's CheckUUID returns on use-gpuuuid
    assert any("nouse-gpuuuid is ignored" in n for n in hami.select(annotations).notes)


def test_kube_vgpus_own_keys_win_with_a_note() -> None:
    annotations = {
        ann.POD_USE_GPU_MODELS: L4,
        hami.USE_GPU_TYPE: "H100",
        ann.POD_NODE_POLICY: "binpack",
        hami.NODE_POLICY: "spread",
        ann.POD_GPU_POLICY: "spread",
        hami.GPU_POLICY: "binpack",
    }
    assert _allowed(annotations) == [U2]
    sel = hami.select(annotations)
    assert (sel.overrides.node_policy, sel.overrides.gpu_policy) == ("binpack", "spread")
    assert sel.gpu_filter is None
    assert len(sel.notes) == 3 and all("kube-vgpu's own key wins" in n for n in sel.notes)
    # A HAMi key without a kube-vgpu counterpart still applies next to ours.
    assert _allowed({ann.POD_USE_GPU_MODELS: f"{H100},{L4}", hami.NOUSE_GPU_UUID: U1}) == [U2, U3]


def test_no_hami_keys_means_no_filter_and_no_notes() -> None:
    sel = hami.select({ann.POD_NODE_POLICY: "spread", "team": "x"})
    assert sel == hami.Selection(overrides=ann.PodOverrides(node_policy="spread"))
    assert make_info().gpu_filter is None


def test_empty_entries_are_dropped_with_a_note_where_hami_would_allow_every_gpu() -> None:
    annotations = {hami.USE_GPU_TYPE: "L4,"}
    assert _allowed(annotations) == [U2]
    assert "empty entries" in hami.select(annotations).notes[0]
    assert _allowed({hami.USE_GPU_TYPE: ""}) == [U0, U1, U2, U3]  # nothing given: no filter
    assert _allowed({hami.USE_GPU_UUID: " , "}) == [U0, U1, U2, U3]


def test_the_filter_is_part_of_the_shape_key() -> None:
    a = make_info(annotations={hami.NOUSE_GPU_UUID: U1})
    b = make_info(annotations={hami.NOUSE_GPU_UUID: U2})
    assert a.shape_key() != b.shape_key()
    assert a.shape_key() == dataclasses.replace(b, gpu_filter=a.gpu_filter).shape_key()


def test_a_pod_limited_to_absent_gpus_fails_unresolvably_naming_the_reason() -> None:
    state = ClusterState(PlacementConfig())
    state.upsert_node(NodeInventory("n", GPUS))
    fit = fit_node(state.nodes["n"], make_info(annotations={hami.USE_GPU_UUID: U0}, gpu=2), state.config, _first)
    assert isinstance(fit, FitFailure) and fit.unresolvable
    assert "GPU UUID not allowed on 3" in fit.reason


# ---- bad values


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        (hami.NODE_POLICY, "Spread", "binpack | spread"),
        (hami.NODE_POLICY, "topology-aware", "binpack | spread"),
        (hami.GPU_POLICY, "mutex", "binpack | spread | topology-aware"),
        (hami.USE_GPU_UUID, "GPU 0", "GPU UUIDs"),
        (hami.NOUSE_GPU_UUID, f"{U0},0", "not '0'"),
        (hami.USE_GPU_UUID, f"{U0}::1", "GPU UUIDs"),
    ],
)
def test_bad_values_are_refused_naming_the_annotation_and_what_is_allowed(key: str, value: str, allowed: str) -> None:
    with pytest.raises(hami.AnnotationValueError) as err:
        make_info(annotations={key: value})
    msg = str(err.value)
    assert msg.startswith(f"annotation {key}={value!r} is invalid; allowed: ") and allowed in msg


def test_a_bad_hami_value_on_a_pod_without_vgpus_is_not_an_error() -> None:
    info = make_info(annotations={hami.NODE_POLICY: "nope"}, containers=[{"name": "c", "image": "x"}])
    assert info.request.is_empty and info.node_policy is None


def test_hami_keys_kube_vgpu_does_not_honour_are_named_in_a_note() -> None:
    sel = hami.select({"nvidia.com/vgpu-mode": "mig", "nvidia.com/numa-bind": "true"})
    assert sel.gpu_filter is None and sel.overrides == ann.PodOverrides()
    assert [n.split(" is not honoured")[0] for n in sel.notes] == ["nvidia.com/vgpu-mode", "nvidia.com/numa-bind"]


# ---- property: the filter agrees with HAMi's rules as its source states them, wherever the inputs mean the same


def _hami_allows(annotations: dict[str, str], model: str, uuid: str) -> bool:
    """HAMi's checkGPUtype and CheckUUID (pkg/device/nvidia/device.go) restated: type entries are upper-cased
    substrings of the upper-cased "NVIDIA-" + model; use-gpuuuid, when present, decides alone."""
    kind = f"NVIDIA-{model}".upper()
    if hami.USE_GPU_TYPE in annotations and not any(
        t.upper() in kind for t in annotations[hami.USE_GPU_TYPE].split(",")
    ):
        return False
    if hami.NOUSE_GPU_TYPE in annotations and any(
        t.upper() in kind for t in annotations[hami.NOUSE_GPU_TYPE].split(",")
    ):
        return False
    if hami.USE_GPU_UUID in annotations:
        return uuid in annotations[hami.USE_GPU_UUID].split(",")
    if hami.NOUSE_GPU_UUID in annotations:
        return uuid not in annotations[hami.NOUSE_GPU_UUID].split(",")
    return True


_WORDS = st.sampled_from(["a100", "A100", "H100", "h100 80gb", "L4", "NVIDIA", "NVIDIA-NVIDIA", "SXM4", "80GB", "V100"])
_MODELS = st.sampled_from([A100, H100, L4, "Tesla V100-PCIE-32GB", "NVIDIA A100 80GB PCIe"])
_UUIDS = st.sampled_from([U0, U1, U2, U3])


@settings(max_examples=300, deadline=None)
@given(
    model=_MODELS,
    uuid=_UUIDS,
    use_types=st.none() | st.lists(_WORDS, min_size=1, max_size=3),
    nouse_types=st.none() | st.lists(_WORDS, min_size=1, max_size=3),
    use_uuids=st.none() | st.lists(_UUIDS, min_size=1, max_size=3),
    nouse_uuids=st.none() | st.lists(_UUIDS, min_size=1, max_size=3),
)
def test_the_filter_agrees_with_hamis_rules(
    model: str,
    uuid: str,
    use_types: list[str] | None,
    nouse_types: list[str] | None,
    use_uuids: list[str] | None,
    nouse_uuids: list[str] | None,
) -> None:
    annotations = {
        key: ",".join(values)
        for key, values in (
            (hami.USE_GPU_TYPE, use_types),
            (hami.NOUSE_GPU_TYPE, nouse_types),
            (hami.USE_GPU_UUID, use_uuids),
            (hami.NOUSE_GPU_UUID, nouse_uuids),
        )
        if values is not None
    }
    gpu_filter = hami.select(annotations).gpu_filter
    ours = gpu_filter is None or gpu_filter.blocker(GpuDevice(uuid, 0, model, 81920)) is None
    assert ours == _hami_allows(annotations, model, uuid), annotations
