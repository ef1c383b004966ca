"""fgd (FGD paper's policy): place where the node's expected fragmentation grows least.

The target workload is built from the pods the policy observes. The paper knows the trace in advance;
the replay reproduces that by priming the policy with the whole trace (`trace_prior`) and not feeding it
arrivals. Inside the node, a shared slice goes to the GPU that leaves the least fragmentation.
"""

from __future__ import annotations

import math
from collections import Counter

from vgpu.fit import GpuRank, NodePlacement, StateRank
from vgpu.placement.frag import FragModel, Growths, TaskShape, shape_of, target_workload
from vgpu.placement.gpushare import MILLI, frees_after, host_after, host_free, node_frees, rank_best_fit
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState

COVERAGE = 0.95


def quantized(delta: float, scale: float = MILLI) -> int:
    """The paper simulator's integer score for a fragmentation change: int(100 * sigmoid(-delta / 1000)).

    Measured: this coarse scale (ties then broken by node order) is worth about 1.2 points at x = 100 on
    the default trace over choosing the exact minimum; it is what reproduces the paper's 4.77. `scale`
    widens (or narrows) the steps: one score unit is about scale / 25 milli of fragmentation near 0.
    """
    return int(100 / (1 + math.exp(min(700.0, delta / scale))))


class Fgd:
    name = "fgd"
    # The replay primes this policy with the whole trace instead of feeding it arrivals (the paper's setup).
    # Scores and GPU choice use the simulator's integer scale (see `quantized`).
    trace_prior = True
    with_memory = False  # the paper's task shape is (cpu, gpu_milli, num_gpu, gpu_spec)
    scale: float = MILLI  # width of the node score's steps (see `quantized`)
    # GPU choice inside a node on the same integer steps as the node score (the simulator's), ties to the
    # lowest index; False: the exact least fragmentation growth.
    gpu_steps = True
    # The score reads only what `NodeState.class_key` holds, plus the placement's GPU state: the planner may score a
    # node class once (vgpu.planner).
    class_scored = True

    def __init__(self, coverage: float = COVERAGE) -> None:
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self.coverage = coverage
        self.counts: Counter[TaskShape] = Counter()
        self._model: FragModel | None = None
        self._epoch = 0
        # The last node `node_gpu_rank` ordered: (node, its version, pod, model, the order).
        self._last_rank: tuple[NodeState, int, PodInfo, FragModel, _FragRank] | None = None

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def model(self) -> FragModel:
        if self._model is None:
            self._model = FragModel(target_workload(self.counts, self.coverage))
        return self._model

    def observe(self, pod: PodInfo) -> None:
        self.counts[shape_of(pod, with_memory=self.with_memory)] += 1
        self._model = None
        self._epoch += 1

    def model_for(self, pod: PodInfo) -> FragModel:
        return self.model

    def delta(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        """Fragmentation added by the placement (negative when it removes some), in GPU milli."""
        known = self._ranked_delta(node, placement, pod)
        if known is not None:
            return known
        cpu, mem = host_after(node, pod)
        return self.model.frag(node, frees_after(node, placement), cpu, mem) - self.model.node_frag(node)

    def _ranked_delta(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float | None:
        """What the GPU order just worked out for this node (the same arithmetic, so the same float), or None when it
        did not. The planner scores a node right after ordering its GPUs, so `delta` need not work it out again: for
        one slice the growth itself (host room must be tracked or unasked: the order counts an untracked host's room
        as plenty less the pod's ask, `host_after` as plenty); for several, the node's own fragmentation (`node_frag`:
        the order's sorted frees and host room are the node's now)."""
        last = self._last_rank
        if last is None or last[0] is not node or last[1] != node.version or last[2] is not pod:
            return None
        model = last[3]
        if model is not self.model_for(pod):
            return None
        rank = last[4]
        containers = placement.containers
        if len(containers) != 1 or len(containers[0].devices) != 1:
            if not containers:
                return None
            cpu, mem = host_after(node, pod)
            table = rank.table  # the node's own fragmentation, where the GPU order worked it out
            before = None if table is None else table.before
            if before is None:
                before = model.frag_sorted(node, rank.sig, rank.host[0], rank.host[1])
            host = rank.host
            if table is not None and cpu == host[2] and mem == host[3]:
                # The table's integers with the placement's GPUs swapped (`frees_after`'s takes, summed per GPU):
                # no sorted frees or memo key, the same float.
                taken: dict[str, int] = {}
                by_uuid = node.by_uuid
                for c in containers:
                    for d in c.devices:
                        card = by_uuid[d.uuid].device
                        t = min(MILLI, max(-(-d.memory_mib * MILLI // card.memory_mib), d.cores * MILLI // card.cores))
                        taken[d.uuid] = taken.get(d.uuid, 0) + t  # slice_milli
                frees, pos = rank.frees, rank.pos
                after = table.frag_after(node, [(frees[pos[uuid]], t) for uuid, t in taken.items()])
                if after is not None:
                    return after - before
            return model.frag(node, frees_after(node, placement), cpu, mem) - before
        inv = node.inventory
        if (pod.cpu_milli and not inv.cpu_milli) or (pod.memory_mib and not inv.memory_mib):
            return None
        d = containers[0].devices[0]
        card = node.by_uuid[d.uuid].device
        take = min(
            MILLI, max(-(-d.memory_mib * MILLI // card.memory_mib), d.cores * MILLI // card.cores)
        )  # slice_milli
        return rank.growth.get((rank.frees[rank.pos[d.uuid]], take))

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return quantized(self.delta(node, placement, pod), self.scale) / 100

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return rank_best_fit(u, memory_mib, cores, pod)

    def node_gpu_rank(self, node: NodeState, pod: PodInfo) -> GpuRank:
        """GPU order inside `node`: fragmentation after putting one slice of the pod on that GPU."""
        model = self.model_for(pod)
        cpu, mem = host_free(node)
        rank = _FragRank(node, model, node_frees(node), (cpu, mem, cpu - pod.cpu_milli, mem - pod.memory_mib))
        rank.steps = self.gpu_steps
        self._last_rank = (node, node.version, pod, model, rank)
        return rank


class _FragRank(StateRank):
    """`Fgd.node_gpu_rank`'s order on one node: the fragmentation growth after one slice on the GPU (its free share
    and the slice's size decide, so GPUs in equal states rank alike). `host`: free (cpu, memory) now, then after."""

    __slots__ = ("frees", "growth", "host", "model", "node", "pos", "seen", "sig", "steps", "table")

    def __init__(
        self, node: NodeState, model: FragModel, frees: tuple[int, ...], host: tuple[int, int, int, int]
    ) -> None:
        self.node, self.model, self.frees, self.host = node, model, frees, host
        self.sig = tuple(sorted(frees))
        self.steps = True
        self.pos = node.positions
        self.seen: dict[tuple[int, int], float] = {}  # GPUs with the same free share rank the same
        self.growth: dict[tuple[int, int], float] = {}  # the exact growth behind each rank (`delta` reuses it)
        self.table: Growths | None = None  # the model's growths for this node's signature and host, on first use

    def __call__(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        d = u.device
        take = -(-memory_mib * MILLI // d.memory_mib)  # slice_milli, its min and max as comparisons of the same ints
        by_cores = cores * MILLI // d.cores
        if by_cores > take:
            take = by_cores
        if take > MILLI:
            take = MILLI
        key = (self.frees[self.pos[d.uuid]], take)
        hit = self.seen.get(key)
        if hit is not None:
            return hit
        table = self.table
        if table is None:
            table = self.table = self.model.growths(self.node, self.sig, self.host)
        grown = table.by.get(key)
        if grown is None:
            grown = table.grow(self.node, key[0], take)
        self.growth[key] = grown
        out = self.seen[key] = -quantized(grown) if self.steps else grown
        return out


def create() -> Fgd:
    return Fgd()
