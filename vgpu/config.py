"""Domain-level settings shared by every service: resource names, request defaults, placement rules.

Defaults are explicit and documented in docs/resources.md; services load these from flags, env and
file (in that precedence) and pass them in — nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CoresDefault = Literal["proportional"] | int


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """Extended-resource names a pod uses to ask for slices (HAMi-compatible by default)."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"

    def all(self) -> tuple[str, ...]:
        return (self.count, self.memory, self.memory_percentage, self.cores, self.priority)


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """What an unspecified field means.

    - count: a container that names only gpumem/gpucores gets this many vGPUs.
    - memory_percentage: with neither gpumem nor gpumem-percentage, the slice takes this share of the
      card's memory (100 = the whole card, as users of `nvidia.com/gpu: 1` expect).
    - cores: with no gpucores, "proportional" reserves the same share of SMs as of memory (rounded
      up), so `nvidia.com/gpu: 1` alone is an exclusive GPU; an int reserves that fixed percentage
      (0 = best effort: no SM reservation and no SM limit).
    - priority: 0 high (latency-critical), 1 low.
    """

    count: int = 1
    memory_percentage: int = 100
    cores: CoresDefault = "proportional"
    priority: int = 1


@dataclass(frozen=True, slots=True)
class RoleRules:
    """Hard role rules and the weights of the role-aware score (docs/architecture.md, placement pipeline; measured in docs/pd-packing.md)."""

    # Hard: a GPU holding a prefill slice never has more than 100 % of SMs reserved, and every slice
    # on it has a real SM reservation (a best-effort neighbour would steal a compute-bound prefill's SMs).
    protect_prefill_sms: bool = True
    # Hard: decode slices per GPU (None: no limit); a coarse cap kept next to the bandwidth budget.
    max_decode_per_gpu: int | None = 4
    # Hard: the memory bandwidth decode slices of one GPU demand together, as a share of the GPU's
    # (None: no limit). MPS and green contexts partition SMs, not bandwidth. A decode slice of c % SMs
    # demands decode_mbu * min(1, c / decode_sat_cores) (0 cores = best effort: the full decode_mbu);
    # vgpu/perf/params.py gives the sources (MBU ~0.6; decode saturates at 20-50 % of SMs).
    decode_bandwidth_budget: float | None = 1.0
    decode_mbu: float = 0.6
    decode_sat_cores: int = 35
    # Soft (score, each 0..1 before weighting). Locality 0.5: measured in docs/pd-packing.md, 0.15 lost
    # to fragaware's score and paired P/D on a node for only ~70 % of prefills; above 0.5 nothing changes.
    complementarity_weight: float = 0.25
    locality_weight: float = 0.5
    # A node already holding the pod's own pool (same model, any P/D role): keeps a deployment together
    # while its counterpart has not arrived yet, so the counterpart later finds one node holding them.
    pool_weight: float = 0.25
    # A P/D pod scores headroom_weight * min(1, free GPU-equivalents left on the node after it /
    # pair_headroom_gpus): room for the counterparts that will join it (a decode's 2-4 prefills are
    # 1.2-4 GPU-equivalents; a prefill's decode 0.3-1.4). Below locality and pool, it mostly orders nodes
    # that tie on them. Measured in docs/pd-packing.md (with the decode locality rule of role_score):
    # same-node pairing 86.8 % -> 93.4 %; 0.25 paired more (95 %) for 1 GPU more and a little less goodput.
    headroom_weight: float = 0.15
    pair_headroom_gpus: float = 2.5
    prefill_pair_penalty: float = 0.5
    # Order GPUs inside a node by role first (vgpu.fit.role_rank), before the GPU policy's own order.
    gpu_role_order: bool = True

    def decode_demand(self, cores: int) -> float:
        """Share of a GPU's memory bandwidth one decode slice with `cores` % SMs consumes."""
        if cores <= 0:
            return self.decode_mbu
        return self.decode_mbu * min(1.0, cores / self.decode_sat_cores)

    @classmethod
    def off(cls) -> RoleRules:
        """No role rules at all: what a role-unaware scheduler (HAMi, plain binpack/spread) does."""
        return cls(
            protect_prefill_sms=False,
            max_decode_per_gpu=None,
            decode_bandwidth_budget=None,
            complementarity_weight=0.0,
            locality_weight=0.0,
            pool_weight=0.0,
            headroom_weight=0.0,
            prefill_pair_penalty=0.0,
            gpu_role_order=False,
        )


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Cluster-wide placement defaults; a pod may override policies by annotation."""

    node_policy: str = "default"
    # None: the node policy's own GPU order; "binpack" / "spread" force one (pods may override).
    gpu_policy: str | None = None
    # Oversubscription is off by default; >1.0 only where enforcement makes it real.
    core_scaling: float = 1.0
    memory_scaling: float = 1.0
    narrow_filter: bool = False
    # How fine scores become kube-scheduler's 0..10 (vgpu.planner.to_priorities): "rank" or "minmax".
    priority_mapping: Literal["rank", "minmax"] = "rank"
    roles: RoleRules = field(default_factory=RoleRules)
    # Schedule onto GPUs whose node inventory reports them unhealthy: never by default.
    allow_unhealthy: bool = False
    # Multi-GPU containers get NVLink-connected GPU sets, else one NUMA node's, before the policy's own order, and
    # a node scores `topology_weight` x how well the set it gives is connected (vgpu.topology, docs/topology.md).
    # Off: the order before topology (the benchmark's baseline); a pod's vgpu.io/require-nvlink still holds.
    topology: bool = True
    topology_weight: float = 2.0
    # Let a pod's vgpu.io/node-policy name a benchmark experiment (vgpu.placement.registry.EXPERIMENTAL). Only the
    # replay benchmarks set it; no service setting maps to it, so a cluster's pods get production policies only.
    experimental_policies: bool = False
