"""vgpu.assignment_check: an assignment is served only if the extender could have written it for this pod."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.assignment_check import (
    AssignmentRefused,
    Held,
    NodeGpus,
    check_assignment,
    is_dns1123_label,
    is_pod_uid,
)
from vgpu.config import PlacementConfig, ResourceNames
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import NodePlacement, fit_node
from vgpu.pod import pod_info
from vgpu.state import NodeState

NODE = "gpu-1"
UID = "0b0c3f8e-2a54-4c1e-9a43-7d2b0f5e6a11"
G = [GpuDevice(f"GPU-{i}0000000-0000-0000-0000-000000000000", i, "H100", 81920) for i in range(4)]
GPUS = {g.uuid: g for g in G}


def node(unhealthy: dict[str, str] | None = None) -> NodeGpus:
    return NodeGpus(node=NODE, gpus=GPUS, unhealthy=unhealthy or {})


def spec(*containers: tuple[str, dict[str, str]], init: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [{"name": n, "resources": {"limits": limits}} for n, limits in containers],
            "initContainers": [{"name": n} for n in init],
        }
    }


def one(name: str, *slices: tuple[int, int, int]) -> ContainerAssignment:
    return ContainerAssignment(name, tuple(DeviceSlice(G[g].uuid, g, mem, cores) for g, mem, cores in slices))


def assignment(*containers: ContainerAssignment, on: str = NODE) -> Assignment:
    return Assignment(node=on, containers=containers)


VLLM = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "30"}
GOOD = assignment(one("vllm", (0, 20480, 30), (1, 20480, 30)))
POD = spec(("vllm", VLLM), ("sidecar", {}))


def refused(a: Assignment, pod_spec: dict[str, Any], *, held: tuple[Held, ...] = (), **kw: Any) -> str:
    with pytest.raises(AssignmentRefused) as info:
        check_assignment(
            a, pod_spec, pod="team/p", pod_uid=kw.pop("uid", UID), node=kw.pop("node", node()), held=held, **kw
        )
    msg = str(info.value)
    assert msg.startswith("pod team/p")
    return msg


def test_a_consistent_assignment_passes() -> None:
    check_assignment(GOOD, POD, pod="team/p", pod_uid=UID, node=node(), held=())


def test_percentage_memory_and_proportional_cores_resolve_per_gpu() -> None:
    pod = spec(("c", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}))
    check_assignment(
        assignment(one("c", (2, 20480, 25))), pod, pod="team/p", pod_uid=UID, node=node(), held=()
    )  # 25 % of 81920 MiB, cores in proportion
    assert "resolve to 25% there (cores in proportion" in refused(assignment(one("c", (2, 20480, 0))), pod)
    whole = spec(("c", {"nvidia.com/gpu": "1"}))  # defaults: the whole card
    check_assignment(assignment(one("c", (3, 81920, 100))), whole, pod="team/p", pod_uid=UID, node=node(), held=())


@pytest.mark.parametrize(
    ("a", "want"),
    [
        (
            assignment(one("vllm", (0, 20480, 30))),
            "container 'vllm': the assignment gives 1 device(s) but the container requests 2 vGPU(s) "
            "(nvidia.com/gpu=2)",
        ),
        (
            assignment(one("vllm", (0, 81920, 30), (1, 20480, 30))),
            f"container 'vllm': the assignment gives 81920 MiB on GPU {G[0].uuid} but the container's requests "
            "resolve to 20480 MiB there (nvidia.com/gpumem=20480)",
        ),
        (
            assignment(one("vllm", (0, 20480, 30), (1, 20480, 100))),
            f"container 'vllm': the assignment gives 100% cores on GPU {G[1].uuid} but the container's requests "
            "resolve to 30% there (nvidia.com/gpucores=30)",
        ),
        (
            assignment(one("vllm", (0, 20480, 30), (1, 20480, 30)), one("ghost", (2, 1024, 0))),
            "container 'ghost': the assignment names not a container of the pod (the pod's containers: vllm, sidecar)",
        ),
        (
            assignment(one("vllm", (0, 20480, 30), (1, 20480, 30)), one("sidecar", (2, 1024, 0))),
            "container 'sidecar': the container requests no vGPU (nvidia.com/gpu) but the assignment gives it 1 "
            "device(s)",
        ),
        (assignment(), "container 'vllm': the container requests 2 vGPU(s) but the assignment has no entry for it"),
    ],
    ids=["wrong-count", "more-memory", "more-cores", "unknown-container", "extra-container", "missing-container"],
)
def test_an_assignment_inconsistent_with_the_pod_spec_is_refused(a: Assignment, want: str) -> None:
    assert refused(a, POD) == f"pod team/p {want}"


def test_init_containers_order_and_invalid_requests_are_refused() -> None:
    pod = spec(("a", {"nvidia.com/gpu": "1"}), ("b", {"nvidia.com/gpu": "1"}), init=("setup",))
    a_then_b = [one("a", (0, 81920, 100)), one("b", (1, 81920, 100))]
    check_assignment(assignment(*a_then_b), pod, pod="team/p", pod_uid=UID, node=node(), held=())
    assert "the assignment lists containers ['b', 'a']; the pod spec asks in the order ['a', 'b']" in refused(
        assignment(*reversed(a_then_b)), pod
    )
    assert "names an init container" in refused(assignment(*a_then_b, one("setup", (2, 1, 0))), pod)
    bad = spec(("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20Gi"}))
    assert "the pod's vGPU requests are invalid" in refused(assignment(one("a", (0, 81920, 100))), bad)


@pytest.mark.parametrize(
    "name",
    ["x/../../../../../../../../../etc", "..", "a/b", "Main", "-x", "x" * 64, "", "a\x00b", "é", "a b", "a_b"],
)
def test_container_names_that_are_not_dns1123_labels_are_refused_first(name: str) -> None:
    a = assignment(one(name, (0, 20480, 30), (1, 20480, 30)))
    msg = refused(a, spec((name, VLLM)))  # even when the spec "agrees": the apiserver would never allow it
    assert "is not a DNS-1123 label" in msg
    assert not is_dns1123_label(name)


def test_traversal_name_message_is_exact_and_bounded() -> None:
    a = assignment(one("x/../../../../../../../../../etc", (0, 20480, 30)))
    assert refused(a, POD) == (
        "pod team/p container 'x/../../../../../../../../../etc': the assignment's container name is not a "
        "DNS-1123 label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters)"
    )
    long = assignment(one("/" * 10_000, (0, 20480, 30)))
    assert len(refused(long, POD)) < 300


@pytest.mark.parametrize("uid", ["", "../../etc", UID.upper(), UID + "/..", "uid-1"])
def test_a_pod_uid_that_is_not_a_uuid_is_refused(uid: str) -> None:
    assert "is not a UUID" in refused(GOOD, POD, uid=uid)
    assert not is_pod_uid(uid)


def test_duplicate_container_is_refused() -> None:
    a = assignment(one("vllm", (0, 20480, 30), (1, 20480, 30)), one("vllm", (2, 20480, 30), (3, 20480, 30)))
    assert "lists this container twice" in refused(a, POD)


def test_a_foreign_gpu_is_refused() -> None:
    a = Assignment(NODE, (ContainerAssignment("vllm", (DeviceSlice("GPU-elsewhere", 0, 20480, 30),)),))
    msg = refused(a, POD)
    assert msg.startswith(f"pod team/p container 'vllm': GPU 'GPU-elsewhere' is not a GPU of node {NODE}")
    assert G[0].uuid in msg  # lists what this node has


def test_an_unhealthy_gpu_is_refused() -> None:
    msg = refused(GOOD, POD, node=node({G[1].uuid: "XID 79"}))
    assert msg == f"pod team/p container 'vllm': GPU {G[1].uuid} is unhealthy (XID 79)"


def test_another_node_and_a_wrong_index_are_refused() -> None:
    other = Assignment("gpu-2", GOOD.containers)
    assert refused(other, POD) == f"pod team/p: the assignment is for node 'gpu-2', this is node {NODE}"
    wrong = assignment(ContainerAssignment("vllm", (DeviceSlice(G[0].uuid, 3, 20480, 30), GOOD.slices()[1])))
    assert "index 3; on this node it is index 0" in refused(wrong, POD)


def held(pod: str, *slices: tuple[int, int, int]) -> Held:
    return Held(pod, assignment(one("c", *slices)))


def test_over_commit_by_two_assignments_is_refused() -> None:
    first = held("team/first", (0, 70000, 30))
    msg = refused(GOOD, POD, held=(first,))
    assert msg == (
        f"pod team/p container 'vllm': GPU {G[0].uuid} would be over-committed: memory 70000 + 20480 MiB > "
        "81920 MiB (already held by 1 slice(s) of team/first)"
    )
    check_assignment(GOOD, POD, pod="team/p", pod_uid=UID, node=node(), held=(held("team/f", (0, 61440, 70)),))


def test_over_commit_of_cores_and_split_is_refused() -> None:
    cores = refused(GOOD, POD, held=(held("team/a", (1, 1024, 50)), held("team/b", (1, 1024, 21))))
    assert f"GPU {G[1].uuid} would be over-committed: cores 71 + 30% > 100%" in cores
    assert "2 slice(s) of team/a, team/b" in cores
    ten = tuple(held(f"team/s{i}", (0, 1, 0)) for i in range(10))
    assert "10 + 1 slices > split count 10" in refused(GOOD, POD, held=ten)
    nine = ten[:9]
    check_assignment(GOOD, POD, pod="team/p", pod_uid=UID, node=node(), held=nine)


def test_a_pods_own_containers_count_against_each_other() -> None:
    pod = spec(*((n, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000", "nvidia.com/gpucores": "10"}) for n in "ab"))
    a = assignment(one("a", (0, 50000, 10)), one("b", (0, 50000, 10)))
    msg = refused(a, pod)
    assert msg.startswith("pod team/p container 'b': GPU") and "memory 50000 + 50000 MiB" in msg
    assert "1 slice(s) of team/p" in msg


def test_configured_resource_names_are_used() -> None:
    names = ResourceNames("example.com/vgpu", "example.com/mem", "example.com/mem-pct", "example.com/cores")
    pod = spec(("c", {"example.com/vgpu": "1", "example.com/mem": "1024", "example.com/cores": "5"}))
    a = assignment(one("c", (0, 1024, 5)))
    check_assignment(a, pod, pod="team/p", pod_uid=UID, node=node(), held=(), names=names)
    assert "(example.com/mem=1024)" in refused(assignment(one("c", (0, 2048, 5))), pod, names=names)


# --- one implementation: whatever the extender's placement writes passes ----------------------------------

LIMITS = st.fixed_dictionaries(
    {"nvidia.com/gpu": st.integers(1, 3).map(str)},
    optional={
        "nvidia.com/gpumem": st.integers(1, 40000).map(str),
        "nvidia.com/gpucores": st.integers(0, 100).map(str),
    },
) | st.fixed_dictionaries(
    {"nvidia.com/gpu": st.integers(1, 3).map(str), "nvidia.com/gpumem-percentage": st.integers(1, 100).map(str)}
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c", "main", "side-car"]), LIMITS | st.just({})), max_size=4),
    st.sampled_from([G, [*G[:2], GpuDevice("GPU-l4", 2, "L4", 23034)]]),
)
def test_every_assignment_the_extender_places_passes(containers: list[tuple[str, dict[str, str]]], gpus: Any) -> None:
    unique = list(dict(containers).items())
    pod = {"metadata": {"namespace": "team", "name": "p", "uid": UID}, **spec(*unique)}
    info = pod_info(pod)
    placed = fit_node(NodeState.of(NodeInventory(NODE, tuple(gpus))), info, PlacementConfig(), lambda *_: 0.0)
    assume(isinstance(placed, NodePlacement))  # hypothesis fails the test if too few examples place
    assert isinstance(placed, NodePlacement)
    a = placed.assignment(info)
    n = NodeGpus(node=NODE, gpus={g.uuid: g for g in gpus}, unhealthy={})
    check_assignment(a, pod, pod="team/p", pod_uid=UID, node=n, held=())
    if a.containers:  # and one MiB or one % more than the requests resolve to is refused
        c, d = a.containers[0], a.containers[0].devices[0]
        for bigger in (replace(d, memory_mib=d.memory_mib + 1), replace(d, cores=d.cores + 1)):
            forged = replace(a, containers=(replace(c, devices=(bigger, *c.devices[1:])), *a.containers[1:]))
            with pytest.raises(AssignmentRefused, match="the container's requests resolve to"):
                check_assignment(forged, pod, pod="team/p", pod_uid=UID, node=n, held=())
