"""Builders shared by the unit tests: small pods, nodes and assignments in the shapes the core reads.

Test modules import these directly (`from tests.conftest import ...`); they are plain functions so that
`pytest.mark.parametrize` tables can call them.
"""

from __future__ import annotations

from typing import Any

from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.pod import PodInfo, pod_info
from vgpu.roles import Role

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
    slices: list[tuple[str, int, int]],
    *,
    role: Role = Role.PREFILL_DECODE,
    model: str | None = None,
    container: str = "main",
) -> Assignment:
    """One container holding (gpu index, memory MiB, cores) slices of `node`'s GPUs (uuids as make_node)."""
    devices = tuple(DeviceSlice(uuid=f"{node}-g{i}", index=i, memory_mib=m, cores=c) for i, m, c in slices)
    return Assignment(node=node, containers=(ContainerAssignment(container, devices),), role=role, model=model)
