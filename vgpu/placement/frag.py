"""GPU fragmentation against a workload (FGD, Weng et al., USENIX ATC'23), shared by `fgd` and `fragaware`.

For a node and a task shape: if the task cannot run on the node at all, all of the node's idle GPU is
fragmented for it; otherwise only the GPUs with less room than the task's per-GPU request (for whole-GPU
tasks: every partly used GPU). CPU-only tasks cannot use GPU, so all idle GPU counts for them. A node's
fragmentation is the expectation over the target workload: the most frequent shapes covering
`coverage` of the pods seen, renormalised. Results are memoised per node signature (free CPU, memory,
model, card size and SM capacity, sorted free milli), so identical nodes cost one computation.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu.placement.gpushare import MILLI, host_free, node_frees, slice_milli
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState

_MEMO_LIMIT = 200_000
_TABLES_LIMIT = 50_000  # `FragModel.growths` tables (each at most `_TABLE_LIMIT` entries)
_TABLE_LIMIT = 256
# Entries over all of a model's growth tables (~150 B each): the table count alone let a churning cluster keep
# 50,000 full tables (~1.5 GiB) against the extender's 1 GiB; cleared whole past this (~60 MiB).
_ENTRIES_LIMIT = 400_000
_PLANS_LIMIT = 4_096  # host rooms met (tracked hosts: one per distinct (cpu, memory) free)
_NEVER = 1 << 62  # `FragModel._plan`'s milli for a task that cannot run on the node: above every GPU's free share


@dataclass(frozen=True, slots=True)
class TaskShape:
    """What fragmentation cares about in a pod: host asks, GPU count and one slice's request."""

    cpu_milli: int
    memory_mib: int
    count: int
    slice_request: tuple[int | None, int | None, int | None]  # memory_mib, memory_percentage, cores
    models: frozenset[str] | None

    @property
    def whole_gpus(self) -> bool:
        """Asks for whole cards, not a shared slice: all of each GPU's memory, or all of its SMs (a slice
        asked in MiB with `gpucores` 100 leaves nothing for a neighbour to run on)."""
        _mem, pct, cores = self.slice_request
        return self.count > 0 and ((pct is not None and pct >= 100) or (cores is not None and cores >= 100))

    def milli_on(self, u: GpuUsage) -> int:
        mem, pct, cores = self.slice_request
        d = u.device
        m = mem if mem is not None else d.memory_mib * (pct or 0) // 100
        c = cores if cores is not None else min(100, -(-m * 100 // d.memory_mib))
        return slice_milli(m, c, u)


def shape_of(pod: PodInfo, *, with_memory: bool) -> TaskShape:
    reqs = pod.request.containers
    if not reqs:
        return TaskShape(pod.cpu_milli, pod.memory_mib if with_memory else 0, 0, (None, None, None), None)
    r = reqs[0]
    count = sum(c.count for c in reqs)
    return TaskShape(
        pod.cpu_milli,
        pod.memory_mib if with_memory else 0,
        count,
        (r.memory_mib, r.memory_percentage, r.cores),
        pod.gpu_models,
    )


def target_workload(counts: Mapping[TaskShape, float], coverage: float) -> list[tuple[TaskShape, float]]:
    """The most frequent shapes that together cover `coverage` of the weight, renormalised to sum 1."""
    total = sum(counts.values())
    if total <= 0:
        return []
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
    out: list[tuple[TaskShape, float]] = []
    acc = 0.0
    for shape, n in ranked:
        out.append((shape, n))
        acc += n
        if acc >= coverage * total - 1e-9:
            break
    return [(s, n / acc) for s, n in out]


class FragModel:
    """Fragmentation of node states against one fixed target workload."""

    def __init__(self, workload: Sequence[tuple[TaskShape, float]]) -> None:
        self.workload = list(workload)
        # Per card (memory, SM capacity): a slice's share (`slice_milli`) reads both.
        self._tasks: dict[tuple[int, int], list[tuple[float, int, int, int, int, frozenset[str] | None]]] = {}
        self._memo: dict[tuple[object, ...], float] = {}
        self._growth: dict[tuple[object, ...], Growths] = {}
        self.growth_entries = 0  # entries added to `_growth`'s tables since it was last cleared
        self._plans: dict[tuple[object, ...], list[tuple[float, int, int]]] = {}

    def _tasks_on(self, u: GpuUsage) -> list[tuple[float, int, int, int, int, frozenset[str] | None]]:
        key = (u.device.memory_mib, u.device.cores)
        tasks = self._tasks.get(key)
        if tasks is None:
            tasks = self._tasks[key] = [
                (p, s.cpu_milli, s.memory_mib, s.count, s.milli_on(u) if s.count else 0, s.models)
                for s, p in self.workload
            ]
        return tasks

    def frag(self, node: NodeState, frees: Sequence[int], cpu_free: int, mem_free: int) -> float:
        """Expected fragmented GPU milli of `node` if its GPUs had `frees` and its host the given room."""
        if not node.gpus:
            return 0.0
        return self.frag_sorted(node, tuple(sorted(frees)), cpu_free, mem_free)

    def growth(
        self, node: NodeState, sig: tuple[int, ...], free: int, take: int, host: tuple[int, int, int, int]
    ) -> float:
        """`frag` once one GPU with `free` milli (one of `sig`, the node's sorted frees) gives `take` and the host goes
        from (cpu, memory) `host[:2]` to `host[2:]`, less `frag` now. Kept per (node signature, host, free, take):
        nodes in the same state share it. The same arithmetic as two `frag` calls, so the same float."""
        return self.growths(node, sig, host).of(node, free, take)

    def growths(self, node: NodeState, sig: tuple[int, ...], host: tuple[int, int, int, int]) -> Growths:
        """`growth` for every (free, take) on nodes of this signature, host room, GPU model and card (size, SM
        capacity): one lookup of the node's key, then one of (free, take) per GPU state ranked (`vgpu.placement.fgd`'s
        GPU order)."""
        g0 = node.gpus[0].device
        key = (sig, host, g0.model, g0.memory_mib, g0.cores)
        table = self._growth.get(key)
        if table is None:
            if len(self._growth) > _TABLES_LIMIT:
                self._growth.clear()
                self.growth_entries = 0
            table = self._growth[key] = Growths(self, sig, host)
        return table

    def frag_sorted(self, node: NodeState, sig: tuple[int, ...], cpu_free: int, mem_free: int) -> float:
        """`frag` for a node with GPUs, its frees given sorted."""
        g0 = node.gpus[0].device
        key = (cpu_free, mem_free, g0.model, g0.memory_mib, g0.cores, sig)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        out = 0.0
        # `sig` is sorted: the GPUs with less than `milli` free are a prefix, and their frees' sum a prefix sum (ints,
        # so the same number as summing them one by one).
        idle = sum(sig)
        if idle:
            below = list(itertools.accumulate(sig, initial=0))
            full = len(sig) - bisect.bisect_left(sig, MILLI)
            biggest = sig[-1]
            at, whole = bisect.bisect_left, MILLI
            # The same products added in the same (workload) order as testing every condition of each task here:
            # `_plan` folds in beforehand what depends only on the host room and the model (see there).
            for p, milli, count in self._plan(node, cpu_free, mem_free):
                if full < count or biggest < milli:
                    out += p * idle
                elif milli >= whole:
                    out += p * (idle - full * whole)
                else:
                    out += p * below[at(sig, milli)]
        if len(self._memo) > _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = out
        return out

    def _plan(self, node: NodeState, cpu_free: int, mem_free: int) -> list[tuple[float, int, int]]:
        """Each workload task (in order) as `frag_sorted` tests it on a node of this GPU model and card (size, SM
        capacity) with this host room: (weight, milli, count), where a task that cannot run there whatever the GPUs
        hold (no GPU, too little host room, another model) has milli `_NEVER` (more than any GPU's free: all idle GPU
        is fragmented for it) and a shared-slice task (milli < 1000) count 0 (only its milli decides). A whole-card
        task keeps both: too few free whole cards (`full < count`) or none (`biggest < milli`). Kept per (model, size,
        SM capacity, host room)."""
        g0 = node.gpus[0]
        key = (g0.device.model, g0.device.memory_mib, g0.device.cores, cpu_free, mem_free)
        plan = self._plans.get(key)
        if plan is None:
            model = g0.device.model
            plan = []
            for p, cpu, mem, count, milli, models in self._tasks_on(g0):
                if count == 0 or cpu > cpu_free or mem > mem_free or (models is not None and model not in models):
                    plan.append((p, _NEVER, 0))
                elif milli >= MILLI:
                    plan.append((p, milli, count))
                else:
                    plan.append((p, milli, 0))
            if len(self._plans) > _PLANS_LIMIT:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def node_frag(self, node: NodeState) -> float:
        cpu, mem = host_free(node)
        return self.frag(node, node_frees(node), cpu, mem)


class Growths:
    """`FragModel.growth` on nodes of one signature, host room, GPU model and card (size, SM capacity), by (free,
    take), with the nodes' own fragmentation worked out once (`before`). `node`: any node of those (the model reads
    its first GPU's model, size and SM capacity, which the table's key holds)."""

    __slots__ = ("after", "before", "by", "host", "model", "sig")

    def __init__(self, model: FragModel, sig: tuple[int, ...], host: tuple[int, int, int, int]) -> None:
        self.model, self.sig, self.host = model, sig, host
        self.before: float | None = None
        self.by: dict[tuple[int, int], float] = {}
        # What `frag_sorted` reads of the signature once one GPU changed, worked out from `sig` on the first `grow`:
        # (the after-plan's tasks each with the sum of `sig`'s frees below its milli, idle, whole cards, the largest
        # free and the next one).
        self.after: tuple[list[tuple[float, int, int, int]], int, int, int, int, int] | None = None

    def of(self, node: NodeState, free: int, take: int) -> float:
        hit = self.by.get((free, take))
        if hit is None:
            hit = self.grow(node, free, take)
        return hit

    def grow(self, node: NodeState, free: int, take: int) -> float:
        """`frag` after less `frag` before: the two `frag_sorted` calls `growth` always made, so the same float.

        The after-signature differs from `sig` in one GPU (`free` -> `new`), so each of `frag_sorted`'s integers
        (idle, whole cards, the largest free, the frees below a task's milli) is `sig`'s with that one GPU's term
        swapped, without sorting the changed frees or a memo key (ints: the same numbers, and the same products summed
        in the same workload order, so the same float)."""
        sig, host, model = self.sig, self.host, self.model
        before = self.before
        if before is None:
            before = self.before = model.frag_sorted(node, sig, host[0], host[1])
        after = self.after
        if after is None:
            after = self.after = self._after(node)
        tasks, idle, full, top, second, _ = after
        new = free - take if free > take else 0
        idle += new - free
        out = 0.0
        if idle:  # `frag_sorted`'s loop, on the changed integers
            full += (new >= MILLI) - (free >= MILLI)
            biggest = top if free != top else (second if second > new else new)
            whole = MILLI
            for p, milli, count, below in tasks:
                if full < count or biggest < milli:
                    out += p * idle
                elif milli >= whole:
                    out += p * (idle - full * whole)
                else:
                    if free < milli:
                        below -= free
                    if new < milli:
                        below += new
                    out += p * below
        hit = out - before
        by = self.by
        if len(by) >= _TABLE_LIMIT:
            by.clear()
        by[(free, take)] = hit
        model.growth_entries += 1
        if model.growth_entries > _ENTRIES_LIMIT:
            model._growth.clear()  # this table goes too; the caller's answer stands
            model.growth_entries = 0
        return hit

    def frag_after(self, node: NodeState, changes: Sequence[tuple[int, int]]) -> float | None:
        """`frag` of a node of this table once each GPU in `changes` ((its free, the milli taken from it), one entry a
        GPU) gives that much and the host has the room after (`host[2:]`): `grow`'s integers with several GPUs'
        terms swapped, so the same float as `frag_sorted` on the sorted frees after. None where the changed GPUs held
        every largest free (the largest after would need the others sorted): the caller works it out in full."""
        after = self.after
        if after is None:
            after = self.after = self._after(node)
        tasks, idle, full, top, _, tops = after
        news = []
        for free, take in changes:
            if free == top:
                tops -= 1
                if not tops:
                    return None
            new = free - take if free > take else 0
            idle += new - free
            full += (new >= MILLI) - (free >= MILLI)
            news.append((free, new))
        out = 0.0
        if idle:
            whole = MILLI
            for p, milli, count, below in tasks:
                if full < count or top < milli:  # a GPU that holds `top` is left: still the largest
                    out += p * idle
                elif milli >= whole:
                    out += p * (idle - full * whole)
                else:
                    for free, new in news:
                        if free < milli:
                            below -= free
                        if new < milli:
                            below += new
                    out += p * below
        return out

    def _after(self, node: NodeState) -> tuple[list[tuple[float, int, int, int]], int, int, int, int, int]:
        """`grow`'s per-table part: the plan for the host room after (each task with `sig`'s frees below its milli),
        `sig`'s idle sum, whole cards, largest free, the one after it (-1 with one GPU) and how many hold the largest."""
        sig = self.sig
        below = list(itertools.accumulate(sig, initial=0))
        at = bisect.bisect_left
        tasks = [(p, milli, count, below[at(sig, milli)]) for p, milli, count in self.model._plan(node, *self.host[2:])]
        full = len(sig) - at(sig, MILLI)
        top = sig[-1]
        return tasks, below[-1], full, top, sig[-2] if len(sig) > 1 else -1, len(sig) - at(sig, top)
