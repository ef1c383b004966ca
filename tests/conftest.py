"""Builders shared by the unit tests: small pods, nodes and assignments in the shapes the core reads.

Test modules import these directly (`from tests.conftest import ...`); they are plain functions so that
`pytest.mark.parametrize` tables can call them.

Also the Hypothesis profile every property test runs under (below).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from _pytest.logging import LogCaptureHandler
from hypothesis import HealthCheck, settings

from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.pod import PodInfo, pod_info
from vgpu.roles import Role
from vgpu.state import ClusterState

# Hypothesis's defaults fail a test by the wall clock: an example slower than 200 ms (`deadline`) or slow data
# generation (HealthCheck.too_slow). On a loaded 2-core CI machine a GC pause or a preempted thread crosses
# either, and the replay that follows is fast, so the run ends in FlakyFailure for code that is correct.
# Speed is measured in benchmarks/, not here: no property test is failed by time. A test's own @settings
# still sets max_examples and the rest, inheriting these.
# Derandomized: every run (CI, a newcomer's first `make test`) tries the same examples, so a result is reproducible
# and a merge is never refused by a draw. HYPOTHESIS_PROFILE=kube-vgpu-explore draws new examples each run: use it
# when changing a property test or the code under one, and to hunt.
settings.register_profile(
    "kube-vgpu", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True, derandomize=True
)
settings.register_profile("kube-vgpu-explore", settings.get_profile("kube-vgpu"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "kube-vgpu"))


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """Each test leaves the root logger's handlers and level as it found them. A command's main run in-process
    (vgpu_cli, the webhook's serve) replaces them with one handler on the sys.stderr of that moment - capsys's,
    closed when the test ends - so every later record, from any test or a daemon thread, printed "--- Logging
    error --- ValueError: I/O operation on closed file", and the level it set leaked into the tests after it.
    pytest's own per-phase capture handlers are left to pytest: the setup phase's are gone, the teardown phase's
    are removed by pytest when it ends."""
    root = logging.getLogger()
    handlers, level = [h for h in root.handlers if not isinstance(h, LogCaptureHandler)], root.level
    yield
    root.handlers[:] = handlers + [h for h in root.handlers if isinstance(h, LogCaptureHandler)]
    root.level = level


GPU_MEM = 81920  # an 80 GiB card


def make_node(
    name: str,
    gpus: int = 2,
    *,
    memory_mib: int = GPU_MEM,
    model: str = "H100",
    split: int = 10,
    unhealthy: tuple[int, ...] = (),
    cpu_milli: int = 0,
    host_memory_mib: int = 0,
) -> NodeInventory:
    """A node of identical GPUs with uuids `<name>-g<i>`."""
    return NodeInventory(
        name=name,
        gpus=tuple(
            GpuDevice(
                uuid=f"{name}-g{i}",
                index=i,
                model=model,
                memory_mib=memory_mib,
                split_count=split,
                healthy=i not in unhealthy,
            )
            for i in range(gpus)
        ),
        cpu_milli=cpu_milli,
        memory_mib=host_memory_mib,
    )


def make_container(name: str = "main", *, requests: dict[str, Any] | None = None, **limits: Any) -> dict[str, Any]:
    """A container whose limits use short names: gpu, gpumem, gpumem_percentage, gpucores, priority."""
    full = {f"nvidia.com/{k.replace('_', '-')}": v for k, v in limits.items()}
    resources: dict[str, Any] = {"limits": full}
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "vllm/vllm-openai:latest", "resources": resources}


def make_pod(
    name: str = "p",
    containers: list[dict[str, Any]] | None = None,
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers if containers is not None else [make_container(gpu=1)]}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
    }


def make_info(
    name: str = "p",
    *,
    role: str | None = None,
    model: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
    **limits: Any,
) -> PodInfo:
    """PodInfo of a one-container pod (limits as in make_container) with an optional llm-d role/model."""
    labels: dict[str, str] = {}
    if role is not None:
        labels["llm-d.ai/role"] = role
    if model is not None:
        labels["llm-d.ai/model"] = model
    if containers is None:
        containers = [make_container(**(limits or {"gpu": 1}))]
    return pod_info(make_pod(name, containers, namespace=namespace, labels=labels, annotations=annotations))


def make_assignment(
    node: str,
    slices: list[tuple[int, int, int]],
    *,
    role: Role = Role.PREFILL_DECODE,
    model: str | None = None,
    container: str = "main",
) -> Assignment:
    """One container holding (gpu index, memory MiB, cores) slices of `node`'s GPUs (uuids as make_node)."""
    devices = tuple(DeviceSlice(uuid=f"{node}-g{i}", index=i, memory_mib=m, cores=c) for i, m, c in slices)
    return Assignment(node=node, containers=(ContainerAssignment(container, devices),), role=role, model=model)


def assert_invariants(state: ClusterState) -> None:
    """The hard limits and the bookkeeping every ClusterState must keep, whatever happened to it."""
    cfg = state.config
    rules = cfg.roles
    for name, node in state.nodes.items():
        for u in node.gpus:
            d, hs = u.device, u.holders
            where = f"{name}/{d.uuid}"
            assert u.sharers <= d.split_count, f"{where}: split"
            assert u.memory_used <= int(d.memory_mib * cfg.memory_scaling), f"{where}: memory"
            assert u.cores_used <= int(d.cores * cfg.core_scaling), f"{where}: cores"
            if rules.protect_prefill_sms and u.prefill:
                assert u.cores_used <= d.cores, f"{where}: SMs oversubscribed on a prefill GPU"
                assert u.best_effort == 0 or u.sharers == 1, f"{where}: best-effort slice next to a prefill"
            assert u.decode <= rules.max_decode_per_gpu, f"{where}: decode budget"
            assert u.memory_used == sum(h.memory_mib for h in hs)
            assert u.cores_used == sum(h.cores for h in hs)
            assert u.prefill == sum(h.role.does_prefill for h in hs)
            assert u.decode == sum(h.role.does_decode for h in hs)
            assert u.best_effort == sum(h.cores == 0 for h in hs)
            assert {h.pod_key for h in hs} <= node.pods.keys()
        for key, a in node.pods.items():
            assert state.assignments.get(key) == a and a.node == name
        assert node.role_models == Counter((a.role, a.model) for a in node.pods.values())
    assert not state.assignments.keys() & state.orphans.keys()
    assert state.conflicts.keys() <= state.orphans.keys()
    for key, a in state.orphans.items():
        assert a.node not in state.nodes or key in state.conflicts, f"{key}: orphan although its node is known"
    placed = [s for a in state.assignments.values() for s in a.slices()]
    totals = state.totals()
    assert totals["pods"] == len(state.assignments) == sum(len(n.pods) for n in state.nodes.values())
    assert totals["slices"] == len(placed)
    assert totals["memory_used_mib"] == sum(s.memory_mib for s in placed)
    assert totals["cores_used"] == sum(s.cores for s in placed)
