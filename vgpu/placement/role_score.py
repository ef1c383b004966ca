"""Role-aware score terms (docs/architecture.md, placement pipeline step 3), added to every policy's node score."""

from __future__ import annotations

from vgpu.config import RoleRules
from vgpu.fit import NodePlacement, counterpart
from vgpu.pod import PodInfo
from vgpu.state import GpuUsage, NodeState


def role_score(node: NodeState, placement: NodePlacement, pod: PodInfo, rules: RoleRules) -> float:
    """Complementarity on the chosen GPUs plus P/D locality on the node, for the pod's model.

    complementarity: share of the pod's slices that land on a GPU holding the counterpart role of the
    same model (spatial P/D sharing); a prefill next to another prefill costs `prefill_pair_penalty`.
    locality: the node already hosts the counterpart role of the same model, so KV moves over NVLink
    or PCIe instead of the network; for a decode only where those prefills have no decode of the pool
    yet (a second decode next to paired prefills pairs nothing new and takes the room their pool's next
    prefills need: it scores neither locality nor pool there). Failing that, `pool_weight` when the node
    hosts the pod's own pool without its counterpart, so a deployment whose prefills arrive before its
    decodes stays on one node.
    headroom: `headroom_weight` scaled by the GPU-equivalents the node keeps free after this pod, up to
    `pair_headroom_gpus`, so the counterparts that arrive later (a decode's prefills, a prefill's decode)
    still find room next to it.
    """
    base, head = role_parts(node, placement, pod, rules)
    return base if head is None else base + head


def role_parts(node: NodeState, placement: NodePlacement, pod: PodInfo, rules: RoleRules) -> tuple[float, float | None]:
    """`role_score` as (complementarity and locality, headroom or None when it is off): `role_score` is their sum,
    the same float. The first part depends only on the chosen GPUs' states and the node's (role, model) pairs, the
    headroom on every GPU of the node in index order (vgpu.planner reuses the first across a node class)."""
    role = pod.role
    other = counterpart(role)
    if other is None:
        return 0.0, None
    model = pod.model
    score = 0.0
    # Plain loops over the chosen slices and the node's (role, model) pairs, each role property asked once: the same
    # counts and the same float operations, in the same order, as one comprehension and `any` per test.
    by_uuid = node.by_uuid
    prefill = role.does_prefill
    want_prefill = other.does_prefill  # `_is(h.role, other)`
    slices = complement = pair = 0
    for c in placement.containers:
        for d in c.devices:
            slices += 1
            u = by_uuid[d.uuid]
            if prefill and u.prefill > 0:  # `prefill` counts the holders that do prefill
                pair += 1
            for h in u.holders:
                if h.model == model and (h.role.does_prefill if want_prefill else h.role.does_decode):
                    complement += 1
                    break
    if slices:
        score += rules.complementarity_weight * complement / slices
        score -= rules.complementarity_weight * rules.prefill_pair_penalty * pair / slices
    if model is not None:
        here = has_other = has_decode = False
        for (held, held_model), n in node.role_models.items():
            if held_model == model and n > 0:
                here = True
                if held.does_prefill if want_prefill else held.does_decode:
                    has_other = True
                if held.does_decode:
                    has_decode = True
        if has_other and not (role.does_decode and has_decode):
            score += rules.locality_weight
        elif here and not has_other:
            score += rules.pool_weight
    if rules.headroom_weight and rules.pair_headroom_gpus > 0:
        return score, rules.headroom_weight * min(1.0, free_after(node, placement) / rules.pair_headroom_gpus)
    return score, None


def headroom_one(node: NodeState, u: GpuUsage, memory_mib: int, cores: int, rules: RoleRules) -> float:
    """`role_parts`' headroom for a placement of one slice (`memory_mib`, `cores`) on GPU `u` of `node`."""
    terms = free_terms(node)
    dev = u.device
    out = list(terms)
    out[node.positions[dev.uuid]] = max(
        0.0, 1.0 - max((u.memory_used + memory_mib) / dev.memory_mib, (u.cores_used + cores) / dev.cores)
    )
    return rules.headroom_weight * min(1.0, sum(out) / rules.pair_headroom_gpus)


def free_terms(node: NodeState) -> tuple[float, ...]:
    memo = node.free_terms_memo
    if memo is None or memo[0] != node.version:
        # `GpuUsage.used_share` written out (the same two divisions and max, so the same floats) without a property
        # call and a generator frame per GPU: once per node version, for every node a class answer gives headroom.
        terms = []
        for u in node.gpus:
            d = u.device
            mem, cores = u.memory_used / d.memory_mib, u.cores_used / d.cores
            used = mem if mem >= cores else cores
            terms.append(1.0 - used if used < 1.0 else 0.0)
        memo = node.free_terms_memo = (node.version, tuple(terms))
    return memo[1]


# `free_after`'s last answer: (node, its version, placement, free GPU-equivalents). The planner asks it twice for the
# first node of a class (the role score's headroom, then whether the class's headroom is at its cap). Holding the
# placement keeps its identity from being reused; one tuple, replaced whole, so a reader in another thread sees either.
_LAST_FREE: tuple[NodeState, int, NodePlacement, float] | None = None


def free_after(node: NodeState, placement: NodePlacement) -> float:
    """GPU-equivalents (the larger of memory and SM share, per GPU) left free on the node after `placement`.

    Each GPU's term is kept per node version and only the placement's GPUs are worked out again; the sum runs
    over the same terms in the same order as `used_after` gives them, so the float is the same."""
    global _LAST_FREE
    last = _LAST_FREE
    if last is not None and last[2] is placement and last[0] is node and last[1] == node.version:
        return last[3]
    terms = free_terms(node)
    containers = placement.containers
    if len(containers) == 1 and len(containers[0].devices) == 1:  # one slice (most pods): no totals per GPU to add up
        d = containers[0].devices[0]
        u = node.by_uuid[d.uuid]
        dev = u.device
        out = list(terms)
        out[node.positions[d.uuid]] = max(
            0.0, 1.0 - max((u.memory_used + d.memory_mib) / dev.memory_mib, (u.cores_used + d.cores) / dev.cores)
        )
        out_sum = sum(out)
        _LAST_FREE = (node, node.version, placement, out_sum)
        return out_sum
    added: dict[str, tuple[int, int]] = {}
    for c in containers:
        for d in c.devices:
            m, k = added.get(d.uuid, (0, 0))
            added[d.uuid] = (m + d.memory_mib, k + d.cores)
    if not added:
        out_sum = sum(terms)
    else:
        out = list(terms)
        pos = node.positions
        for uuid, (m, k) in added.items():
            u = node.by_uuid[uuid]
            dev = u.device
            out[pos[uuid]] = max(0.0, 1.0 - max((u.memory_used + m) / dev.memory_mib, (u.cores_used + k) / dev.cores))
        out_sum = sum(out)
    _LAST_FREE = (node, node.version, placement, out_sum)
    return out_sum
