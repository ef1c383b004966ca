"""The one placement entry point: evaluate nodes for a pod, choose the concrete GPUs, map scores.

The extender's /filter, /prioritize and /bind, the CLI demo and the replay benchmarks all go through
`Planner`, so a policy is never implemented twice. Node results are cached per (node version, pod
shape, policy epoch): after a bind only the changed node is recomputed, and only once a call asks
about it, which is what keeps a 5,000-node filter within a few milliseconds.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import itertools
import operator
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeVar

from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice
from vgpu.errors import UnknownPolicyError
from vgpu.fit import FitFailure, GpuRank, NodePlacement, ShapeMemo, StateRank, fit_node, judge_with, role_rank
from vgpu.placement import registry
from vgpu.placement.base import EMPTIEST_FIRST, FULLEST_FIRST, NodePolicy
from vgpu.placement.role_score import free_after, free_terms, headroom_one, role_parts
from vgpu.pod import PodInfo
from vgpu.state import ClusterState, GpuUsage, NodeState, slice_blocker
from vgpu.topology import placement_score

MAX_PRIORITY = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority
PriorityMapping = Literal["rank", "minmax"]
_CACHED_SHAPES = 256
_CLASSES_MIN = 4096  # a shape's node classes kept at least (`Planner._classes_for`): twice the nodes above that
_INCREMENTAL_LIMIT = 256  # beyond this many changed nodes a full pass is as cheap
# Nodes a memoised evaluation keeps in rank order (the rank mapping's best ten and some more), so that after a bind
# it re-ranks only the nodes that changed instead of all of them (5,000 nodes: ~3 ms a /prioritize).
_RANKED = 64
# Whether this module runs compiled (kube_vgpu_dev.native, mypyc: `__file__` is then the extension). Either way is
# correct; only the speed of `NodeResult.of_class` differs.
_COMPILED = not __file__.endswith(".py")
_V = TypeVar("_V")


@dataclass(slots=True)
class _Memo:
    names: list[str]
    name_set: set[str]
    version: int
    evaluation: Evaluation
    subset: tuple[list[str], Evaluation, list[str]] | None = None  # names, their evaluation, its feasible in order
    # Names that changed since they were last evaluated and were not asked about since: out of `evaluation` until a
    # call asks about them (kube-scheduler asks ~10 % of the nodes a call, so most changed nodes wait, and a node that
    # changes again meanwhile is evaluated once).
    stale: set[str] = field(default_factory=set)
    # What `passing` last handed out: /filter's NodeNames, the version then, and whether it was every feasible node of
    # `evaluation` (asked over `names`). /prioritize gets that very list back: while the version holds, it needs no
    # check that its names are known, fresh or exactly the feasible ones.
    passed: tuple[list[str], int, bool] | None = None
    # The rank mapping's key of each feasible node of `evaluation`, made on first use and dropped with its score.
    keys: RankKeys = field(init=False)
    # Every feasible node in the rank mapping's order, once /prioritize asked about a subset twice (`_top`).
    order: _Order | None = None
    ranked_subsets: int = 0
    # `ClusterState.names_version` when `name_set` held every node of the state (-1: it did not): while it has not
    # moved, names that have an inventory are all in `name_set`, and /filter's are not looked up again to know it.
    covers: int = -1
    cover_checked: int = -1  # the `names_version` at which `Planner._filter_covered` last checked `covers` anew
    # For /filter over every name (`names` again, each once): each name's position in `names`, and the positions of
    # the names not feasible now (failed, unresolvable, stale), kept up to date from the first such call on, so that
    # its NodeNames are `names` less those, cut out by slices, where each of 5,000 fresh names was looked up.
    positions: dict[str, int] | None = None
    out_at: set[int] | None = None
    # `Planner._absent`'s answer for this memo's pods, with the (policy, GPU order) it was made for: every pod of the
    # memo's key has the same shape, container names, policy, epoch and config, so the same stand-in and caches.
    absent: tuple[NodePolicy, GpuRank, _Absent | None] | None = None

    def __post_init__(self) -> None:
        self.keys = RankKeys(self.evaluation.scores)


class _Shared:
    """One node class's evaluation (`NodeState.class_key`) for one memoised shape: the chosen GPU's state and slice,
    the policy's score and the role score without its headroom; or the failure, which names no GPU. Not changed once
    the class holds it (bar a split class's `splits`, which fill as nodes come). A plain slots class, not a dataclass:
    the first node of each class builds one, and a frozen dataclass's `__init__` (each field set through
    `object.__setattr__`) was ~6x the instructions, ~9 % of a one-slice full evaluation (callgrind)."""

    __slots__ = (
        "by_picks",
        "container",
        "cores",
        "failure",
        "flat",
        "linked",
        "memory_mib",
        "multi",
        "policy_score",
        "ranks",
        "result",
        "role_base",
        "score",
        "split",
        "splits",
        "state",
        "steps",
        "take",
        "tied",
    )

    def __init__(
        self,
        state: int | None,
        container: str = "",
        memory_mib: int = 0,
        cores: int = 0,
        policy_score: float = 0.0,
        role_base: float = 0.0,
        score: float | None = None,
        *,
        failure: FitFailure | None = None,
        result: NodeResult | None = None,
        multi: tuple[tuple[str, tuple[tuple[int, int, int, int], ...]], ...] | None = None,
        linked: float | None = None,
        split: frozenset[int] | None = None,
        splits: dict[tuple[int, ...], _Shared] | None = None,
        ranks: dict[int, tuple[float, float]] | None = None,
        take: int = 0,
        steps: tuple[dict[int, tuple[float, float]], ...] | None = None,
    ) -> None:
        self.state = state  # `GpuUsage.state_id` of the chosen GPU
        self.container = container
        self.memory_mib = memory_mib
        self.cores = cores
        self.policy_score = policy_score
        self.role_base = role_base
        # The whole score where it is the same on every node of the class (no headroom term, or one at its cap); None:
        # policy_score + (role_base + the node's own headroom), the order `_evaluate` adds them in.
        self.score = score
        self.failure = failure
        # Where GPUs of several states rank equal to the best: each such state's answer, by state; a node takes the
        # one whose first GPU has the lowest index there (`_share_tied` sets it before the class holds the answer).
        self.tied: dict[int, _Shared] | None = None
        self.result = result  # for a failure: the one result every node of the class gets (it names none)
        # A pod of several slices (`_share_multi`): each container's name and slices, a slice as (the GPU's
        # `GpuUsage.state_id`, which GPU of that state in index order, memory, cores); `state` is then None.
        self.multi = multi
        self.linked = linked  # with `multi`: the topology term added to the score, where there is one
        # A pod of several slices where GPU states rank equal (`_multi_ties`): those states, and the answer for each
        # order of their GPUs by index on a node (`_split_key`), made by the first node of the class with that order.
        # For a pod of one container, `ranks` (each candidate state's order key bar the index) and `take` (its count)
        # make the key the states of the GPUs it takes, in order, instead.
        self.split = split
        self.splits = splits
        self.ranks = ranks
        self.take = take
        # For a pod of several containers, each container's candidate states and `fit_node`'s order key there bar the
        # index (`_multi_ties`), and the answers by what the containers take in turn (`_picks`): the interleaving key
        # (`splits`) tells apart orders that take the same GPUs, and a node whose interleaving is new takes the answer
        # of its picks where a node took them before (5,000 nodes, 25 % + 50 %: 3,385 nodes of split classes in 766
        # interleavings, 361 distinct picks).
        self.steps = steps
        self.by_picks: dict[tuple[int, ...], _Shared] | None = None if steps is None else {}
        # With `multi`, made by the first node that takes it (`_of_multi`): each slice's (state, which GPU of it) flat,
        # each GPU's slices summed as (the position of its first slice, memory, cores) for the headroom, and whether
        # any slice is not its state's first GPU; so a node taking the answer builds no placement to score.
        self.flat: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int, int], ...], bool] | None = None


# A model no pod runs (a label value holds no NUL): `Planner._absent`'s stand-in for a model a node does not run.
_ABSENT = "\x00absent"


class _Absent(NamedTuple):
    """`Planner._absent`: the pod with model `_ABSENT` and its shape's per-node cache, shape memo and node classes, and
    the cache's key in `Planner._cache`."""

    pod: PodInfo
    cache: dict[str, tuple[int, NodeResult]]
    fits: ShapeMemo
    classes: Classes | None
    key: tuple[object, ...]


_PER_NODE = _Shared(None)  # the class's answer names GPUs by order (a tie, a cordon, NVLink...): evaluate each node
Classes = dict[int, _Shared]  # by `NodeState.class_key`


class NodeResult:
    """A node's fit (`placement`, None when it failed), score and failure. Immutable. A node that takes its class's
    answer (`_Shared`) names its GPU only when asked: a cold pass over 5,000 nodes reads the placement of a few. For a
    pod of several slices (`_Shared.multi`) it keeps the node's GPU of each slice, in the answer's order."""

    __slots__ = ("_dev", "_node", "_placement", "_shared", "failure", "score")

    def __init__(self, placement: NodePlacement | None, score: float = 0.0, failure: FitFailure | None = None) -> None:
        self._placement = placement
        self.score = score
        self.failure = failure
        self._shared: _Shared | None = None
        self._node = ""
        self._dev: GpuDevice | tuple[GpuDevice, ...] | None = None

    @classmethod
    def of_class(cls, node: str, dev: GpuDevice | tuple[GpuDevice, ...], shared: _Shared, score: float) -> NodeResult:
        """The result of a node that takes its class's answer `shared` on its GPU `dev` (one object: a cold pass
        makes one per node, and fewer objects mean fewer garbage collections of a large heap)."""
        # Interpreted, `object.__new__` takes 3 % fewer instructions a cold pass than a call of __init__; mypyc
        # refuses it for its classes.
        out = cls(None) if _COMPILED else object.__new__(cls)
        out._placement = None
        out.score = score
        out.failure = None
        out._shared = shared
        out._node = node
        out._dev = dev
        return out

    @property
    def placement(self) -> NodePlacement | None:
        shared, dev = self._shared, self._dev
        if shared is not None and dev is not None and self._placement is None:
            if isinstance(dev, tuple):
                assert shared.multi is not None
                containers, at = [], 0
                for name, slices in shared.multi:
                    devices = tuple(
                        DeviceSlice(uuid=d.uuid, index=d.index, memory_mib=mem, cores=cores)
                        for d, (_, _, mem, cores) in zip(dev[at : at + len(slices)], slices, strict=True)
                    )
                    containers.append(ContainerAssignment(name=name, devices=devices))
                    at += len(slices)
                self._placement = NodePlacement(self._node, tuple(containers))
            else:
                slc = DeviceSlice(uuid=dev.uuid, index=dev.index, memory_mib=shared.memory_mib, cores=shared.cores)
                self._placement = NodePlacement(
                    self._node, (ContainerAssignment(name=shared.container, devices=(slc,)),)
                )
        return self._placement

    def _fields(self) -> tuple[NodePlacement | None, float, FitFailure | None]:
        return (self.placement, self.score, self.failure)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeResult):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"NodeResult(placement={self.placement!r}, score={self.score!r}, failure={self.failure!r})"


@dataclass(slots=True)
class Evaluation:
    feasible: dict[str, NodeResult] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)  # fine score of each feasible node
    priorities: dict[str, int] | None = None  # filled lazily by Planner.priorities
    ranked: Ranked | None = None  # the rank mapping's order, kept up to date by Planner._refresh

    def best(self) -> tuple[str, NodeResult] | None:
        if not self.feasible:
            return None
        return max(self.feasible.items(), key=lambda kv: kv[1].score)


def _subset(full: Evaluation, names: list[str]) -> tuple[Evaluation, list[str]]:
    """`full` (which holds every name) narrowed to `names`, in their order (a name asked twice is where it came first),
    and its feasible names in that order; with C-level filter/map/zip, one lookup of a name per dict it may be in: a
    Python loop over 500 names cost more than the no-GPU request's JSON work."""
    feasible, scores = full.feasible, full.scores
    passed = list(filter(feasible.__contains__, names))
    sub = Evaluation(
        dict(zip(passed, map(feasible.__getitem__, passed), strict=True)),
        _pick(full.failed, names),
        _pick(full.unresolvable, names) if full.unresolvable else {},
        dict(zip(passed, map(scores.__getitem__, passed), strict=True)),
    )
    return sub, passed


def _pick(mapping: dict[str, _V], names: list[str]) -> dict[str, _V]:
    """The entries of `names` that `mapping` has, in `names`' order (`{n: mapping[n] for n in names if n in mapping}`)."""
    kept = list(filter(mapping.__contains__, names))
    return dict(zip(kept, map(mapping.__getitem__, kept), strict=True))


class RankKeys(dict[str, tuple[float, int]]):
    """(score, `_tiebreak`) of feasible nodes, the rank mapping's order key, each made on its first lookup from
    `scores` (a miss calls `__missing__`; a hit is the C lookup a sort or `heapq.nlargest` calls). The owner drops a
    node's key whenever its score leaves `scores`."""

    __slots__ = ("scores",)

    def __init__(self, scores: dict[str, float]) -> None:
        super().__init__()
        self.scores = scores

    def __missing__(self, name: str) -> tuple[float, int]:
        key = self[name] = (self.scores[name], _tiebreak(name))
        return key


def _top_of(keys: RankKeys, names: list[str]) -> dict[str, int]:
    """`_rank_of(keys.scores, names, scored=True)` (every name feasible): the ten largest keys in one pass, as
    `sorted(..., reverse=True)[:10]` orders them (equal keys in `names`' order), where `_rank_of` sorted and
    tie-broke the hundreds of nodes tied at the best score. A name asked twice among them: `_rank_of`'s way."""
    top = heapq.nlargest(MAX_PRIORITY, names, key=keys.__getitem__)
    if len(set(top)) < len(top):
        return _rank_of(keys.scores, names, scored=True)
    return {n: MAX_PRIORITY - i for i, n in enumerate(top)}


@dataclass(slots=True)
class _Order:
    """Every feasible node of a memoised evaluation in the rank mapping's order, kept rising (`RankKeys` ascending,
    equal keys in any order) and read from the end: the best ten of a subset are the last ten of its nodes along it,
    found by a C-level filter that stops there (~10 % of the nodes asked: ~100 steps), where `heapq.nlargest` looks at
    every node asked. A changed node leaves and comes back by bisect on the keys as they are (`RankKeys.__getitem__`,
    a C call: a key function negating them was ~5 % of the scale replay's CPU)."""

    rising: list[str]
    keys: RankKeys

    @classmethod
    def of(cls, keys: RankKeys, by_crc: list[str]) -> _Order:
        """A stable sort by score of the feasible nodes taken in tie-break order from `by_crc` (every node of the
        state, `_tiebreak` descending: the same for every shape), reversed: crc32 values are multi-digit ints, which a
        sort compares slowly, and a fresh sort of them for each shape was most of a build."""
        scores = keys.scores
        names = list(filter(scores.__contains__, by_crc))
        if len(names) != len(scores):  # a feasible node the state no longer has (refreshed away at the next change)
            names = sorted(scores, key=_tiebreak, reverse=True)
        names.sort(key=scores.__getitem__, reverse=True)
        names.reverse()
        return cls(names, keys)

    def drop(self, name: str) -> None:
        """`name` leaves (its key still in `keys`, and every other node's)."""
        rising = self.rising
        at = bisect.bisect_left(rising, self.keys[name], key=self.keys.__getitem__)
        while rising[at] != name:  # another node with an equal key (a crc collision) comes first
            at += 1
        del rising[at]

    def add(self, name: str) -> None:
        self.rising.insert(bisect.bisect_right(self.rising, self.keys[name], key=self.keys.__getitem__), name)

    def first(self, names: list[str], count: int) -> list[str]:
        """The first `count` nodes of `names` (feasible nodes of this evaluation, each once or more) in rank order."""
        return list(itertools.islice(filter(set(names).__contains__, reversed(self.rising)), count))


def _rank_of(scores: dict[str, float], names: list[str], *, scored: bool = False) -> dict[str, int]:
    """The rank mapping of the feasible `names` (`scores` holds every feasible node and more): what
    `Ranked.of(subset's scores).priorities()` gives (the subset in `names`' order), without building the subset.

    Hundreds of nodes often tie at the best score (every empty node, every node of a class), so only the nodes at or
    above the tenth best score are ordered by the tie-break, and by C-level sorts: a sort by score alone (stable, so
    ties keep `names`' order), a binary search for the cut, then the two sorts `Ranked.of` does on what is left.
    `scored`: every name is in `scores` (/filter's own answer), so none is looked up to be left out."""
    by_score = sorted(names if scored else filter(scores.__contains__, names), key=scores.__getitem__, reverse=True)
    if len(by_score) > MAX_PRIORITY:
        tenth = scores[by_score[MAX_PRIORITY - 1]]
        cut = bisect.bisect_right(by_score, -tenth, lo=MAX_PRIORITY, key=lambda n: -scores[n])
        picked = by_score[:cut]
    else:
        picked = by_score
    unique = picked
    if len(set(picked)) < len(picked):  # a name asked twice is where it came first
        if len(by_score) > MAX_PRIORITY:  # it counted twice towards the tenth best score: once each, the slow way
            return _rank_of(scores, list(dict.fromkeys(names)))
        unique = list(dict.fromkeys(picked))
    unique.sort(key=_crc_of(unique).__getitem__, reverse=True)
    unique.sort(key=scores.__getitem__, reverse=True)
    return {n: MAX_PRIORITY - i for i, n in enumerate(unique[:MAX_PRIORITY])}


_CRCS: dict[str, int] = {}


def _crc_of(names: list[str]) -> dict[str, int]:
    """`_tiebreak` of every name, as a dict whose `__getitem__` a sort calls in C (the cached function's call costs
    three times as much per name)."""
    crcs = _CRCS
    if not crcs.keys() >= set(names):  # the first call for a name only
        if len(crcs) > 65536:  # names come from requests: bounded like `_tiebreak`'s cache
            crcs.clear()
        crcs.update(zip(names, map(_tiebreak, names), strict=True))
    return crcs


def _shape(pod: PodInfo) -> tuple[object, ...]:
    """The key of the planner's per-shape caches: `PodInfo.shape_key` without the model where nothing reads it. Only
    a pod with a prefill or decode role has its model read (the GPU role order, NVLink to a counterpart, the role
    score: `vgpu.fit.role_rank`, `near_counterpart`, `role_parts` return before reading it otherwise), so the
    whole-card and multi-GPU pods of different models share one evaluation, where each model had its own and
    re-evaluated every node that changed since its own last pod (benchmarks/planner_profile.py scale). The container
    names are part of it: a failure's reason names the pod's containers (kube-scheduler shows it in the pod's
    FailedScheduling event), so a cached failure must be that of a pod named alike (pods of one workload are)."""
    key = pod.shape_key()
    names = tuple(c.container for c in pod.request.containers)
    if pod.model is None or pod.role.does_prefill or pod.role.does_decode:
        return (*key, names)
    return (key[0], key[1], None, *key[3:], names)  # shape_key's third item is the model


def _split_key(node: NodeState, split: _Shared) -> tuple[int, ...]:
    """What decides a split class's answer on this node (`Planner._multi_ties`): for a pod of one container, the states
    of the GPUs it takes in the fit's order ((rank key, index) over the candidate states, the first `take`: the GPUs of
    a state it takes are that state's lowest-index ones, so the states fix which); else the states of `split.split`
    of the node's GPUs in index order."""
    ranks = split.ranks
    if ranks is not None:
        picked = sorted((ranks[k], u.device.index, k) for u in node.gpus if (k := u.id_memo or u.state_id) in ranks)
        return tuple(t[2] for t in picked[: split.take])
    states = split.split
    assert states is not None
    return tuple([k for u in node.gpus if (k := u.id_memo or u.state_id) in states])  # a list: no generator to resume


def _flat_multi(
    shared: _Shared,
) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int, int], ...], bool]:
    """`_Shared.flat` of a several-slice answer: its slices' (state, which GPU of it) in order, each GPU's slices
    summed (`free_after` adds a GPU's slices before its term) at the position of its first, and whether any slice is
    past its state's first GPU. Plain loops: most classes of a `usual` cluster give their answer to ~10 nodes."""
    assert shared.multi is not None
    picks: list[tuple[int, int]] = []
    adds: dict[tuple[int, int], list[int]] = {}
    deep = False
    for _, slices in shared.multi:
        for state, n, mem, cores in slices:
            pick = (state, n)
            one = adds.get(pick)
            if one is None:
                adds[pick] = [len(picks), mem, cores]
            else:
                one[1] += mem
                one[2] += cores
            picks.append(pick)
            if n:
                deep = True
    return tuple(picks), tuple([(a[0], a[1], a[2]) for a in adds.values()]), deep


def _own_names(result: NodeResult, pod: PodInfo) -> NodeResult:
    """`result` naming `pod`'s own containers, which the Assignment /bind writes must (vgpu.assignment_check refuses
    any other at the device plugin's Allocate): a safeguard, as the per-shape caches' key (`_shape`) holds the
    container names (`PodRequest.shape` leaves them out; one container per request, in spec order)."""
    placement = result.placement
    if placement is None:
        return result
    names = [r.container for r in pod.request.containers]
    if [c.name for c in placement.containers] == names:
        return result
    containers = tuple(
        ContainerAssignment(name=n, devices=c.devices) for c, n in zip(placement.containers, names, strict=True)
    )
    return NodeResult(NodePlacement(placement.node, containers), score=result.score, failure=result.failure)


def _idle(node: NodeState) -> set[str]:
    return {u.device.uuid for u in node.gpus if not u.holders}


_GPU_RANKS: dict[str, GpuRank] = {"binpack": FULLEST_FIRST, "spread": EMPTIEST_FIRST}


@functools.lru_cache(maxsize=65536)
def _tiebreak(name: str) -> int:
    """A stable per-node order (the same in every process), so equal scores break ties consistently."""
    return zlib.crc32(name.encode())


def to_priorities(scores: dict[str, float], mapping: PriorityMapping = "rank") -> dict[str, int]:
    """Map fine scores onto kube-scheduler's integer 0..10; nodes left out score 0.

    rank (default): the best ten nodes by (score, stable per-node tie-break) get 10, 9, ..., 1. Measured on
    openb (docs/packing.md): kube-scheduler's random choice among equal top scores costs about 5 points of
    unallocated GPU against a consistent order, and min-max buckets about 6.
    minmax: every node scaled linearly between the worst (0) and the best (10) score.
    """
    if not scores:
        return {}
    if mapping == "minmax":
        values = scores.values()
        lo, hi = min(values), max(values)
        if hi - lo < 1e-12:
            return dict.fromkeys(scores, MAX_PRIORITY)
        k = MAX_PRIORITY / (hi - lo)
        return {n: int((s - lo) * k + 0.5) for n, s in scores.items()}
    return _rank(scores)


def _rank(scores: dict[str, float]) -> dict[str, int]:
    """The rank mapping, linear in the number of nodes even when thousands tie at the top score."""

    def key(n: str) -> tuple[float, int]:
        return (scores[n], _tiebreak(n))

    if len(scores) <= MAX_PRIORITY:
        order = sorted(scores, key=key, reverse=True)
    else:
        tenth = heapq.nlargest(MAX_PRIORITY, scores.values())[-1]
        above = sorted([n for n, s in scores.items() if s > tenth], key=key, reverse=True)
        tied = [n for n, s in scores.items() if s == tenth]
        order = above + heapq.nlargest(MAX_PRIORITY - len(above), tied, key=_tiebreak)
    return {n: MAX_PRIORITY - i for i, n in enumerate(order)}


@dataclass(slots=True)
class Ranked:
    """The first nodes of the rank mapping's order (score, then `_tiebreak`, both descending; equal keys in the
    scores' dict order): exactly the nodes whose key is above `bound` (every node left out is at or below it), in
    order, followed by some at `bound`. `keys` holds each entry's negated key, ascending, for bisect."""

    names: list[str]
    keys: list[tuple[float, int]]
    bound: tuple[float, int] | None  # None: every feasible node is in `names`

    @classmethod
    def of(cls, scores: dict[str, float], size: int) -> Ranked:
        """The first `size` nodes, by two sorts with C-level keys: crc first, then a stable sort by score."""
        if len(scores) <= size:
            picked, bound = list(scores), False
        else:
            least = heapq.nlargest(size, scores.values())[-1]
            picked, bound = [n for n, s in scores.items() if s >= least], True
        picked.sort(key=_tiebreak, reverse=True)
        picked.sort(key=scores.__getitem__, reverse=True)
        del picked[size:]
        keys = [(-scores[n], -_tiebreak(n)) for n in picked]
        return cls(picked, keys, keys[-1] if bound and keys else None)

    def update(self, touched: Iterable[str], scores: dict[str, float]) -> None:
        """Nodes in `touched` changed (re-recorded at the end of `scores` in this order, or no longer feasible)."""
        gone = set(touched)
        if not gone.isdisjoint(self.names):  # (in C: most changed nodes are not among the first ones)
            keep = [i for i, n in enumerate(self.names) if n not in gone]
            self.names = [self.names[i] for i in keep]
            self.keys = [self.keys[i] for i in keep]
        for name in touched:
            score = scores.get(name)
            if score is None:
                continue
            key = (-score, -_tiebreak(name))
            if self.bound is None or key < self.bound:  # a node at the bound may follow others left out
                at = bisect.bisect_right(self.keys, key)  # after equal keys: it is last in the dict order
                self.keys.insert(at, key)
                self.names.insert(at, name)

    def priorities(self) -> dict[str, int] | None:
        """The rank mapping, or None when fewer than its ten nodes are known to be in order."""
        if len(self.names) < MAX_PRIORITY and self.bound is not None:
            return None
        return {n: MAX_PRIORITY - i for i, n in enumerate(self.names[:MAX_PRIORITY])}


class Planner:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.config = state.config
        self._policies: dict[str, NodePolicy] = {}
        self._cache: OrderedDict[tuple[object, ...], dict[str, tuple[int, NodeResult]]] = OrderedDict()
        self._memo: OrderedDict[tuple[object, ...], _Memo] = OrderedDict()
        self._shapes: OrderedDict[tuple[object, ...], ShapeMemo] = OrderedDict()  # per (pod shape, config)
        # Per `_cache` key: each node class's evaluation (see `_Shared`), for the policies and shapes it holds for.
        self._classes: OrderedDict[tuple[object, ...], Classes] = OrderedDict()
        self._crc_order: tuple[int, list[str]] | None = None  # `_by_crc`
        # (shape, policy, config) -> the policy epoch its caches are at: a cache of an older epoch is never read again
        # (a key holds the current epoch), and each holds a result per node, which every full garbage collection walks.
        self._epochs: dict[tuple[object, ...], object] = {}
        # Called with the number of names after each pass over them that built a new memoised evaluation: the
        # extender's process freezes the results a pass keeps (scheduler_extender.gcpause.settle).
        self.after_pass: Callable[[int], None] | None = None
        # `_resolved`'s last pod and its answer (one pod's /filter, /prioritize, hold and /bind ask about the same
        # PodInfo object several times), and `_absent`'s stand-in pod and its shape by the pod's shape.
        self._last_pod: tuple[PodInfo, NodePolicy, GpuRank, tuple[object, ...]] | None = None
        self._absent_pods: dict[tuple[object, ...], tuple[PodInfo, tuple[object, ...]]] = {}
        # `_config_id`: a number for each placement config met, the last one's kept by identity.
        self._config_ids: dict[PlacementConfig, int] = {}
        self._config_last: tuple[PlacementConfig, int] | None = None
        self.policy(self.config.node_policy)  # fail fast on a bad cluster default

    def policy(self, name: str) -> NodePolicy:
        pol = self._policies.get(name)
        if pol is None:
            pol = self._policies[name] = registry.create(name)
        return pol

    def observe(self, pod: PodInfo) -> None:
        """Tell the pod's policy that this pod arrived (once per pod), before scoring nodes for it."""
        self._resolve(pod)[0].observe(pod)

    def _resolve(self, pod: PodInfo) -> tuple[NodePolicy, GpuRank]:
        overrides = ann.PodOverrides(node_policy=pod.node_policy, gpu_policy=pod.gpu_policy)
        registry.check_pod_overrides(overrides, experimental=self.config.experimental_policies)
        node_policy = self.policy(pod.node_policy or self.config.node_policy)
        gpu_name = pod.gpu_policy or self.config.gpu_policy
        if gpu_name is None:
            return node_policy, node_policy.gpu_rank
        if gpu_name not in _GPU_RANKS:  # only a bad cluster default gets here: the pod's own was checked above
            raise UnknownPolicyError(f"unknown GPU policy {gpu_name!r}; allowed: {', '.join(sorted(_GPU_RANKS))}")
        return node_policy, _GPU_RANKS[gpu_name]

    def _config_id(self) -> int:
        """`state.config` in the caches' keys, as a number: equal configs get the same one, as the config itself in a
        key did, but a frozen dataclass of a dozen fields is hashed at each lookup (~3.5 us; ~20 lookups a pod)."""
        config = self.state.config
        last = self._config_last
        if last is not None and last[0] is config:
            return last[1]
        n = self._config_ids.setdefault(config, len(self._config_ids))  # kept: never a number for another config
        self._config_last = (config, n)
        return n

    def _resolved(self, pod: PodInfo) -> tuple[NodePolicy, GpuRank, tuple[object, ...]]:
        """`_resolve(pod)` and `_shape(pod)`, kept for the last pod object asked (a PodInfo is immutable, the planner's
        config and policy objects fixed; a pod that raises is not kept)."""
        last = self._last_pod
        if last is not None and last[0] is pod:
            return last[1], last[2], last[3]
        policy, rank = self._resolve(pod)
        shape = _shape(pod)
        self._last_pod = (pod, policy, rank, shape)
        return policy, rank, shape

    def rank_on(self, node: NodeState, pod: PodInfo) -> GpuRank:
        """The GPU order the pod's policy uses on this node, as an evaluation does (vgpu.preemption needs it)."""
        policy, rank = self._resolve(pod)
        node_rank = getattr(policy, "node_gpu_rank", None)
        if node_rank is not None and rank == policy.gpu_rank:
            return node_rank(node, pod)  # type: ignore[no-any-return]
        return rank

    def evaluate_node(self, node_name: str, pod: PodInfo) -> NodeResult:
        """Uncached: the fresh-state decision used at bind time."""
        node_policy, rank = self._resolve(pod)
        return self._drawn(node_name, pod, node_policy, self._evaluate(node_name, pod, node_policy, rank))

    def evaluate_beside(self, node_name: str, pod: PodInfo, stand_ins: Iterable[tuple[str, Assignment]]) -> NodeResult:
        """`evaluate_node` as if the state held `stand_ins` too (`ClusterState.with_stand_ins`: applied in turn, those
        that do not fit left out), on a copy of the node: the state, its versions and every memo stay as they were."""
        node_policy, rank = self._resolve(pod)
        view = self.state.with_stand_ins(node_name, stand_ins)
        return self._drawn(node_name, pod, node_policy, self._evaluate(node_name, pod, node_policy, rank, view=view))

    @staticmethod
    def _drawn(name: str, pod: PodInfo, policy: NodePolicy, result: NodeResult) -> NodeResult:
        """Add the policy's per-pod part of the score, if it has one (see PodScored)."""
        pod_score = getattr(policy, "pod_score", None)
        if pod_score is None or result.placement is None:
            return result
        return NodeResult(result.placement, score=result.score + pod_score(name, pod))

    def _shape_memo(self, pod: PodInfo, shape: tuple[object, ...] | None = None) -> ShapeMemo:
        """The shape's `ShapeMemo` (`shape`: `_shape(pod)`, where the caller has it)."""
        key = (_shape(pod) if shape is None else shape, self._config_id())
        memo = self._shapes.get(key)
        if memo is None:
            memo = self._shapes[key] = ShapeMemo()
            if len(self._shapes) > _CACHED_SHAPES:
                self._shapes.popitem(last=False)
        return memo

    def _evaluate(
        self,
        node_name: str,
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        memo: ShapeMemo | None = None,
        classes: Classes | None = None,
        *,
        view: NodeState | None = None,
        record: bool = True,
    ) -> NodeResult:
        """`classes` (with `memo`): node classes already evaluated for this shape, policy and epoch; a node of a known
        class takes its class's answer on its own GPUs, the first of a class records it (see `_Shared`). `view`: the
        node to evaluate instead of the state's (uncached callers only: no memo, no classes). `record` False (the warm
        path's re-evaluation of a node a bind changed): a known class still answers, but a node evaluated afresh records
        nothing. Such a node is in a state no other node of the shape met: in the warm loop (planner_profile.py warm)
        none of 579 re-evaluated nodes was in a class met before, nor in one met by a coarser key (per GPU its slot,
        free share, prefill and sharers; the host), so `_share` and `_share_tied` were work no node read."""
        node = self.state.nodes.get(node_name) if view is None else view
        if node is None:
            return NodeResult(None, failure=FitFailure("node has no vGPU inventory (device plugin not running?)"))
        ckey: int | None = None
        multi = False  # several slices: `_share_multi` decides whether the class may stand for the node
        into: tuple[_Shared, tuple[int, ...]] | None = None  # a split class and this node's order of its tied states
        if classes is not None:
            ckey = node.class_key
            shared = classes.get(ckey)
            if shared is not None and shared is not _PER_NODE:
                if shared.split is None:
                    return self._of_class(node, shared)
                order = _split_key(node, shared)
                known = shared.splits.get(order) if shared.splits is not None else None
                if known is None and shared.steps is not None and shared.by_picks is not None:
                    known = shared.by_picks.get(self._picks(node, pod, shared.steps))
                    if known is not None and shared.splits is not None:
                        shared.splits[order] = known  # this interleaving's answer from now on
                if known is not None:
                    return self._of_class(node, known)
                into = (shared, order)
            elif shared is not None:
                ckey = None
            reqs = pod.request.containers
            multi = len(reqs) != 1 or reqs[0].count != 1
            if not record:
                ckey = None
        node_rank = getattr(policy, "node_gpu_rank", None)  # optional: see NodeAwareRank
        if node_rank is not None and rank == policy.gpu_rank:
            rank = node_rank(node, pod)  # the policy orders GPUs knowing the whole node
        fit = fit_node(node, pod, self.config, rank, memo)
        if isinstance(fit, FitFailure):
            if ckey is not None and classes is not None and memo is not None:
                failed = _Shared(None, failure=fit, result=NodeResult(None, failure=fit))
                if multi:
                    self._record_multi(classes, ckey, node, pod, rank, into, None, failed)
                else:
                    classes[ckey] = failed if memo.shared else _PER_NODE
            return NodeResult(None, failure=fit)
        policy_score = policy.score(node, fit, pod)
        base, head = role_parts(node, fit, pod, self.config.roles)
        score = policy_score + (base if head is None else base + head)  # what role_score returns, the same float
        if ckey is not None and classes is not None and memo is not None and not multi:
            classes[ckey] = self._share(node, fit, policy_score, base, head, score) if memo.shared else _PER_NODE
            if memo.tied and classes[ckey] is not _PER_NODE:
                classes[ckey] = self._share_tied(node, fit, pod, policy, memo, classes[ckey])
        added: float | None = None
        if self.config.topology and self.config.topology_weight and any(len(c.devices) > 1 for c in fit.containers):
            linked = placement_score(node.topology, fit.containers, lambda: _idle(node))
            if linked is not None:  # a multi-GPU pod: nodes that give a connected set score higher
                added = self.config.topology_weight * linked
                score += added
        if ckey is not None and classes is not None and multi:
            answer = self._share_multi(node, fit, (policy_score, base, head, score, added))
            self._record_multi(classes, ckey, node, pod, rank, into, fit, answer)
        return NodeResult(fit, score=score)

    def _record_multi(
        self,
        classes: Classes,
        ckey: int,
        node: NodeState,
        pod: PodInfo,
        rank: GpuRank,
        into: tuple[_Shared, tuple[int, ...]] | None,
        fit: NodePlacement | None,
        answer: _Shared,
    ) -> None:
        """Keep this node's `answer` for a pod of several slices (`fit`, None where it failed) as its class's
        (`_multi_ties`): for the class, for the node's order of the tied states of a split class (`into`), or not at
        all (`_PER_NODE`)."""
        if into is not None:
            split, order = into
            assert split.splits is not None
            split.splits[order] = answer
            self._record_picks(node, pod, split, answer)
            return
        found = self._multi_ties(node, pod, rank, fit)
        if found is None:
            classes[ckey] = _PER_NODE
            return
        ties, ranks, steps = found
        if not ties:
            classes[ckey] = answer
            return
        reqs = pod.request.containers
        split = _Shared(
            None,
            split=ties,
            splits={},
            ranks=ranks,
            take=reqs[0].count if ranks is not None else 0,
            steps=steps if len(reqs) > 1 else None,
        )
        assert split.splits is not None
        split.splits[_split_key(node, split)] = answer
        self._record_picks(node, pod, split, answer)
        classes[ckey] = split

    def _record_picks(self, node: NodeState, pod: PodInfo, split: _Shared, answer: _Shared) -> None:
        """Keep `answer`, this node's own, under its picks (`_picks`) too; where the picks are not the GPUs the fit
        took (a case `_picks` does not model), stop answering by picks for the class: its nodes split by interleaving
        only, as before."""
        steps, by_picks = split.steps, split.by_picks
        if steps is None or by_picks is None:
            return
        picks = self._picks(node, pod, steps)
        if answer.multi is not None:
            took = tuple(x for _, slices in answer.multi for k, n, _, _ in slices for x in (k, n))
            if picks != took:
                split.steps = split.by_picks = None
                return
        by_picks[picks] = answer

    def _picks(
        self, node: NodeState, pod: PodInfo, steps: tuple[dict[int, tuple[float, float]], ...]
    ) -> tuple[int, ...]:
        """What `fit_node` takes on a node of a split class for a pod of several containers (`_multi_ties` holds: a
        `StateRank`, a flat node, every GPU usable, no kubelet offer): each container in turn takes its `count` least
        GPUs by (its order key of the GPU's state, index) among those that can host its slice, a GPU holding earlier
        containers' slices judged with them (`vgpu.fit.judge_with`, as the fit does); each slice as (state, which GPU
        of that state in index order), flat; where a container has too few, (-1, its position) ends the key. The
        answer (`_share_multi`) reads only that, the class and the node's own headroom, so nodes with equal picks take
        one answer whatever the order of their other GPUs."""
        config = self.config
        reqs = pod.request.containers
        gpus = node.gpus
        states = [u.id_memo or u.state_id for u in gpus]
        extra: dict[int, list[int]] = {}
        out: list[int] = []
        for i, (req, keys) in enumerate(zip(reqs, steps, strict=True)):
            cands: list[tuple[tuple[float, float], int, int]] = []
            for pos, k in enumerate(states):
                key = keys.get(k)
                if key is None:
                    continue
                e = extra.get(pos)
                if e is not None and judge_with(gpus[pos], req, pod, config, False, None, e)[2] is not None:
                    continue  # it cannot take this slice beside the earlier containers' (the fit's own verdict)
                cands.append((key, gpus[pos].device.index, pos))
            if len(cands) < req.count:
                out += (-1, i)
                break
            cands.sort()
            for _, _, pos in cands[: req.count]:
                k = states[pos]
                out += (k, states[:pos].count(k))
                if i + 1 < len(reqs):
                    dev = gpus[pos].device
                    mem, cores = req.memory_on(dev.memory_mib), req.cores_on(dev.memory_mib)
                    e = extra.setdefault(pos, [0, 0, 0, 0])
                    e[0] += mem
                    e[1] += cores
                    e[2] += 1
                    e[3] += cores == 0
        return tuple(out)

    def _multi_ties(
        self, node: NodeState, pod: PodInfo, rank: GpuRank, fit: NodePlacement | None
    ) -> (
        tuple[frozenset[int], dict[int, tuple[float, float]] | None, tuple[dict[int, tuple[float, float]], ...]] | None
    ):
        """Whether `fit_node`'s answer for a pod of several slices (`fit`, None where it failed) depends only on the
        node's `NodeState.class_key` (None: it does not) and, where GPUs of several states rank equal, on how the
        GPUs of those states (the set returned, empty where none tie) interleave by index: on another node of the
        class, with its GPUs of those states in the same order of states, the k-th GPU (in index order) of a state
        stands for this node's k-th GPU of that state.

        That holds where the fit's order over the node's GPUs is by (state, index) alone: a `StateRank`, no GPU left
        out by UUID or model (a cordon, an unhealthy GPU, a pod's GPU filter), no kubelet offer, no NVLink or NUMA
        choice (a flat topology: `vgpu.topology.choose` then takes the policy's first GPUs). The states that tie are
        those that rank equal among the ones a one-container pod takes or passes over before its last one (the index
        interleaves them, as `_share_tied` handles for one slice), or among any a container of several could take (a
        container's candidates depend on the slices placed before it). A failure of a one-container pod counts every
        GPU with none placed yet. With the states, for a pod of one container that fits: each candidate state's order
        key (`_split_key`); and for every pod, each container's such keys (`_picks`)."""
        config = self.config
        inv = node.inventory
        if (
            not isinstance(rank, StateRank)
            or inv.kubelet is not None
            or inv.cordon.uuids
            or not (config.allow_unhealthy or node.all_healthy)
            or not node.topology.flat
            or pod.gpu_models is not None
            or pod.gpu_filter is not None
            or pod.require_nvlink
        ):
            return None
        reqs = pod.request.containers
        if fit is None and len(reqs) == 1:
            return frozenset(), None, ()
        ties: set[int] = set()
        keys: dict[int, tuple[float, float]] = {}
        steps: list[dict[int, tuple[float, float]]] = []
        by_role_order = config.roles.gpu_role_order and (pod.role.does_prefill or pod.role.does_decode)
        for i, req in enumerate(reqs):
            # Each state that could host one of the container's slices with nothing placed yet (a slice placed by an
            # earlier container only ever rules a GPU out), and `fit_node`'s order key there bar the index.
            keys = {}
            for u in node.state_groups:
                dev = u.device
                mem, cores = req.memory_on(dev.memory_mib), req.cores_on(dev.memory_mib)
                if mem > int(dev.memory_mib * config.memory_scaling) or cores > int(dev.cores * config.core_scaling):
                    continue
                if slice_blocker(u, mem, cores, pod.role, config) is not None:
                    continue
                keys[u.state_id] = (role_rank(u, pod) if by_role_order else 0, rank(u, mem, cores, pod))
            steps.append(keys)
            bound: tuple[float, float] | None = None
            if fit is not None and len(reqs) == 1:  # (a later container's bound depends on the states taken before)
                for d in fit.containers[i].devices:
                    key = keys.get(node.by_uuid[d.uuid].state_id)
                    if key is None:
                        return None
                    bound = key if bound is None or key > bound else bound
            first: dict[tuple[float, float], int] = {}
            for state, key in keys.items():
                if bound is None or key <= bound:
                    other = first.setdefault(key, state)
                    if other != state:
                        ties.update((other, state))
        return frozenset(ties), (keys if len(reqs) == 1 and fit is not None else None), tuple(steps)

    def _share_multi(
        self, node: NodeState, fit: NodePlacement, scored: tuple[float, float, float | None, float, float | None]
    ) -> _Shared:
        """The class's answer for a pod of several slices (`_multi_ties`), from this node's fit and `scored`: the
        policy's score, the role score's base and headroom, the whole score and the topology term in it. The policy's
        score (the fgd family's reads the GPUs' frees sorted) and the role score's base read only the chosen GPUs'
        states and what the class key holds; the headroom sums every GPU's term in index order, so it is the node's
        own unless clear of its cap (`_share`'s way); a flat node's topology term is the same on every one."""
        policy_score, base, head, score, added = scored
        nth: dict[str, int] = {}
        counts: dict[int, int] = {}
        for u in node.gpus:
            k = u.state_id
            n = counts.get(k, 0)
            nth[u.device.uuid] = n
            counts[k] = n + 1
        by_uuid = node.by_uuid
        layout = tuple(
            (c.name, tuple((by_uuid[d.uuid].state_id, nth[d.uuid], d.memory_mib, d.cores) for d in c.devices))
            for c in fit.containers
        )
        rules = self.config.roles
        capped = head is None or free_after(node, fit) >= rules.pair_headroom_gpus * (1 + 1e-9)
        return _Shared(
            None, policy_score=policy_score, role_base=base, score=score if capped else None, multi=layout, linked=added
        )

    def _of_multi(self, node: NodeState, shared: _Shared, firsts: dict[int, GpuUsage] | None = None) -> NodeResult:
        """The class's answer for a pod of several slices on this node: for each slice the node's own GPU of the same
        state and rank in index order (the placement made when read); the class's score, or with the node's own
        headroom (`free_after`'s and `role_parts`' arithmetic on the answer's slices, without a placement: the same
        terms, replaced at the same positions, summed in index order). `firsts`: the node's `first_of_state`, where
        the caller has it."""
        if firsts is None:
            firsts = node.first_of_state
        score = shared.score
        if score is not None:  # the devices alone (each class's answer is read by ~10 nodes: no `flat` to make)
            assert shared.multi is not None
            devs: list[GpuDevice] = []
            by_state: dict[int, list[GpuDevice]] | None = None
            for _, slices in shared.multi:
                for state, n, _, _ in slices:
                    if n == 0:
                        devs.append(firsts[state].device)
                        continue
                    if by_state is None:
                        by_state = {}
                        for u in node.gpus:
                            by_state.setdefault(u.id_memo or u.state_id, []).append(u.device)
                    devs.append(by_state[state][n])
            return NodeResult.of_class(node.name, tuple(devs), shared, score)
        flat = shared.flat
        if flat is None:
            flat = shared.flat = _flat_multi(shared)
        picks, adds, deep = flat
        us: list[GpuUsage] = []  # plain loops: a comprehension is a call of its own a node (CPython 3.11)
        if deep:
            members: dict[int, list[GpuUsage]] = {}
            for u in node.gpus:
                k = u.id_memo or u.state_id
                of = members.get(k)
                if of is None:
                    members[k] = [u]
                else:
                    of.append(u)
            for state, n in picks:
                us.append(members[state][n])
        else:
            for state, _ in picks:
                us.append(firsts[state])
        out = list(free_terms(node))
        positions = node.positions
        for at, mem, cores in adds:
            u = us[at]
            dev = u.device
            used = max((u.memory_used + mem) / dev.memory_mib, (u.cores_used + cores) / dev.cores)
            out[positions[dev.uuid]] = max(0.0, 1.0 - used)
        rules = self.config.roles
        head = rules.headroom_weight * min(1.0, sum(out) / rules.pair_headroom_gpus)
        score = shared.policy_score + (shared.role_base + head)
        if shared.linked is not None:
            score += shared.linked
        return NodeResult.of_class(node.name, tuple([u.device for u in us]), shared, score)

    def _share(
        self, node: NodeState, fit: NodePlacement, policy_score: float, base: float, head: float | None, score: float
    ) -> _Shared:
        if len(fit.containers) != 1 or len(fit.containers[0].devices) != 1:
            return _PER_NODE
        c = fit.containers[0]
        d = c.devices[0]
        state = node.by_uuid[d.uuid].state_id
        rules = self.config.roles
        # The free GPU-equivalents are a float sum in GPU index order, so nodes of a class may differ in its last
        # bits; clear of the cap by far more than that, min(1, free / cap) is exactly 1 on each of them.
        capped = head is None or free_after(node, fit) >= rules.pair_headroom_gpus * (1 + 1e-9)
        return _Shared(state, c.name, d.memory_mib, d.cores, policy_score, base, score if capped else None)

    def _share_tied(
        self, node: NodeState, fit: NodePlacement, pod: PodInfo, policy: NodePolicy, memo: ShapeMemo, chosen: _Shared
    ) -> _Shared:
        """`chosen` and the answer for each other state that ranked equal, as this node would score a slice there
        (the policy's GPU order for this node is still the last it made)."""
        tied = {chosen.state: chosen} if chosen.state is not None else {}
        name = fit.containers[0].name
        for u in memo.tied[1:]:
            slot = memo.slots.get(u.id_memo or u.state_id)
            if slot is None:  # the memo started over during the fit (it is bounded)
                return _PER_NODE
            dev = u.device
            slc = DeviceSlice(uuid=dev.uuid, index=dev.index, memory_mib=slot[0], cores=slot[1])
            alt = NodePlacement(node.name, (ContainerAssignment(name=name, devices=(slc,)),))
            policy_score = policy.score(node, alt, pod)
            base, head = role_parts(node, alt, pod, self.config.roles)
            score = policy_score + (base if head is None else base + head)
            one = self._share(node, alt, policy_score, base, head, score)
            if one.state is None:
                return _PER_NODE
            tied[one.state] = one
        chosen.tied = tied  # in place: `chosen` is this node's own, made by `_share` just now and held by no result yet
        return chosen

    def _of_class(self, node: NodeState, shared: _Shared, firsts: dict[int, GpuUsage] | None = None) -> NodeResult:
        """The class's answer on this node: its first GPU in the chosen state, the same slice and score. `firsts`: the
        node's `first_of_state`, where the caller has it."""
        if shared.multi is not None:
            return self._of_multi(node, shared, firsts)
        if shared.state is None:
            return NodeResult(None, failure=shared.failure)
        if firsts is None:
            firsts = node.first_of_state
        state = shared.state
        if shared.tied is not None:
            low = None
            for tied_state, one in shared.tied.items():
                at = firsts[tied_state].device.index
                if low is None or at < low:
                    low, shared, state = at, one, tied_state
        u = firsts[state]
        score = shared.score
        if score is None:
            head = headroom_one(node, u, shared.memory_mib, shared.cores, self.config.roles)
            score = shared.policy_score + (shared.role_base + head)
        return NodeResult.of_class(node.name, u.device, shared, score)

    def _classes_for(self, key: tuple[object, ...], pod: PodInfo, policy: NodePolicy, rank: GpuRank) -> Classes | None:
        """The node classes of this memoised shape, or None where a class cannot stand for its nodes: a policy whose
        score reads more than the class (those that do not say `class_scored`: the fgd family, binpack, spread and
        three of the paper's baselines), a GPU order that reads more than the GPU's state (an override that is not a
        `StateRank`), a per-pod score, a pod asking no GPU. A pod of several slices may take a class's answer too
        (`_multi_ties` says where)."""
        if (
            not getattr(policy, "class_scored", False)
            or (rank != policy.gpu_rank and not isinstance(rank, StateRank))
            or hasattr(policy, "pod_score")
            or not pod.request.containers
        ):
            return None
        classes = self._classes.get(key)
        if classes is None:
            classes = self._classes[key] = {}
            if len(self._classes) > _CACHED_SHAPES:
                self._classes.popitem(last=False)
        elif len(classes) > max(_CLASSES_MIN, 2 * len(self.state.nodes)):
            # Every node state met keeps its class (`class_key`s are never met again once churn moves the node on):
            # a shape's classes grew without bound at a steady epoch. The live ones come back on the next nodes.
            classes.clear()
        return classes

    def _memo_for(
        self, pod: PodInfo, names: list[str], *, known_names: bool = False
    ) -> tuple[_Memo, dict[str, tuple[int, NodeResult]], NodePolicy, GpuRank]:
        """The up-to-date memoised evaluation of this pod's shape over `names` or a superset of them. `known_names`:
        every name has an inventory (the extender leaves the others out first)."""
        key, memo, cache, policy, rank, fits, classes = self._prepared(pod)
        known = (
            memo is not None and memo.passed is not None and memo.passed[0] is names and memo.passed[1] == memo.version
        )
        if (
            memo is not None
            and not known
            and not (known_names and memo.covers == self.state.names_version)
            and memo.names != names
            and not memo.name_set.issuperset(names)
        ):
            self._extend(memo, names, cache, pod, policy, rank, fits, classes)
        if memo is not None and memo.stale and not known:
            self._freshen(memo, names, cache, pod, policy, rank, fits, classes)
        if memo is None:
            out = Evaluation()
            self._fill(out, names, cache, pod, policy, rank, fits, classes)
            name_set = set(names)
            # A caller may name a node twice: the memo keeps each name once, as `_extend` does, so that a later call
            # over every name still equals its names and takes `_filter_every` while the memo lives.
            unique = names if len(name_set) == len(names) else list(dict.fromkeys(names))
            memo = self._memo[key] = _Memo(unique, name_set, self.state.version, out)
            nodes = self.state.nodes
            if len(memo.name_set) >= len(nodes) and memo.name_set.issuperset(nodes):
                memo.covers = self.state.names_version
            if len(self._memo) > _CACHED_SHAPES:
                self._memo.popitem(last=False)
            if self.after_pass is not None:
                self.after_pass(len(names))
        return memo, cache, policy, rank

    def _prepared(
        self, pod: PodInfo
    ) -> tuple[
        tuple[object, ...],
        _Memo | None,
        dict[str, tuple[int, NodeResult]],
        NodePolicy,
        GpuRank,
        ShapeMemo,
        Classes | None,
    ]:
        """The pod's memoised evaluation's key, the evaluation brought up to date by `_refresh` (None: there is none, or
        too much changed), the shape's per-node cache, policy, GPU order, shape memo and node classes."""
        policy, rank, shape = self._resolved(pod)
        key: tuple[object, ...] = (shape, policy.name, policy.epoch, self._config_id())
        memo_key = self._memo_key(key, pod, policy)
        cache = self._shape_cache(key)
        fits = self._shape_memo(pod, shape)
        classes = self._classes_for(key, pod, policy, rank)
        memo = self._memo.get(memo_key)
        if memo is not None:
            self._memo.move_to_end(memo_key)
            if memo.version != self.state.version and not self._refresh(memo):
                memo = None
        return memo_key, memo, cache, policy, rank, fits, classes

    def _shape_cache(self, key: tuple[object, ...]) -> dict[str, tuple[int, NodeResult]]:
        """The per-node cache of (shape, policy, epoch, config) `key`, made on first use (most recent last)."""
        cache = self._cache.get(key)
        if cache is None:
            self._drop_old_epoch(key)
            cache = self._cache[key] = {}
            if len(self._cache) > _CACHED_SHAPES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return cache

    def _absent(self, pod: PodInfo, policy: NodePolicy, rank: GpuRank) -> _Absent | None:
        """For a P/D pod with a model: the same pod with a model no node runs (`_ABSENT`) and its shape's caches. On a
        node that runs neither the pod's model nor `_ABSENT` (`NodeState.models`), every read of the model (the GPU
        role order, NVLink to a counterpart, the role score's complementarity and locality) compares it with the
        models there and finds no match either way, so the two decide alike: pods of every model share one evaluation
        of such a node, where each model re-evaluated every node that changed since its own last pod."""
        if pod.model is None or not (pod.role.does_prefill or pod.role.does_decode):
            return None
        # One stand-in a shape and container names (`_shape` holds the model for these pods): it decides as the
        # stand-in of any pod of the shape, and a node evaluated afresh through it names the asking pod's containers
        # in a failure, as the uncached evaluation does (a cached result names whichever pod filled it: `_own_names`).
        names = tuple(c.container for c in pod.request.containers)
        at = (self._resolved(pod)[2], names)
        known = self._absent_pods.get(at)
        if known is None:
            if len(self._absent_pods) >= _CACHED_SHAPES:
                self._absent_pods.clear()
            stand_in = dataclasses.replace(pod, model=_ABSENT)
            known = self._absent_pods[at] = (stand_in, _shape(stand_in))
        stand_in, shape = known
        key = (shape, policy.name, policy.epoch, self._config_id())
        return _Absent(
            stand_in,
            self._shape_cache(key),
            self._shape_memo(stand_in, shape),
            self._classes_for(key, stand_in, policy, rank),
            key,
        )

    def _extend(
        self,
        memo: _Memo,
        names: list[str],
        cache: dict[str, tuple[int, NodeResult]],
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        fits: ShapeMemo,
        classes: Classes | None,
    ) -> None:
        """Add the names of `names` that `memo` lacks, from the per-node cache (evaluated where a node changed), at the
        end in `names`' order, as a refresh records changed nodes: kube-scheduler's window moves on each call (~10 %
        of the nodes, where the last one stopped), so a memo made over one window, as every shape's is after a relearn,
        was made again over the next window on every call (~1 us a name) and never came to cover the cluster."""
        new = [n for n in dict.fromkeys(names) if n not in memo.name_set]
        ev = memo.evaluation
        self._fill(ev, new, cache, pod, policy, rank, fits, classes)
        memo.names = memo.names + new
        memo.name_set.update(new)
        if memo.order is not None:
            for name in new:
                if name in ev.scores:
                    memo.order.add(name)
        ev.priorities = None
        if ev.ranked is not None:
            ev.ranked.update(new, ev.scores)
        memo.subset = memo.passed = None  # `passed` may say "every feasible node", which it no longer is
        memo.positions = memo.out_at = None
        nodes = self.state.nodes
        if len(memo.name_set) >= len(nodes) and memo.name_set.issuperset(nodes):
            memo.covers = self.state.names_version
        if self.after_pass is not None:
            self.after_pass(len(new))

    def _drop_old_epoch(self, key: tuple[object, ...]) -> None:
        """Forget the caches, node classes and memoised evaluation of `key`'s shape, policy and config at another
        epoch: after a relearn they would only wait for the LRU bound (256 shapes x 5,000 results)."""
        shape, name, epoch, config = key
        base = (shape, name, config)
        old = self._epochs.get(base)
        if old is not None and old != epoch:
            stale = (shape, name, old, config)
            self._cache.pop(stale, None)
            self._classes.pop(stale, None)
            self._memo.pop(stale, None)
        if len(self._epochs) >= 4 * _CACHED_SHAPES:
            self._epochs.clear()
        self._epochs[base] = epoch

    @staticmethod
    def _memo_key(key: tuple[object, ...], pod: PodInfo, policy: NodePolicy) -> tuple[object, ...]:
        """The memoised evaluation's key: per shape, or per pod where scores differ per pod (fits stay per shape)."""
        return (*key, pod.key, pod.uid) if hasattr(policy, "pod_score") else key

    def passing(self, pod: PodInfo, names: list[str], evaluation: Evaluation) -> list[str]:
        """The names of `names` that `evaluation` found feasible, in order (/filter's NodeNames). When `evaluation` is
        this planner's own answer for the pod over `names`, the list is remembered: `priorities_for` given it back
        while nothing changed takes it as exactly those nodes, with no set built and no name looked up again."""
        policy, _, shape = self._resolved(pod)
        memo = self._memo.get(self._memo_key((shape, policy.name, policy.epoch, self._config_id()), pod, policy))
        if memo is not None and memo.version == self.state.version and memo.subset is not None:
            sub_names, sub, sub_passed = memo.subset
            if evaluation is sub and sub_names == names:  # the subset's own feasible list, already in order
                memo.passed = (sub_passed, memo.version, False)
                return sub_passed
        out = list(filter(evaluation.feasible.__contains__, names))  # in C
        if memo is None or memo.version != self.state.version:
            return out
        if evaluation is memo.evaluation and not memo.stale and (names is memo.names or names == memo.names):
            # Every feasible node, each once (a name asked twice: the old path's dict order, so not remembered as all)
            memo.passed = (out, memo.version, len(out) == len(evaluation.feasible))
        return out

    def filter_names(
        self, pod: PodInfo, names: list[str], *, unknown: str | None = None
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """/filter's answer over `names`: the feasible names in order (remembered for `priorities_for` as `passing`
        remembers them), the failed and the unresolvable ones with their reasons. What `evaluate` then `passing`
        answer, without the subset's feasible and score dicts (/filter reads neither) and with one lookup of each name:
        every name asked that is not feasible is failed or unresolvable. `unknown`: a name may have no inventory, and
        fails with this reason, after the others (kept out of the planner's caches); None: each has one."""
        if unknown is not None:
            answer = self._filter_covered(pod, names)
            if answer is not None:
                return answer
            nodes = self.state.nodes
            known = list(filter(nodes.__contains__, names))
            passed, failed, unresolvable = self.filter_names(pod, known)
            if len(known) < len(names):  # a copy: the memoised evaluation's own dicts may have come back
                failed = {**failed, **dict.fromkeys((n for n in names if n not in nodes), unknown)}
            return passed, failed, unresolvable
        memo = self._memo_for(pod, names, known_names=True)[0]
        ev = memo.evaluation
        flags = list(map(ev.feasible.__contains__, names))
        passed = list(itertools.compress(names, flags))
        if names is memo.names or names == memo.names:  # every node: the memoised evaluation's own dicts
            memo.passed = (passed, memo.version, len(passed) == len(ev.feasible))
            return passed, ev.failed, ev.unresolvable
        memo.passed = (passed, memo.version, False)
        if len(passed) == len(names):
            return passed, {}, {}
        rest = list(itertools.compress(names, map(operator.not_, flags)))
        if not ev.unresolvable:
            return passed, dict(zip(rest, map(ev.failed.__getitem__, rest), strict=True)), {}
        return passed, _pick(ev.failed, rest), _pick(ev.unresolvable, rest)

    def _filter_covered(
        self, pod: PodInfo, names: list[str]
    ) -> tuple[list[str], dict[str, str], dict[str, str]] | None:
        """`filter_names` over `names` that may lack an inventory, from a shape's evaluation that covers every node
        (`_Memo.covers`) with one lookup of each name: a feasible node of an up-to-date evaluation has an inventory
        and is fresh, so only the few others are looked up again (stale ones evaluated now, as `_freshen` would).
        None (nothing done but the refresh): no such evaluation, or a name without an inventory (the caller's way)."""
        _, memo, cache, policy, rank, fits, classes = self._prepared(pod)
        if memo is None:
            return None
        nodes = self.state.nodes
        if memo.covers != self.state.names_version:
            if memo.cover_checked == self.state.names_version:
                return None
            # A node left (its name stays in the memo, stale or failed) or joined: once per change of the names.
            memo.cover_checked = self.state.names_version
            if len(memo.name_set) < len(nodes) or not memo.name_set.issuperset(nodes):
                return None
            memo.covers = self.state.names_version
        ev = memo.evaluation
        feasible = ev.feasible
        if (
            len(names) == len(memo.names)
            and len(memo.name_set) == len(nodes)  # with `covers`: the memo's names are the state's, no other
            and (names is memo.names or names == memo.names)
            and self._positions(memo)
        ):
            return self._filter_every(memo, names, cache, pod, policy, rank, fits, classes)
        flags = list(map(feasible.__contains__, names))
        at: list[int] = []
        if False in flags:
            at = list(itertools.compress(range(len(names)), map(operator.not_, flags)))
            stale, failed, unresolvable = memo.stale, ev.failed, ev.unresolvable
            due: set[str] = set()
            for i in at:
                name = names[i]
                if name not in nodes:
                    return None
                if name in stale:
                    due.add(name)
                elif name not in failed and name not in unresolvable:  # not in the memo: it does not cover `nodes`
                    return None
            if due:
                self._re_evaluate(memo, due, cache, pod, policy, rank, fits, classes)
                for i in at:
                    if names[i] in feasible:
                        flags[i] = True
        passed = list(itertools.compress(names, flags))
        if names is memo.names or names == memo.names:  # every node: the memoised evaluation's own dicts
            memo.passed = (passed, memo.version, len(passed) == len(feasible))
            return passed, ev.failed, ev.unresolvable
        memo.passed = (passed, memo.version, False)
        if len(passed) == len(names):
            return passed, {}, {}
        rest = [names[i] for i in at if not flags[i]]
        if not ev.unresolvable:
            return passed, dict(zip(rest, map(ev.failed.__getitem__, rest), strict=True)), {}
        return passed, _pick(ev.failed, rest), _pick(ev.unresolvable, rest)

    @staticmethod
    def _positions(memo: _Memo) -> bool:
        """Keep `_Memo.positions` and `_Memo.out_at` from now on; False where a name is in `memo.names` twice."""
        if memo.out_at is not None:
            return True
        positions = {n: i for i, n in enumerate(memo.names)}
        if len(positions) < len(memo.names):
            return False
        feasible = memo.evaluation.feasible
        memo.positions = positions
        memo.out_at = set(
            itertools.compress(range(len(memo.names)), map(operator.not_, map(feasible.__contains__, memo.names)))
        )
        return True

    def _filter_every(
        self,
        memo: _Memo,
        names: list[str],
        cache: dict[str, tuple[int, NodeResult]],
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        fits: ShapeMemo,
        classes: Classes | None,
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """`_filter_covered` over `names` equal to `memo.names`, each a node of the state once: the stale nodes evaluated
        (all of them, as a call over every name does), NodeNames `names` less the positions in `_Memo.out_at`."""
        if memo.stale:
            self._re_evaluate(memo, memo.stale, cache, pod, policy, rank, fits, classes)
        assert memo.out_at is not None
        passed: list[str] = []
        start = 0
        for at in sorted(memo.out_at):
            passed += names[start:at]
            start = at + 1
        passed += names[start:]
        ev = memo.evaluation
        memo.passed = (passed, memo.version, len(passed) == len(ev.feasible))
        return passed, ev.failed, ev.unresolvable

    def evaluate(self, pod: PodInfo, node_names: Iterable[str] | None = None) -> Evaluation:
        """Every candidate node's fit and score; raises UnknownPolicyError for a bad pod annotation.

        The result is shared and valid until the state changes (treat it as read-only): asking again
        for the same shape and nodes returns it as is, or brought up to date for just the nodes that
        changed since.
        """
        names = list(self.state.nodes) if node_names is None else list(node_names)
        memo = self._memo_for(pod, names)[0]
        if memo.names == names:
            return memo.evaluation
        if memo.subset is not None and memo.subset[0] == names:
            return memo.subset[1]
        sub, passed = _subset(memo.evaluation, names)  # e.g. kube-scheduler's ~10 % of the nodes
        memo.subset = (names, sub, passed)
        return sub

    def priorities_for(self, pod: PodInfo, node_names: list[str]) -> dict[str, int]:
        """0..10 priorities of the nodes kube-scheduler asks about (normally exactly those that passed
        /filter, whose scaling is then the memoised one; any other set is scaled over itself). Every key
        is one of `node_names`; nodes left out score 0."""
        memo = self._memo_for(pod, node_names)[0]
        passed = memo.passed
        if passed is not None and passed[0] is node_names and passed[1] == memo.version:  # /filter's own answer
            if passed[2]:
                return self.priorities(memo.evaluation)
            if self.config.priority_mapping == "rank":
                return self._top(memo, node_names)
        feasible = memo.evaluation.feasible
        if len(node_names) == len(feasible) and feasible.keys() == set(node_names):  # exactly the feasible nodes
            return self.priorities(memo.evaluation)
        if self.config.priority_mapping == "rank":  # the best ten of the names, without a subset evaluation
            return _rank_of(memo.evaluation.scores, node_names)
        return self.priorities(self.evaluate(pod, node_names))

    def _by_crc(self) -> list[str]:
        """Every node of the state in `_tiebreak` order, descending, kept while no node joins or leaves."""
        memo = self._crc_order
        if memo is None or memo[0] != self.state.names_version:
            memo = self._crc_order = (self.state.names_version, sorted(self.state.nodes, key=_tiebreak, reverse=True))
        return memo[1]

    def _top(self, memo: _Memo, names: list[str]) -> dict[str, int]:
        """The rank mapping of `names`, feasible nodes of `memo`'s evaluation (/filter's answer): `_top_of`, or along
        the memo's `_Order` once the shape's subsets were ranked before (a memo kept per pod is ranked once: no order
        is built for it). Equal keys among the first eleven (a crc collision) keep `names`' order: `_top_of`'s way."""
        order = memo.order
        if order is None:
            memo.ranked_subsets += 1
            if memo.ranked_subsets < 2:
                return _top_of(memo.keys, names)
            order = memo.order = _Order.of(memo.keys, self._by_crc())
        top = order.first(names, MAX_PRIORITY + 1)
        keys = memo.keys
        if len(set(map(keys.__getitem__, top))) < len(top):
            return _top_of(keys, names)
        return {n: MAX_PRIORITY - i for i, n in enumerate(top[:MAX_PRIORITY])}

    def cached_result(self, node_name: str, pod: PodInfo) -> NodeResult:
        """`evaluate_node`'s answer, taken from this pod shape's per-node cache while the node has not changed since it
        was evaluated there (the cache is per node version, policy and epoch, so it is the same decision). A failure is
        fitted again: its reason may name another pod's containers (`_own_names`), and /bind's refusal shows it."""
        policy, _, shape = self._resolved(pod)
        cache = self._cache.get((shape, policy.name, policy.epoch, self._config_id()))
        node = self.state.nodes.get(node_name)
        hit = None if cache is None else cache.get(node_name)
        if node is not None and hit is not None and hit[0] == node.version and hit[1].failure is None:
            return self._drawn(node_name, pod, policy, _own_names(hit[1], pod))
        return self.evaluate_node(node_name, pod)

    def _refresh(self, memo: _Memo) -> bool:
        """Bring a memoised evaluation up to date in place: the nodes that changed leave it (`_Memo.stale`) until
        `_freshen` re-evaluates them. False: too much changed, evaluate again."""
        changed = self.state.changed_since(memo.version)
        if changed is None or len(changed) > _INCREMENTAL_LIMIT:
            return False
        ev = memo.evaluation
        touched = changed & memo.name_set
        if touched:
            order = memo.order
            if order is not None:  # before any key goes: bisect reads the keys of the nodes it passes
                for name in touched:
                    if name in ev.scores:
                        order.drop(name)
            keys = memo.keys
            for name in touched:
                ev.scores.pop(name, None)
                keys.pop(name, None)
                ev.feasible.pop(name, None)
                ev.failed.pop(name, None)
                ev.unresolvable.pop(name, None)
            memo.stale |= touched
            if memo.out_at is not None:
                assert memo.positions is not None
                memo.out_at.update(map(memo.positions.__getitem__, touched))
            ev.priorities = None
            if ev.ranked is not None:
                ev.ranked.update(sorted(touched), ev.scores)  # out of `scores`: only leave the order
        memo.version, memo.subset = self.state.version, None
        return True

    def _freshen(
        self,
        memo: _Memo,
        names: list[str],
        cache: dict[str, tuple[int, NodeResult]],
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        fits: ShapeMemo,
        classes: Classes | None,
    ) -> None:
        """Re-evaluate the stale nodes among `names` (`_re_evaluate`)."""
        due = memo.stale if names is memo.names or names == memo.names else memo.stale.intersection(names)
        if due:
            self._re_evaluate(memo, due, cache, pod, policy, rank, fits, classes)

    def _re_evaluate(
        self,
        memo: _Memo,
        due: set[str],
        cache: dict[str, tuple[int, NodeResult]],
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        fits: ShapeMemo,
        classes: Classes | None,
    ) -> None:
        """Re-evaluate the stale nodes `due` (some or all of `memo.stale`) and record them last, in name order (set
        order varies with PYTHONHASHSEED; ties in best() follow dict order): a call over every name leaves the
        evaluation as it was when each bind was refreshed in turn."""
        ev = memo.evaluation
        order = sorted(due)
        kept = memo.absent
        # Kept while its per-node cache is the one `Planner._cache` holds: one the LRU bound let go would live on here.
        if (
            kept is not None
            and kept[0] is policy
            and kept[1] == rank
            and (kept[2] is None or self._cache.get(kept[2].key) is kept[2].cache)
        ):
            absent = kept[2]
            if absent is not None:  # in use, as `_shape_cache` marks it (its classes grow in a pass only)
                self._cache.move_to_end(absent.key)
        else:
            absent = self._absent(pod, policy, rank)
            memo.absent = (policy, rank, absent)
        for name in order:
            self._record(ev, name, self._cached(cache, name, pod, policy, rank, fits, classes, absent, record=False))
        out_at = memo.out_at
        if out_at is not None:
            assert memo.positions is not None
            for name in order:
                if name in ev.feasible:
                    out_at.discard(memo.positions[name])
        if memo.order is not None:
            for name in order:
                if name in ev.scores:
                    memo.order.add(name)
        memo.stale = set() if due is memo.stale or len(due) == len(memo.stale) else memo.stale - due
        ev.priorities = None
        if ev.ranked is not None:
            ev.ranked.update(order, ev.scores)
        memo.subset = None

    def _cached(
        self,
        cache: dict[str, tuple[int, NodeResult]],
        name: str,
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        fits: ShapeMemo,
        classes: Classes | None,
        absent: _Absent | None = None,
        *,
        record: bool = True,
    ) -> NodeResult:
        """The node's result from the cache, evaluated and kept there when the node changed; `absent` (`_absent`): on a
        node that runs neither model, from the shared evaluation of the pod with no node's model (scored for `pod`).
        `record`: a node evaluated afresh records its class's answer (see `_evaluate`)."""
        node = self.state.nodes.get(name)
        evaluated = pod
        if absent is not None and node is not None:
            models = node.models
            if pod.model not in models and _ABSENT not in models:
                evaluated, cache, fits, classes, _ = absent
        hit = cache.get(name)
        if node is not None and hit is not None and hit[0] == node.version:
            return self._drawn(name, pod, policy, hit[1])
        result = self._evaluate(name, evaluated, policy, rank, fits, classes, record=record)
        if node is not None:
            cache[name] = (node.version, result)
        return self._drawn(name, pod, policy, result)

    def _fill(
        self,
        out: Evaluation,
        names: list[str],
        cache: dict[str, tuple[int, NodeResult]],
        pod: PodInfo,
        policy: NodePolicy,
        rank: GpuRank,
        fits: ShapeMemo,
        classes: Classes | None,
    ) -> None:
        """`_record(out, name, _cached(...))` for every name, with a node whose class (or split of a split class) is known
        inline (`_of_class` where the class's answer is a tie or its score takes the node's own headroom): a cold pass
        over 5,000 nodes is mostly that. Without node classes (a policy or shape they do not hold for), each node through `_cached`."""
        if classes is None:
            for name in names:
                self._record(out, name, self._cached(cache, name, pod, policy, rank, fits, classes))
            return
        nodes = self.state.nodes
        feasible, scores = out.feasible, out.scores
        per_node, of_class = _PER_NODE, NodeResult.of_class
        for name in names:
            node = nodes.get(name)
            if node is not None:
                version = node.version
                hit = cache.get(name)
                if hit is None or hit[0] != version:
                    memo = node.class_memo  # `NodeState.classified` without the call where it is current
                    if memo is None or memo[0] != version:
                        memo = node.classified()
                    shared = classes.get(memo[1])
                    if shared is not None and shared is not per_node:
                        state = shared.state
                        if state is not None:
                            score = shared.score
                            if shared.tied is None and score is not None:
                                result = of_class(name, memo[2][state].device, shared, score)
                            else:  # a tie between states, or the node's own headroom in the score
                                result = self._of_class(node, shared, memo[2])
                                score = result.score
                            cache[name] = (version, result)
                            feasible[name] = result
                            scores[name] = score
                            continue
                        if shared.result is not None:
                            cache[name] = (node.version, shared.result)
                            self._record(out, name, shared.result)
                            continue
                        if shared.multi is not None:
                            result = self._of_multi(node, shared, memo[2])
                            cache[name] = (version, result)
                            feasible[name] = result
                            scores[name] = result.score
                            continue
                        splits = shared.splits
                        if splits is not None:  # a split class: this node's split, where a node evaluated it already
                            known = splits.get(_split_key(node, shared))
                            if known is not None:
                                if known.result is not None:  # the split's failure
                                    cache[name] = (version, known.result)
                                    self._record(out, name, known.result)
                                    continue
                                result = self._of_multi(node, known, memo[2])
                                cache[name] = (version, result)
                                feasible[name] = result
                                scores[name] = result.score
                                continue
            self._record(out, name, self._cached(cache, name, pod, policy, rank, fits, classes))

    @staticmethod
    def _record(out: Evaluation, name: str, result: NodeResult) -> None:
        if result.failure is None:
            out.feasible[name] = result
            out.scores[name] = result.score
        elif result.failure.unresolvable:
            out.unresolvable[name] = result.failure.reason
        else:
            out.failed[name] = result.failure.reason

    def priorities(self, evaluation: Evaluation) -> dict[str, int]:
        """Nodes left out of the result score 0."""
        if evaluation.priorities is None and self.config.priority_mapping == "rank":
            ranked = evaluation.ranked
            prios = None if ranked is None else ranked.priorities()
            if prios is None:
                ranked = evaluation.ranked = Ranked.of(evaluation.scores, _RANKED)
                prios = ranked.priorities()
                assert prios is not None
            evaluation.priorities = prios
        elif evaluation.priorities is None:
            evaluation.priorities = to_priorities(evaluation.scores, self.config.priority_mapping)
        return evaluation.priorities

    def narrow(self, evaluation: Evaluation) -> Evaluation:
        """Keep only the best-scored tier; the rest become failed with a reason naming why."""
        prios = self.priorities(evaluation)
        if not prios:
            return evaluation
        top = max(prios.values())
        out = Evaluation(failed=dict(evaluation.failed), unresolvable=dict(evaluation.unresolvable))
        for name, result in evaluation.feasible.items():
            prio = prios.get(name, 0)
            if prio == top:
                out.feasible[name] = result
                out.scores[name] = result.score
            else:
                out.failed[name] = f"fits, but scored {prio}/{MAX_PRIORITY} below the best tier (narrow filter)"
        return out
