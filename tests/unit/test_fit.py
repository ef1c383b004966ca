"""fit_node: concrete GPUs per container, distinct GPUs per container, and readable failures."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import GPU_MEM, assert_invariants, make_assignment, make_container, make_info, make_node
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState, GpuUsage, HostUse


def _first(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return 0.0  # ties broken by GPU index


def _fit(state: ClusterState, node: str, pod: PodInfo) -> NodePlacement | FitFailure:
    return fit_node(state.nodes[node], pod, state.config, _first)


def _state(*nodes: NodeInventory, config: PlacementConfig | None = None) -> ClusterState:
    s = ClusterState(config)
    for n in nodes:
        s.upsert_node(n)
    return s


def test_multi_gpu_containers_land_on_distinct_gpus_per_container() -> None:
    s = _state(make_node("n", 4))
    pod = make_info(
        containers=[make_container("a", gpu=2, gpumem=1000), make_container("b", gpu=3, gpumem=1000)],
    )
    fit = _fit(s, "n", pod)
    assert isinstance(fit, NodePlacement)
    for c in fit.containers:
        uuids = [d.uuid for d in c.devices]
        assert len(uuids) == len(set(uuids))
    assert [(c.name, len(c.devices)) for c in fit.containers] == [("a", 2), ("b", 3)]
    # Containers may share a GPU; the slices are summed there.
    s.apply(pod.key, fit.assignment(pod))
    assert_invariants(s)


def test_a_container_asking_for_more_vgpus_than_gpus_is_unresolvable() -> None:
    s = _state(make_node("n", 2))
    fit = _fit(s, "n", make_info(gpu=3, gpumem=1000))
    assert isinstance(fit, FitFailure) and fit.unresolvable
    assert "needs 3 vGPU(s)" in fit.reason and "2 of 2 GPUs can host one" in fit.reason


def test_the_second_container_sees_the_first_containers_slices() -> None:
    s = _state(make_node("n", 1))
    pod = make_info(containers=[make_container("a", gpumem=50000), make_container("b", gpumem=50000)])
    fit = _fit(s, "n", pod)
    assert isinstance(fit, FitFailure)
    assert "container 'b'" in fit.reason and "GPU memory full on 1" in fit.reason


def test_assignment_carries_role_and_model() -> None:
    s = _state(make_node("n", 1))
    pod = make_info(role="decode", model="llama", gpumem=1000)
    fit = _fit(s, "n", pod)
    assert isinstance(fit, NodePlacement)
    a = fit.assignment(pod)
    assert (a.node, a.role, a.model) == ("n", Role.DECODE, "default/llama")
    assert [(d.memory_mib, d.cores) for d in a.slices()] == [(1000, 2)]  # proportional: ceil(1000/81920)


def test_proportional_cores_are_resolved_per_gpu() -> None:
    small = NodeInventory("n", (GpuDevice("n-g0", 0, "L4", 20000),))
    s = _state(small)
    fit = _fit(s, "n", make_info(gpumem=5000))
    assert isinstance(fit, NodePlacement)
    assert [(d.memory_mib, d.cores) for d in fit.containers[0].devices] == [(5000, 25)]


@pytest.mark.parametrize(
    ("node", "pod", "config", "reason", "unresolvable"),
    [
        (make_node("n", 2, unhealthy=(0, 1)), make_info(gpu=1), PlacementConfig(), "unhealthy on 2", False),
        (
            make_node("n", 2, model="A10"),
            make_info(annotations={"vgpu.io/use-gpu-models": "H100, H200"}),
            PlacementConfig(),
            "GPU model not allowed on 2",
            True,
        ),
        (make_node("n", 1, memory_mib=24576), make_info(gpumem=30000), PlacementConfig(), "card too small on 1", True),
        (make_node("n", 0), make_info(gpu=1), PlacementConfig(), "node has no GPUs", True),
    ],
)
def test_static_exclusions(
    node: NodeInventory, pod: PodInfo, config: PlacementConfig, reason: str, unresolvable: bool
) -> None:
    fit = _fit(_state(node, config=config), "n", pod)
    assert isinstance(fit, FitFailure)
    assert reason in fit.reason and fit.unresolvable is unresolvable


def test_unhealthy_gpus_are_skipped_and_allowed_only_by_config() -> None:
    node = make_node("n", 2, unhealthy=(0,))
    fit = _fit(_state(node), "n", make_info(gpu=1))
    assert isinstance(fit, NodePlacement) and fit.containers[0].devices[0].index == 1
    fit2 = _fit(_state(node, config=PlacementConfig(allow_unhealthy=True)), "n", make_info(gpu=2))
    assert isinstance(fit2, NodePlacement) and len(fit2.containers[0].devices) == 2


def test_gpu_models_annotation_selects_the_cards() -> None:
    node = NodeInventory("n", (GpuDevice("n-g0", 0, "A10", 24576), GpuDevice("n-g1", 1, "H100", GPU_MEM)))
    fit = _fit(_state(node), "n", make_info(annotations={"vgpu.io/use-gpu-models": "H100"}, gpumem=1000))
    assert isinstance(fit, NodePlacement) and fit.containers[0].devices[0].uuid == "n-g1"


@pytest.mark.parametrize(
    ("held", "pod", "reason"),
    [
        ([(0, GPU_MEM, 10)], make_info(gpumem=1000), "GPU memory full on 1"),
        ([(0, 1000, 100)], make_info(gpumem=1000, gpucores=10), "SM quota full on 1"),
        (
            [(0, 1000, 0)],
            make_info(role="prefill", gpumem=1000, gpucores=10),
            "would oversubscribe SMs of a prefill GPU on 1",
        ),
    ],
)
def test_full_gpus_are_resolvable_failures(held: list[tuple[int, int, int]], pod: PodInfo, reason: str) -> None:
    s = _state(make_node("n", 1))
    s.apply("ns/holder", make_assignment("n", held))
    fit = _fit(s, "n", pod)
    assert isinstance(fit, FitFailure) and not fit.unresolvable
    assert reason in fit.reason and "0 of 1 GPUs can host one" in fit.reason


def test_sharer_limit_and_decode_budget_reasons() -> None:
    s = _state(make_node("n", 2, split=1))
    s.apply("ns/a", make_assignment("n", [(0, 10, 10)]))
    for i in range(4):
        s.apply(f"ns/d{i}", make_assignment("m", [(0, 10, 10)], role=Role.DECODE))  # orphans: node m unknown
    s.upsert_node(make_node("m", 1))
    assert isinstance(_fit(s, "n", make_info(gpumem=10)), NodePlacement)
    fit = _fit(s, "n", make_info(gpu=2, gpumem=10))
    assert isinstance(fit, FitFailure) and "sharer limit reached on 1" in fit.reason
    fit = _fit(s, "m", make_info(role="decode", gpumem=10))
    assert isinstance(fit, FitFailure) and "decode bandwidth budget reached on 1" in fit.reason


def test_host_resources_are_checked_when_tracked() -> None:
    s = _state(make_node("n", 1, cpu_milli=4000, host_memory_mib=8192))
    s.apply("ns/a", make_assignment("n", [(0, 10, 10)]), HostUse(3000, 4096))
    pod = make_info(gpumem=10)
    big_cpu = dataclasses.replace(pod, cpu_milli=2000)
    fit = _fit(s, "n", big_cpu)
    assert isinstance(fit, FitFailure) and "insufficient cpu (3000+2000 > 4000 millicores)" in fit.reason
    big_mem = dataclasses.replace(pod, memory_mib=5000)
    fit = _fit(s, "n", big_mem)
    assert isinstance(fit, FitFailure) and "insufficient memory" in fit.reason


def test_a_pod_without_vgpus_fits_anywhere_with_no_slices() -> None:
    s = _state(make_node("n", 0))
    fit = _fit(s, "n", make_info(containers=[{"name": "c"}]))
    assert fit == NodePlacement("n", ())
