"""Pod identity for Allocate: the right pod or a refusal, never another pod's slice."""

from __future__ import annotations

import dataclasses

import pytest

from device_plugin.matching import MatchError, holding, match, pending_containers, preferred
from device_plugin.pods import KubeletView, PodRecord
from vgpu.annotations import Assignment, BindPhase, ContainerAssignment, DeviceSlice

NODE = "n1"
GPUS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]


def pod(
    name: str, *containers: tuple[str, list[int]], phase: BindPhase = BindPhase.ALLOCATING, **kw: object
) -> PodRecord:
    cas = tuple(
        ContainerAssignment(cname, tuple(DeviceSlice(GPUS[g], g, 1000 * (g + 1), 10) for g in gpus))
        for cname, gpus in containers
    )
    return PodRecord(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        node=NODE,
        bind_phase=phase,
        bind_time=str(kw.pop("bind_time", name)),
        assignment=Assignment(node=NODE, containers=cas),
        **kw,  # type: ignore[arg-type]
    )


def ids(*gpus: int) -> list[str]:
    return [f"{GPUS[g]}::3" for g in gpus]


def known(*names: str, devices: dict[tuple[str, str], tuple[str, ...]] | None = None) -> KubeletView:
    return KubeletView(pods=frozenset(f"ns/{n}" for n in names), devices=devices or {})


def test_kubelet_view_picks_the_admitting_pod_among_many_pending() -> None:
    pods = [pod(f"p{i}", ("c", [i % 4])) for i in range(20)]
    got = match(ids(1), pods, node=NODE, kubelet=known("p5"), served=set())
    assert got.pod.name == "p5"


def test_without_kubelet_view_many_pending_is_refused() -> None:
    pods = [pod("a", ("c", [0])), pod("b", ("c", [1]))]
    with pytest.raises(MatchError, match="ambiguous"):
        match(ids(0), pods, node=NODE, kubelet=None, served=set())


def test_single_pending_pod_without_kubelet_view_is_served() -> None:
    assert match(ids(2), [pod("a", ("c", [2]))], node=NODE, kubelet=None, served=set()).pod.name == "a"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (pod("x", ("c", [0]), phase=BindPhase.ALLOCATED), "already allocated"),
        (pod("x", ("c", [0]), phase=BindPhase.FAILED), "failed bind"),
        (pod("x", ("c", [0]), deleting=True), "being deleted"),
        (pod("x", ("c", [0]), phase="Failed"), "terminal"),
    ],
)
def test_pods_not_in_allocating_are_never_candidates(record: PodRecord, reason: str) -> None:
    with pytest.raises(MatchError, match="no pod"):
        match(ids(0), [record], node=NODE, kubelet=None, served=set())


def test_physical_set_mismatch_is_refused_not_served() -> None:
    with pytest.raises(MatchError, match="kubelet picked"):
        match(ids(3), [pod("a", ("c", [0]))], node=NODE, kubelet=known("a"), served=set())


def test_two_vgpus_on_one_gpu_are_refused() -> None:
    with pytest.raises(MatchError, match="same GPU"):
        match([f"{GPUS[0]}::1", f"{GPUS[0]}::2"], [pod("a", ("c", [0, 1]))], node=NODE, kubelet=None, served=set())


def test_containers_are_matched_in_spec_order_and_skip_served_ones() -> None:
    p = pod("a", ("first", [0]), ("second", [1]))
    assert match(ids(0), [p], node=NODE, kubelet=known("a"), served=set()).container.name == "first"
    # served by us (in memory) or visible in PodResources: the next container is the one
    assert match(ids(1), [p], node=NODE, kubelet=known("a"), served={("uid-a", "first")}).container.name == "second"
    view = known("a", devices={("ns/a", "first"): ("x::0",)})
    assert match(ids(1), [p], node=NODE, kubelet=view, served=set()).container.name == "second"
    with pytest.raises(MatchError, match="kubelet picked"):
        match(ids(0), [p], node=NODE, kubelet=view, served=set())


def test_view_that_hides_the_admitting_pod_falls_back_to_unique_only() -> None:
    pods = [pod("a", ("c", [0]))]
    assert match(ids(0), pods, node=NODE, kubelet=known(), served=set()).pod.name == "a"
    pods.append(pod("b", ("c", [0])))
    with pytest.raises(MatchError, match="ambiguous"):
        match(ids(0), pods, node=NODE, kubelet=known(), served=set())


def test_pods_of_other_nodes_and_without_assignment_are_ignored() -> None:
    other = PodRecord(
        "ns",
        "o",
        "uid-o",
        "n2",
        bind_phase=BindPhase.ALLOCATING,
        assignment=Assignment(node="n2", containers=(ContainerAssignment("c", (DeviceSlice(GPUS[0], 0, 1, 1),)),)),
    )
    bare = PodRecord("ns", "b", "uid-b", NODE, bind_phase=BindPhase.ALLOCATING)
    assert pending_containers([other, bare], node=NODE, kubelet=None, served=set()) == []


@pytest.mark.parametrize(
    ("available", "must", "size", "want"),
    [
        ([f"{GPUS[g]}::{n}" for g in range(4) for n in range(3)], [], 2, [f"{GPUS[2]}::0", f"{GPUS[0]}::0"]),
        ([f"{GPUS[2]}::1", f"{GPUS[0]}::2", f"{GPUS[1]}::0"], [], 2, [f"{GPUS[2]}::1", f"{GPUS[0]}::2"]),
        ([f"{GPUS[1]}::0", f"{GPUS[0]}::0"], [], 2, []),  # GPU 2 has no free replica: no preference
        ([f"{GPUS[g]}::0" for g in range(4)], [f"{GPUS[3]}::0"], 2, []),  # must-include outside the assignment
    ],
)
def test_preferred_steers_to_assigned_gpus_in_assignment_order(
    available: list[str], must: list[str], size: int, want: list[str]
) -> None:
    pods = [pod("a", ("c", [2, 0])), pod("z", ("c", [1, 3]))]
    assert preferred(available, must, size, pods, node=NODE, kubelet=known("a"), served=set()) == want


def test_preferred_gives_no_opinion_when_ambiguous() -> None:
    pods = [pod("a", ("c", [0])), pod("b", ("c", [1]))]
    assert preferred([f"{g}::0" for g in GPUS], [], 1, pods, node=NODE, kubelet=None, served=set()) == []


def test_holding_counts_allocated_served_and_kubelet_held_pods_only() -> None:
    allocated = pod("alloc", ("c", [0]), phase=BindPhase.ALLOCATED)
    served = pod("served", ("c", [1]))
    in_kubelet = pod("kubelet", ("c", [2]))
    pending = pod("pending", ("c", [3]))  # reserved by the extender, not yet admitted: not holding
    done = dataclasses.replace(pod("done", ("c", [0]), phase=BindPhase.ALLOCATED), phase="Succeeded")
    deleting = pod("deleting", ("c", [0]), phase=BindPhase.ALLOCATED, deleting=True)  # still running
    me = pod("me", ("c", [0]), phase=BindPhase.ALLOCATED)  # the pod being vetted is not its own holder
    pods = [allocated, served, in_kubelet, pending, done, deleting, me]
    view = known(devices={("ns/kubelet", "c"): ("x::0",)})
    got = holding(pods, node=NODE, kubelet=view, served={("uid-served", "c")}, exclude_uid="uid-me")
    assert sorted(h.pod for h in got) == ["ns/alloc", "ns/deleting", "ns/kubelet", "ns/served"]
