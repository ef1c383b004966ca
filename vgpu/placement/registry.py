"""Every placement policy by name; the extender, the CLI and the benchmarks look policies up here."""

from __future__ import annotations

from collections.abc import Callable

from vgpu.errors import UnknownPolicyError
from vgpu.placement import bestfit, binpack, dotprod, fgd, fragaware, gpu_clustering, gpu_packing, randomfit, spread
from vgpu.placement.base import NodePolicy

_FACTORIES: dict[str, Callable[[], NodePolicy]] = {
    "binpack": binpack.create,
    "spread": spread.create,
    # The FGD paper's baselines and FGD itself (issue 6; docs/packing.md).
    "random": randomfit.create,
    "dotprod": dotprod.create,
    "gpu-clustering": gpu_clustering.create,
    "gpu-packing": gpu_packing.create,
    "bestfit": bestfit.create,
    "fgd": fgd.create,
    "fragaware": fragaware.create,
    "fragaware-wg100": fragaware.create_wg100,  # the default before the whole-GPU weight
    "fragaware-s2000": fragaware.create_s2000,  # the default before the workload-dependent step width
    "fragaware-gpusteps": fragaware.create_gpusteps,  # the default before the exact GPU choice in the node
    # The extender's default: FGD against the online-learned workload (issue 6, docs/packing.md).
    "default": fragaware.create,
}
# GPU-level policies order GPUs inside the chosen node.
GPU_POLICIES = ("binpack", "spread")


def register(name: str, factory: Callable[[], NodePolicy]) -> None:
    _FACTORIES[name] = factory


def names() -> list[str]:
    return sorted(_FACTORIES)


def create(name: str) -> NodePolicy:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown placement policy {name!r}; known: {', '.join(names())}") from None
    return factory()
