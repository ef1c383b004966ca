"""NVLink and NUMA facts of one node's GPUs, and the choice of a connected GPU set for a multi-GPU container.

Tensor-parallel shards exchange activations on every layer: over NVLink (~300 GB/s effective, NVLink4) they
barely notice, over PCIe (~50 GB/s) and across NUMA nodes they slow down (vgpu/perf/params.py LINK_GB_S).
So a container asking for k > 1 GPUs gets, in this order of preference, k GPUs that are all NVLink peers of
each other (an NVSwitch domain is all-to-all; on one NUMA node before across two), k GPUs on one NUMA node,
or the k the GPU policy ranks first. Inside a tier the policy's order still decides: the set taken is the
lexicographically first one in it.

The facts come from the node inventory (`nvlink_peers`, `numa`; the device plugin reads them from NVML,
a cluster file states them). Two GPUs are linked when either lists the other, so a hand-written inventory
need not repeat every link on both ends. A node whose GPUs carry no links and at most one NUMA value is
`flat`: every set is equivalent there and the choice is exactly the policy's (the openb traces have no
topology and pack as before).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from vgpu.annotations import ContainerAssignment
from vgpu.devices import GpuDevice


class Link(IntEnum):
    """How well a GPU set is connected; lower is better. "One NUMA node" counts GPUs whose NUMA node is
    unknown as one node: nothing is known against it, and a node without NUMA facts is not penalised."""

    NVLINK = 0  # every pair NVLink peers, on one NUMA node
    NVLINK_CROSS_NUMA = 1  # every pair NVLink peers, across NUMA nodes (e.g. TP8 on an NVSwitch node)
    NUMA = 2  # one NUMA node, not all NVLink peers
    NONE = 3  # across NUMA nodes without NVLink between every pair


# The node score's topology term for a multi-GPU container's set, times PlacementConfig.topology_weight (2): a
# node policy scores in [0, 1], so an NVLink set (>= 0.75 x 2) on a node in use outscores every set without one
# (<= 0.25 x 2) whatever the policy says, while one NUMA node over two is worth half the policy's range.
LINK_SCORE = {Link.NVLINK: 1.0, Link.NVLINK_CROSS_NUMA: 0.75, Link.NUMA: 0.25, Link.NONE: 0.0}
# Added to an NVLink set's LINK_SCORE (placement_score): FIT_BONUS x the share of its NVLink domain it takes, so a
# TP2 pod takes a bridged pair (2 of 2: the whole bonus) before 2 GPUs of an NVSwitch node (2 of 8) that a TP8
# pod may need whole; IDLE_BONUS x its share of the domain's idle GPUs, a tie-break towards half-used domains.
# In a cluster of one node kind both are nearly constant, so the node order stays the policy's and the role
# terms' (vgpu pd-bench, all NVSwitch: the default's rows unchanged). Measured in docs/topology.md.
FIT_BONUS = 0.5
IDLE_BONUS = 0.05
# Subtracted from the term of the sets of a pod that breaks a whole idle node (every GPU idle, the pod takes fewer).
# A TP8 pod needs such a node; without this cost the term drew TP4 / TP2 pods onto idle NVSwitch nodes (and onto
# idle nodes that give one NUMA node) ahead of the policy's packing, and 22 % more pods were refused, most of them
# TP8. At 1.25 a set that breaks an idle node scores about what a set without NVLink scores on a node in use (a
# TP4 on an idle NVSwitch node 0.025, a TP2 on an idle bridged node 0.3, times the weight; one NUMA node on a node
# in use 0.25, across two 0), so whether to break it is mostly the policy's call (FGD counts the TP8 shapes it would strand), while on nodes in use, and for a pod that
# takes a node whole, NVLink still wins outright. Measured 0.5 / 0.75 / 1 / 1.25 / 2 (docs/topology.md): from 1.25
# refusals are back to topology off. Flat nodes (openb) get one constant term, idle or not: nothing changes there.
WHOLE_NODE_COST = 1.25


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """The maximal NVLink cliques (all-to-all groups of two or more GPUs) and the NUMA node of each GPU."""

    cliques: tuple[frozenset[str], ...]
    numa: dict[str, int | None]
    peers: dict[str, frozenset[str]]
    member: dict[str, tuple[int, ...]]  # the positions in `cliques` of the domains each GPU belongs to, ascending
    # No links and no NUMA distinction: every GPU set is as connected as any other.
    flat: bool

    def largest_clique(self, among: set[str]) -> int:
        """The most GPUs of `among` that are all NVLink peers of each other (1 when none are linked)."""
        best = 1 if among else 0
        for c in self.cliques:
            best = max(best, len(c & among))
        return best

    def link(self, uuids: Sequence[str]) -> Link:
        """How the GPUs `uuids` are connected (a single GPU counts as NVLink-connected on one NUMA node)."""
        one_numa = len({self.numa.get(u) for u in uuids}) <= 1
        for i, a in enumerate(uuids):
            near = self.peers.get(a, frozenset())
            if any(b not in near for b in uuids[i + 1 :]):
                return Link.NUMA if one_numa else Link.NONE
        return Link.NVLINK if one_numa else Link.NVLINK_CROSS_NUMA


_NO_PEERS: frozenset[str] = frozenset()


def node_topology(gpus: Sequence[GpuDevice]) -> NodeTopology:
    """The topology of one node's GPUs (links to GPUs not in `gpus` are ignored)."""
    present = {g.uuid for g in gpus}
    adjacent: dict[str, set[str]] = {g.uuid: set() for g in gpus}
    for g in gpus:
        for p in g.nvlink_peers:
            if p in present and p != g.uuid:
                adjacent[g.uuid].add(p)
                adjacent[p].add(g.uuid)
    if any(adjacent.values()):
        peers = {u: frozenset(v) for u, v in adjacent.items()}
        cliques = _maximal_cliques(peers)
        order = {g.uuid: g.index for g in gpus}
        cliques.sort(key=lambda c: (-len(c), min(order[u] for u in c)))
    else:  # no links (most nodes): no cliques, and one shared empty set of peers
        peers, cliques = dict.fromkeys(adjacent, _NO_PEERS), []
    numa = {g.uuid: g.numa for g in gpus}
    flat = not cliques and len(set(numa.values())) <= 1
    member: dict[str, list[int]] = {}
    for d, clique in enumerate(cliques):
        for u in clique:
            member.setdefault(u, []).append(d)
    return NodeTopology(
        cliques=tuple(cliques),
        numa=numa,
        peers=peers,
        member={u: tuple(ds) for u, ds in member.items()},
        flat=flat,
    )


def _maximal_cliques(peers: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """Bron-Kerbosch with pivoting over the link graph; cliques of one GPU are left out.

    Node-sized graphs (8-16 GPUs; 64 at most in a cluster file) keep this to microseconds, and it runs once
    per node inventory (NodeState keeps the result)."""
    out: list[frozenset[str]] = []

    def expand(r: frozenset[str], p: set[str], x: set[str]) -> None:
        if not p and not x:
            if len(r) > 1:
                out.append(r)
            return
        pivot = max(p | x, key=lambda u: len(peers[u] & p))
        for v in list(p - peers[pivot]):
            expand(r | {v}, p & peers[v], x & peers[v])
            p.discard(v)
            x.add(v)

    expand(frozenset(), set(peers), set())
    return out


def choose(order: Sequence[str], count: int, topo: NodeTopology) -> tuple[list[int], Link]:
    """Positions in `order` (candidate GPUs, the policy's preference first) of the `count` GPUs to take.

    The best-connected tier (`Link`) that has `count` candidates wins; inside it, the lexicographically first
    set of positions. Only a few sets need looking at: any set of a tier lies inside one group (a domain's part
    on one NUMA node, a domain, one NUMA node, the whole node), and that group's first `count` candidates are at
    least as early and at least as well connected. So one pass collects each group's first `count` and each is
    labelled with its group's tier; a set better connected than its label is dominated by the set of a better
    group, so the minimum's label is its tier. No subsets are enumerated, no pair is tested.
    """
    if count <= 1 or topo.flat:
        return list(range(min(count, len(order)))), Link.NVLINK if count <= 1 else topo.link(order[:count])
    by_numa: dict[int | None, list[int]] = {}
    by_domain: dict[int, list[int]] = {}
    by_part: dict[tuple[int, int | None], list[int]] = {}
    numa, member = topo.numa, topo.member
    for i, u in enumerate(order):
        n = numa.get(u)
        group = by_numa.setdefault(n, [])
        if len(group) < count:
            group.append(i)
        for d in member.get(u, ()):
            if len(topo.cliques[d]) < count:
                break  # domains are listed largest first
            group = by_domain.setdefault(d, [])
            if len(group) < count:
                group.append(i)
            group = by_part.setdefault((d, n), [])
            if len(group) < count:
                group.append(i)
    best = (Link.NONE, list(range(count)))  # the whole node
    for link, groups in (
        (Link.NVLINK, by_part.values()),
        (Link.NVLINK_CROSS_NUMA, by_domain.values()),
        (Link.NUMA, by_numa.values()),
    ):
        for pos in groups:
            if len(pos) == count and (link, pos) < best:
                best = (link, pos)
    return best[1], best[0]


def placement_score(
    topo: NodeTopology, containers: Sequence[ContainerAssignment], idle: Callable[[], set[str]]
) -> float | None:
    """Mean over the containers that hold more than one slice of `LINK_SCORE` plus, for an NVLink set, the fit
    bonuses, less `WHOLE_NODE_COST` when the set breaks a whole idle node; None when no container holds more than
    one slice (a single-GPU pod scores no topology term, so its node order is the policy's alone). `idle`: the
    node's GPUs that hold no slice, asked for only when needed (never on a flat node)."""
    if all(len(c.devices) < 2 for c in containers):
        return None
    if topo.flat:  # every set alike: the same term on every flat node
        return LINK_SCORE[Link.NUMA]
    idle_now = idle()
    taken = {d.uuid for c in containers for d in c.devices}
    cost = WHOLE_NODE_COST if len(taken) < len(topo.numa) == len(idle_now) else 0.0
    scores: list[float] = []
    for c in containers:
        if len(c.devices) < 2:
            continue
        uuids = [d.uuid for d in c.devices]
        link = topo.link(uuids)
        score = LINK_SCORE[link] - cost
        if link <= Link.NVLINK_CROSS_NUMA:
            domain = max((cl for cl in topo.cliques if cl.issuperset(uuids)), key=len)
            k = len(uuids)
            score += FIT_BONUS * k / len(domain) + IDLE_BONUS * k / max(k, len(domain & idle_now))
        scores.append(score)
    return sum(scores) / len(scores)
