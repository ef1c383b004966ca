"""Per-container vGPU requests parsed from a pod spec's HAMi-compatible resources."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.config import RequestDefaults, ResourceNames
from vgpu.errors import RequestError
from vgpu.quantity import QuantityError, parse_int_quantity

MAX_VGPUS_PER_CONTAINER = 64
_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's ask: `count` slices, each on a different physical GPU.

    Exactly one of memory_mib / memory_percentage is set after defaults. cores is None for
    "proportional to the memory share", resolved per GPU at placement time.
    """

    container: str
    count: int
    memory_mib: int | None
    memory_percentage: int | None
    cores: int | None
    priority: int

    def memory_on(self, gpu_memory_mib: int) -> int:
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.memory_percentage is not None
        return gpu_memory_mib * self.memory_percentage // 100

    def cores_on(self, gpu_memory_mib: int) -> int:
        if self.cores is not None:
            return self.cores
        if gpu_memory_mib <= 0:
            return 100
        return min(100, -(-self.memory_on(gpu_memory_mib) * 100 // gpu_memory_mib))

    @property
    def shape(self) -> tuple[int, int | None, int | None, int | None]:
        return (self.count, self.memory_mib, self.memory_percentage, self.cores)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """All GPU-asking containers of a pod, in spec order (init containers excluded)."""

    containers: tuple[ContainerRequest, ...]

    @property
    def is_empty(self) -> bool:
        return not self.containers

    @property
    def total_vgpus(self) -> int:
        return sum(c.count for c in self.containers)

    @property
    def shape(self) -> tuple[tuple[int, int | None, int | None, int | None], ...]:
        return tuple(c.shape for c in self.containers)


def _resources(container: Mapping[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        return {}
    merged: dict[str, Any] = {}
    for section in ("requests", "limits"):  # limits win, as HAMi reads them
        values = res.get(section) or {}
        if isinstance(values, Mapping):
            merged.update(values)
    return merged


def _get_int(
    values: Mapping[str, Any], container: str, resource: str, lo: int, hi: int | None, allowed: str
) -> int | None:
    if resource not in values:
        return None
    raw = values[resource]
    try:
        value = parse_int_quantity(raw)
    except QuantityError as exc:
        raise RequestError(container=container, resource=resource, value=raw, allowed=f"{allowed} ({exc})") from None
    if value < lo or (hi is not None and value > hi):
        raise RequestError(container=container, resource=resource, value=raw, allowed=allowed)
    return value


def parse_container(
    container: Mapping[str, Any],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
) -> ContainerRequest | None:
    """Parse one container; None when it asks for no vGPU resource at all."""
    cname = str(container.get("name") or "<unnamed>")
    values = _resources(container)
    if not any(n in values for n in names.all()):
        return None
    count = _get_int(
        values,
        cname,
        names.count,
        0,
        MAX_VGPUS_PER_CONTAINER,
        f"an integer 1..{MAX_VGPUS_PER_CONTAINER}",
    )
    raw_mem = values.get(names.memory)
    if isinstance(raw_mem, str) and raw_mem.strip().endswith(_BINARY_SUFFIXES):
        # `gpumem: 20Gi` would read as 21474836480 MiB; HAMi's unit is MiB, so say so. Decimal suffixes
        # stay valid: the apiserver itself rewrites 20000 as "20k".
        raise RequestError(
            container=cname,
            resource=names.memory,
            value=raw_mem,
            allowed="a positive integer number of MiB without a binary unit suffix (e.g. 20480 for 20 GiB)",
        )
    mem = _get_int(values, cname, names.memory, 1, None, "a positive integer number of MiB")
    pct = _get_int(values, cname, names.memory_percentage, 1, 100, "an integer 1..100 (percent)")
    cores = _get_int(values, cname, names.cores, 0, 100, "an integer 0..100 (percent of SMs)")
    prio = _get_int(values, cname, names.priority, 0, 1, "0 (high) or 1 (low)")
    if mem is not None and pct is not None:
        raise RequestError(
            container=cname,
            resource=f"{names.memory}+{names.memory_percentage}",
            value={names.memory: values[names.memory], names.memory_percentage: values[names.memory_percentage]},
            allowed=f"only one of {names.memory} (MiB) or {names.memory_percentage} (percent)",
        )
    if count == 0:
        if mem is not None or pct is not None or cores is not None:
            raise RequestError(
                container=cname,
                resource=names.count,
                value=values[names.count],
                allowed=f"at least 1 when {names.memory}, {names.memory_percentage} or {names.cores} is set",
            )
        return None
    if count is None:
        count = defaults.count
    if mem is None and pct is None:
        pct = defaults.memory_percentage
    if cores is None and defaults.cores != "proportional":
        cores = int(defaults.cores)
    return ContainerRequest(
        container=cname,
        count=count,
        memory_mib=mem,
        memory_percentage=pct,
        cores=cores,
        priority=defaults.priority if prio is None else prio,
    )


def parse_pod_request(
    pod: Mapping[str, Any],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
) -> PodRequest:
    """Parse every app container of a pod (a Kubernetes Pod as a JSON-shaped mapping).

    Init containers that ask for vGPUs are rejected: their slices would be held by nobody once they
    exit, and HAMi's handling of them is a known source of leaks.
    """
    spec = pod.get("spec") or {}
    containers: Sequence[Any] = spec.get("containers") or []
    for init in spec.get("initContainers") or []:
        if isinstance(init, Mapping) and parse_container(init, names, defaults) is not None:
            raise RequestError(
                container=str(init.get("name") or "<unnamed>"),
                resource=names.count,
                value="(init container)",
                allowed="vGPU resources on app containers only",
            )
    parsed = [
        req for c in containers if isinstance(c, Mapping) and (req := parse_container(c, names, defaults)) is not None
    ]
    return PodRequest(containers=tuple(parsed))
