"""Which assignment the extender believes when two of them cannot both fit on a GPU.

An assignment read from the apiserver is a claim on slices. The extender's books never over-commit a
GPU (`ClusterState.apply` refuses), so when claims conflict one is honoured and the other is reported and
left out of the capacity the extender believes in. The rule, in order:

1. What is in the books stays: a claim is honoured or refused when the extender first sees it, and a later
   claim never displaces an honoured one. The extender's own binds enter the books under the state lock
   the moment it chooses the slices, before it writes the annotation, so they precede anything the watch
   shows later — a forged or stale assignment can never push out one the extender made itself.
2. Claims seen together (the first list after a start, a relist) are taken bound pods first (their
   `spec.nodeName` is set: the device plugin may already serve them), then by the apiserver's
   `metadata.creationTimestamp`, then by namespace/name. None of these is a time the pod author writes:
   `vgpu.io/bind-time` is never used.
3. A refused claim is retried when capacity frees (a release), best first by the same order, so a pod that
   lost only to one that has since gone is counted again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vgpu.annotations import Assignment
from vgpu.errors import CapacityError
from vgpu.state import ClusterState


@dataclass(frozen=True, slots=True)
class Claim:
    key: str  # namespace/name
    assignment: Assignment
    bound: bool  # spec.nodeName is set
    created: str  # metadata.creationTimestamp, RFC 3339 UTC as the apiserver writes it (sorts as text)


def order_key(*, bound: bool, created: str, key: str) -> tuple[bool, str, str]:
    """Sort key of rule 2: better claims first."""
    return (not bound, created, key)


def precedence(claim: Claim) -> tuple[bool, str, str]:
    return order_key(bound=claim.bound, created=claim.created, key=claim.key)


def settle(state: ClusterState, contested: Mapping[str, Claim]) -> tuple[list[str], dict[str, str]]:
    """Apply the refused claims that fit now, best first (rule 3). Returns the keys applied and, for the rest,
    why they still do not fit. Claims whose pod holds something in the books already are skipped."""
    applied: list[str] = []
    refused: dict[str, str] = {}
    for claim in sorted(contested.values(), key=precedence):
        if claim.key in state.assignments or claim.key in state.orphans:
            continue
        try:
            state.apply(claim.key, claim.assignment)
        except CapacityError as exc:
            refused[claim.key] = str(exc)
            continue
        applied.append(claim.key)
    return applied, refused
