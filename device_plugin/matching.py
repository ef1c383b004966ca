"""Which pod an Allocate is for (docs/device-plugin.md, "Pod identity"). Pure functions, no I/O.

The kubelet admits pods one at a time and allocates a pod's containers in spec order, calling
GetPreferredAllocation then Allocate for each. So the pod being allocated is one that
  (a) the extender put in bind-phase `allocating` on this node (assignment written before the binding),
  (b) is known to the kubelet (PodResources List) — pods bound but not yet handed to the kubelet are not,
  (c) still has an unserved GPU container (not in PodResources with our devices, not served by us);
only its first unserved container is eligible. If that leaves exactly one pod, it is the one; otherwise
nobody is guessed. The pod's assignment is then vetted (vgpu.assignment_check, through `vet`) and the
request's physical GPU set must equal the container's assigned set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass

from device_plugin.pods import KubeletView, PodRecord
from device_plugin.replicas import gpu_of
from vgpu.annotations import BindPhase, ContainerAssignment
from vgpu.assignment_check import Held

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class Candidate:
    pod: PodRecord
    container: ContainerAssignment

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.container.devices)


class MatchError(Exception):
    """No single pod can be named for a request; the message says why and lists what was seen."""


class Mismatch(MatchError):
    """The kubelet chose replicas that are not one on each of the assigned GPUs (its fallback picked them, or
    its Topology Manager never offered the assigned ones): the refusal then says what it was offered."""

    def __init__(self, message: str, assigned: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.assigned = assigned


class NotVisible(MatchError):
    """No pod is waiting for this request yet: the one being admitted may not be in the pod list we read
    (its assignment or binding not yet seen). The only refusal that re-reading can change."""


def pending_containers(
    pods: Iterable[PodRecord],
    *,
    node: str,
    kubelet: KubeletView | None,
    served: Set[tuple[str, str]],
    require_known: bool = True,
) -> list[Candidate]:
    """The next unserved GPU container of every pod that may be in admission now (rules a-c)."""
    out: list[Candidate] = []
    for pod in pods:
        a = pod.assignment
        if a is None or a.node != node or pod.node not in ("", node):
            continue
        if pod.bind_phase != BindPhase.ALLOCATING or pod.deleting or pod.phase in TERMINAL_PHASES:
            continue
        if require_known and kubelet is not None and pod.key not in kubelet.pods:
            continue
        for c in a.containers:
            if not c.devices or (pod.uid, c.name) in served:
                continue
            if kubelet is not None and kubelet.devices.get((pod.key, c.name)):
                continue
            out.append(Candidate(pod, c))
            break
    return sorted(out, key=lambda c: (c.pod.bind_time, c.pod.key))


def eligible(
    pods: list[PodRecord],
    *,
    node: str,
    kubelet: KubeletView | None,
    served: Set[tuple[str, str]],
    size: int,
) -> list[Candidate]:
    """Candidates asking for `size` vGPUs; if the kubelet view excludes them all (a kubelet that lists
    pods only after admission), fall back to every pending pod — which is then unique or refused."""
    found = [c for c in pending_containers(pods, node=node, kubelet=kubelet, served=served) if len(c.gpus) == size]
    if found or kubelet is None:
        return found
    every = pending_containers(pods, node=node, kubelet=kubelet, served=served, require_known=False)
    return [c for c in every if len(c.gpus) == size]


def holding(
    pods: Iterable[PodRecord],
    *,
    node: str,
    kubelet: KubeletView | None,
    served: Set[tuple[str, str]],
    exclude_uid: str,
) -> list[Held]:
    """Assignments that hold slices on this node now, as the extender counts them: not Succeeded/Failed and
    bind-phase `allocated` (the apiserver's record, which survives our restarts), or served by this process,
    or holding our devices in the kubelet (served by a process that died before patching `allocated`)."""
    out: list[Held] = []
    for pod in pods:
        a = pod.assignment
        if a is None or pod.uid == exclude_uid or a.node != node or pod.node not in ("", node):
            continue
        if pod.phase in TERMINAL_PHASES:
            continue
        names = [c.name for c in a.containers]
        if (
            pod.bind_phase == BindPhase.ALLOCATED
            or any((pod.uid, n) in served for n in names)
            or (kubelet is not None and any(kubelet.devices.get((pod.key, n)) for n in names))
        ):
            out.append(Held(pod.key, a))
    return out


def _describe(cands: list[Candidate]) -> str:
    return ", ".join(f"{c.pod.key}[{c.container.name}] on {','.join(c.gpus)}" for c in cands) or "none"


def match(
    device_ids: list[str],
    pods: list[PodRecord],
    *,
    node: str,
    kubelet: KubeletView | None,
    served: Set[tuple[str, str]],
    vet: Callable[[Candidate], None] | None = None,
) -> Candidate:
    """The one container the kubelet is allocating `device_ids` for, or MatchError. `vet` sees the named
    candidate before its GPUs are compared with the request (its own error, e.g. a foreign GPU, is clearer)."""
    try:
        requested = {gpu_of(i) for i in device_ids}
    except ValueError as exc:
        raise MatchError(str(exc)) from None
    if len(requested) != len(device_ids):
        raise Mismatch(f"devices {device_ids} put two vGPUs of one container on the same GPU")
    cands = eligible(pods, node=node, kubelet=kubelet, served=served, size=len(device_ids))
    if not cands:
        raise NotVisible(
            f"no pod in bind-phase allocating on node {node} has an unserved container with {len(device_ids)} "
            f"vGPU(s) (requested GPUs {sorted(requested)}); was it scheduled by the vGPU extender?"
        )
    if len({c.pod.uid for c in cands}) > 1:
        raise MatchError(f"ambiguous: {len(cands)} pods may be in admission: {_describe(cands)}; refusing to guess")
    cand = cands[0]
    if vet is not None:
        vet(cand)
    if set(cand.gpus) != requested:
        raise Mismatch(
            f"kubelet picked GPUs {sorted(requested)} but {cand.pod.key}[{cand.container.name}] is assigned "
            f"{sorted(cand.gpus)}",
            cand.gpus,
        )
    return cand


def preferred(
    available: list[str],
    must_include: list[str],
    size: int,
    pods: list[PodRecord],
    *,
    node: str,
    kubelet: KubeletView | None,
    served: Set[tuple[str, str]],
) -> list[str]:
    """Replica IDs steering the kubelet to the assigned GPUs of the one eligible container, in assignment
    order; [] (let the kubelet choose, Allocate will then refuse) when no single container is eligible."""
    cands = eligible(pods, node=node, kubelet=kubelet, served=served, size=size)
    if len({c.pod.uid for c in cands}) != 1:
        return []
    by_gpu: dict[str, list[str]] = {}
    for rid in list(must_include) + sorted(available, key=_replica_sort_key):
        try:
            by_gpu.setdefault(gpu_of(rid), []).append(rid)
        except ValueError:
            continue
    out: list[str] = []
    for uuid in cands[0].gpus:
        options = by_gpu.get(uuid)
        if not options:
            return []
        out.append(options[0])
    if not set(must_include) <= set(out):
        return []
    return out


def _replica_sort_key(rid: str) -> tuple[str, int]:
    uuid, _, n = rid.rpartition("::")
    return (uuid, int(n) if n.isascii() and n.isdigit() else 0)


@dataclass(frozen=True, slots=True)
class PreferredCall:
    """One GetPreferredAllocation request of the kubelet and our answer (kept for Allocate's refusals)."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int
    answer: tuple[str, ...]


def _gpus_of(ids: Iterable[str], numa: Mapping[str, int | None]) -> str:
    count: dict[str, int] = {}
    for rid in ids:
        try:
            uuid = gpu_of(rid)
        except ValueError:
            uuid = rid
        count[uuid] = count.get(uuid, 0) + 1
    return ", ".join(
        f"{u} (NUMA {'?' if numa.get(u) is None else numa[u]}, {n} replica{'s' if n > 1 else ''})"
        for u, n in sorted(count.items())
    )


def offer_text(
    call: PreferredCall | None,
    device_ids: list[str],
    numa: Mapping[str, int | None],
    assigned: Iterable[str] = (),
) -> str:
    """What the kubelet offered before choosing `device_ids`: the last GetPreferredAllocation of that size,
    or that it asked none (it takes every free replica on its Topology Manager hint's NUMA nodes without
    asking when they are no more than needed; k8s.io/kubernetes v1.34.4 devicemanager devicesToAllocate)."""
    if call is None:
        return (
            f"the kubelet chose {_gpus_of(device_ids, numa)} without calling GetPreferredAllocation (it takes every "
            "free replica on its Topology Manager's NUMA node(s) first when they are no more than needed)"
        )
    text = (
        f"the kubelet offered GetPreferredAllocation {len(call.available)} free replica(s) on "
        f"{_gpus_of(call.available, numa) or 'no GPU'}"
    )
    if call.must_include:
        text += f", must include {_gpus_of(call.must_include, numa)}"
    offered = {gpu_of(r) for r in (*call.available, *call.must_include) if _is_replica(r)}
    missing = sorted(set(assigned) - offered)
    if missing:
        text += (
            f" - not the assigned {', '.join(f'{u} (NUMA {numa.get(u)})' for u in missing)}: its Topology Manager aligned the container to "
            "another NUMA node (is the node's policy in the inventory? docs/device-plugin.md)"
        )
    return f"{text}; we answered {list(call.answer)}; it then chose {_gpus_of(device_ids, numa)}"


def _is_replica(rid: str) -> bool:
    try:
        gpu_of(rid)
    except ValueError:
        return False
    return True
