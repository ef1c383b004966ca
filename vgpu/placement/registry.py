"""Every placement policy by name; the extender, the CLI and the benchmarks look policies up here.

Experiment variants (earlier defaults kept so docs/packing.md's comparisons can be rerun) resolve like any
other name, but are not production values: `production_names()` is what the extender and the chart offer,
`names()` is what the replay benchmarks may use. A pod's own `vgpu.io/node-policy` is held to the production
names too (`check_pod_overrides`): a user cannot pick an experiment by annotation.
"""

from __future__ import annotations

from collections.abc import Callable

from vgpu.annotations import POD_GPU_POLICY, POD_NODE_POLICY, PodOverrides
from vgpu.errors import UnknownPolicyError
from vgpu.placement import bestfit, binpack, dotprod, fgd, fragaware, gpu_clustering, gpu_packing, randomfit, spread
from vgpu.placement.base import NodePolicy

_FACTORIES: dict[str, Callable[[], NodePolicy]] = {
    "binpack": binpack.create,
    "spread": spread.create,
    # The FGD paper's baselines and FGD itself (docs/packing.md).
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
    # The extender's default: FGD against the online-learned workload (docs/packing.md).
    "default": fragaware.create,
}
# Earlier defaults, for the benchmarks only (docs/packing.md measures the current default against them).
EXPERIMENTAL = frozenset({"fragaware-wg100", "fragaware-s2000", "fragaware-gpusteps"})
# GPU-level policies order GPUs inside the chosen node.
GPU_POLICIES = ("binpack", "spread")


def register(name: str, factory: Callable[[], NodePolicy]) -> None:
    _FACTORIES[name] = factory


def names() -> list[str]:
    return sorted(_FACTORIES)


def production_names() -> list[str]:
    """The names a cluster may be configured with (`--node-policy`, the chart's `extender.nodePolicy`)."""
    return [n for n in names() if n not in EXPERIMENTAL]


def check_production(name: str) -> str:
    """`name` if a cluster may use it; else UnknownPolicyError naming the allowed values."""
    if name in EXPERIMENTAL:
        raise UnknownPolicyError(
            f"placement policy {name!r} is a benchmark experiment, not a production policy; "
            f"allowed: {', '.join(production_names())}"
        )
    if name not in _FACTORIES:
        raise UnknownPolicyError(f"unknown placement policy {name!r}; allowed: {', '.join(production_names())}")
    return name


def create(name: str) -> NodePolicy:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown placement policy {name!r}; known: {', '.join(names())}") from None
    return factory()


def check_pod_overrides(overrides: PodOverrides, *, experimental: bool = False) -> None:
    """A pod's policy annotations name a production node policy and a GPU policy; UnknownPolicyError naming the
    annotation and the allowed values otherwise. `experimental` (PlacementConfig.experimental_policies, which only
    the replay benchmarks set) also lets the node policy be an experiment."""
    if overrides.node_policy is not None:
        try:
            if experimental:
                create(overrides.node_policy)
            else:
                check_production(overrides.node_policy)
        except UnknownPolicyError as exc:
            raise UnknownPolicyError(f"annotation {POD_NODE_POLICY}: {exc}") from None
    if overrides.gpu_policy is not None and overrides.gpu_policy not in GPU_POLICIES:
        raise UnknownPolicyError(
            f"annotation {POD_GPU_POLICY}: unknown GPU policy {overrides.gpu_policy!r}; allowed: {', '.join(GPU_POLICIES)}"
        )
