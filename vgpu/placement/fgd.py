"""fgd (FGD paper's policy): place where the node's expected fragmentation grows least.

The target workload is built from the pods the policy observes. The paper knows the trace in advance;
the replay reproduces that by priming the policy with the whole trace (`trace_prior`) and not feeding it
arrivals. Inside the node, a shared slice goes to the GPU that leaves the least fragmentation.
"""

from __future__ import annotations

import math
from collections import Counter

from vgpu.fit import GpuRank, NodePlacement
from vgpu.placement.frag import FragModel, TaskShape, shape_of, target_workload
from vgpu.placement.gpushare import MILLI, frees_after, host_after, host_free, node_frees, rank_best_fit, slice_milli
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

    def __init__(self, coverage: float = COVERAGE) -> None:
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self.coverage = coverage
        self.counts: Counter[TaskShape] = Counter()
        self._model: FragModel | None = None
        self._epoch = 0

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
        cpu, mem = host_after(node, pod)
        return self.model.frag(node, frees_after(node, placement), cpu, mem) - self.model.node_frag(node)

    def score(self, node: NodeState, placement: NodePlacement, pod: PodInfo) -> float:
        return quantized(self.delta(node, placement, pod), self.scale) / 100

    def gpu_rank(self, u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
        return rank_best_fit(u, memory_mib, cores, pod)

    def node_gpu_rank(self, node: NodeState, pod: PodInfo) -> GpuRank:
        """GPU order inside `node`: fragmentation after putting one slice of the pod on that GPU."""
        model = self.model_for(pod)
        frees = node_frees(node)
        pos = {u.device.uuid: i for i, u in enumerate(node.gpus)}
        cpu, mem = host_free(node)
        before = model.frag(node, frees, cpu, mem)
        cpu -= pod.cpu_milli
        mem -= pod.memory_mib

        seen: dict[tuple[int, int], float] = {}  # GPUs with the same free share rank the same
        steps = self.gpu_steps

        def rank(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
            i = pos[u.device.uuid]
            take = slice_milli(memory_mib, cores, u)
            hit = seen.get((frees[i], take))
            if hit is not None:
                return hit
            after = list(frees)
            after[i] = max(0, after[i] - take)
            grown = model.frag(node, after, cpu, mem) - before
            out = seen[(frees[i], take)] = -quantized(grown) if steps else grown
            return out

        return rank


def create() -> Fgd:
    return Fgd()
