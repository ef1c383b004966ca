"""llm-d-style P/D deployments on a cluster of 8-GPU NVLink nodes in racks, with scale-ups and -downs.

Pure: `generate(seed)` returns node inventories and an ordered list of events (pod created, pod deleted,
checkpoint). Slice shapes follow docs/pd-packing.md (an 8B decode with a large batch needs ~40 GB, a 32B bf16 needs
~80 GB, a 70B fp8 prefill owns an H200, its decode runs TP2); P:D ratios are prefill-heavy as in llm-d's
guides (gpt-oss-120b: 8 prefill GPUs to 8 decode GPUs), chosen so that each deployment's prefill and
decode capacities are of the same order (`vgpu.perf.cluster.nominal` prints them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from vgpu.devices import GpuDevice, NodeInventory
from vgpu.perf.params import H200, MODELS, GpuSpec, ModelSpec

RACK_LABEL = "topology.vgpu.io/rack"
H200_MIB = 143771


@dataclass(frozen=True, slots=True)
class SliceShape:
    """What one replica asks for: `count` vGPUs of `memory_mib` each; cores None = not specified."""

    count: int
    memory_mib: int
    cores: int | None

    def memory_gb(self) -> float:
        return self.memory_mib * 1024**2 / 1e9

    def share(self, gpu_mib: int = H200_MIB) -> float:
        """GPU-equivalents reserved (the larger of memory and SM share, proportional SMs if unspecified)."""
        mem = self.memory_mib / gpu_mib
        return self.count * max(mem, (self.cores if self.cores is not None else 0) / 100)


@dataclass(frozen=True, slots=True)
class Template:
    model: ModelSpec
    prefill: SliceShape
    decode: SliceShape
    p_per_d: int  # prefill replicas per decode replica


TEMPLATES = {
    t.model.name: t
    for t in (
        # Decode pods of the small models ask memory only: users size them by KV cache (HAMi then gives
        # them no SM limit; our request default gives proportional SMs).
        Template(MODELS["llama-8b"], SliceShape(1, 24576, 40), SliceShape(1, 40960, None), 3),
        Template(MODELS["qwen-14b"], SliceShape(1, 40960, 50), SliceShape(1, 61440, None), 3),
        Template(MODELS["qwen-32b"], SliceShape(1, 81920, 60), SliceShape(1, 81920, 40), 2),
        Template(MODELS["llama-70b-fp8"], SliceShape(1, H200_MIB, 100), SliceShape(2, 98304, 50), 4),
    )
}
MIX = (("llama-8b", 4), ("qwen-14b", 3), ("qwen-32b", 2), ("llama-70b-fp8", 1))


@dataclass(frozen=True, slots=True)
class Deployment:
    pool: str  # llm-d.ai/model label value; the model identity is "<namespace>/<pool>"
    namespace: str
    template: Template
    decode: int
    prefill: int

    @property
    def identity(self) -> str:
        return f"{self.namespace}/{self.pool}"


@dataclass(frozen=True, slots=True)
class Create:
    pod: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    label: str
    deployments: tuple[Deployment, ...]


Event = Create | Delete | Checkpoint


@dataclass(slots=True)
class Workload:
    nodes: list[NodeInventory]
    events: list[Event] = field(default_factory=list)
    gpu: GpuSpec = H200


def cluster(nodes: int = 8, gpus_per_node: int = 8, nodes_per_rack: int = 4) -> list[NodeInventory]:
    """H200 nodes, all GPUs of a node NVLink peers (NVSwitch), `nodes_per_rack` per rack."""
    out: list[NodeInventory] = []
    for n in range(nodes):
        name = f"node-{n:02d}"
        uuids = [f"GPU-{name}-{i}" for i in range(gpus_per_node)]
        gpus = tuple(
            GpuDevice(
                uuid=u,
                index=i,
                model="H200",
                memory_mib=H200_MIB,
                nvlink_peers=tuple(p for p in uuids if p != u),
            )
            for i, u in enumerate(uuids)
        )
        out.append(NodeInventory(name=name, gpus=gpus, labels={RACK_LABEL: f"rack-{n // nodes_per_rack}"}))
    return out


def pod(dep: Deployment, role: str, index: int) -> dict[str, Any]:
    """A Kubernetes Pod as llm-d's model service renders it (role and model labels, vLLM container)."""
    shape = dep.template.prefill if role == "prefill" else dep.template.decode
    limits: dict[str, Any] = {"nvidia.com/gpu": shape.count, "nvidia.com/gpumem": shape.memory_mib}
    if shape.cores is not None:
        limits["nvidia.com/gpucores"] = shape.cores
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{dep.pool}-{role}-{index}",
            "namespace": dep.namespace,
            "labels": {"llm-d.ai/role": role, "llm-d.ai/model": dep.pool},
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "resources": {"limits": limits}}]},
    }


def _rollout(dep: Deployment, old: Deployment | None, rng: random.Random, next_index: dict[str, int]) -> list[Event]:
    """Pods created or deleted to move `old` to `dep`: new pods in ReplicaSet-like interleaved order,
    deletions newest first (as a ReplicaSet scales down)."""
    events: list[Event] = []
    creates: list[Event] = []
    for role, want, have in (
        ("prefill", dep.prefill, old.prefill if old else 0),
        ("decode", dep.decode, old.decode if old else 0),
    ):
        key = f"{dep.identity}/{role}"
        live = next_index.get(key, 0)
        if want < have:
            for i in range(have - want):
                events.append(Delete(f"{dep.namespace}/{dep.pool}-{role}-{live - 1 - i}"))
            next_index[key] = live - (have - want)
        for _ in range(have, want):
            creates.append(Create(pod(dep, role, next_index.get(key, 0))))
            next_index[key] = next_index.get(key, 0) + 1
    rng.shuffle(creates)
    return events + creates


def generate(
    seed: int,
    *,
    nodes: int = 8,
    deployments: int = 10,
    steps: int = 6,
    fill: float = 0.6,
) -> Workload:
    """Deploy `deployments` P/D deployments (model mix `MIX`), then `steps` scaling steps, each followed
    by a checkpoint; the initial size is grown until it asks for about `fill` of the cluster."""
    rng = random.Random(seed)
    inv = cluster(nodes)
    capacity = sum(len(n.gpus) for n in inv)
    names = [m for m, w in MIX for _ in range(w)]
    deps: dict[str, Deployment] = {}
    for i in range(deployments):
        t = TEMPLATES[rng.choice(names)]
        pool = f"{t.model.name}-{i}"
        deps[pool] = Deployment(pool, f"team-{i % 3}", t, decode=1, prefill=t.p_per_d)
    # Grow random deployments by one decode (and its prefills) until the demand reaches `fill`.
    while True:
        pool = rng.choice(list(deps))
        d = deps[pool]
        grown = replace(d, decode=d.decode + 1, prefill=d.prefill + d.template.p_per_d)
        if _demand([*(x for k, x in deps.items() if k != pool), grown]) > fill * capacity:
            break
        deps[pool] = grown
    next_index: dict[str, int] = {}
    work = Workload(inv)
    for d in deps.values():
        work.events.extend(_rollout(d, None, rng, next_index))
    work.events.append(Checkpoint("rollout", tuple(deps.values())))
    for step in range(steps):
        for pool in rng.sample(list(deps), k=max(1, len(deps) // 3)):
            d = deps[pool]
            delta = rng.choice((-1, 1, 1)) if d.decode > 1 else 1
            new = replace(d, decode=d.decode + delta, prefill=max(1, d.prefill + delta * d.template.p_per_d))
            if delta > 0 and _demand([*(x for k, x in deps.items() if k != pool), new]) > capacity:
                continue
            work.events.extend(_rollout(new, d, rng, next_index))
            deps[pool] = new
        work.events.append(Checkpoint(f"step-{step + 1}", tuple(deps.values())))
    return work


def _demand(deps: list[Deployment]) -> float:
    """GPU-equivalents the deployments ask for (proportional SMs where cores are unspecified)."""
    return sum(d.prefill * d.template.prefill.share() + d.decode * d.template.decode.share() for d in deps)
