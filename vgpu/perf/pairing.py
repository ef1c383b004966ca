"""P/D same-node pairing "where capacity allows it": which unpaired prefills a scheduler could have paired.

The raw pairing metric (`cluster.Metrics.pair_node`) counts every placed prefill. Some prefills could not
be paired by any scheduler: when they were placed no node holding a decode of their pool had room for
them, and no decode of their pool placed later could go onto their node. This module records, at every
placement decision and with the planner's own filter for that pod (`fit_node`, the configuration's hard
rules included), the *chances* each prefill had to be paired:

- when a prefill is placed: every decode of its pool already on a node the filter admits the prefill on;
- when a decode is placed: every prefill of its pool already on a node the filter admits the decode on.

A chance is a live decode key; it is dropped when that decode is deleted (scaled away), so a prefill that
was paired with a decode that later went away, or that could only have joined one, is re-examined against
the decodes that are still there. At a checkpoint a prefill is *pairable* when it is paired or still has a
chance; pairing where capacity allows it = paired / pairable. A prefill whose chance was a decode that
then went onto another node counts against the policy even when that decode could not have paired every
prefill of the pool at once (3 prefills on 3 nodes, 1 decode): the definition errs against the policy.

The same code runs for every configuration; only the filter differs (a configuration's hard role rules can
rule out a node, so they can also remove a chance; `Metrics.pairable` reports the share kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpu.config import PlacementConfig
from vgpu.fit import FitFailure, fit_node
from vgpu.pod import PodInfo
from vgpu.state import ClusterState, GpuUsage


def _any_order(u: GpuUsage, memory_mib: int, cores: int, pod: PodInfo) -> float:
    return 0.0


def feasible_nodes(state: ClusterState, pod: PodInfo, config: PlacementConfig) -> set[str]:
    """The nodes the planner's filter admits the pod on (the GPU order does not change feasibility)."""
    return {
        name
        for name, node in state.nodes.items()
        if not isinstance(fit_node(node, pod, config, _any_order), FitFailure)
    }


@dataclass(slots=True)
class PairingChances:
    """Chances to pair each live prefill with a decode of its pool (see the module docstring)."""

    chances: dict[str, set[str]] = field(default_factory=dict)  # prefill key -> live decode keys

    def before_place(self, state: ClusterState, pod: PodInfo) -> set[str]:
        """Call before placing `pod`; returns the nodes the filter admits it on (pass them to `placed`)."""
        if pod.model is None or not (pod.role.does_prefill or pod.role.does_decode):
            return set()
        return feasible_nodes(state, pod, state.config)

    def placed(self, state: ClusterState, pod: PodInfo, feasible: set[str]) -> None:
        """Record the chances created by placing `pod` (already applied to `state`) on one of `feasible`."""
        if pod.model is None:
            return
        if pod.role.does_prefill:
            self.chances[pod.key] = {
                key
                for key, a in state.assignments.items()
                if a.role.does_decode and a.model == pod.model and a.node in feasible
            }
        elif pod.role.does_decode:
            for key, a in state.assignments.items():
                if a.role.does_prefill and a.model == pod.model and a.node in feasible:
                    self.chances.setdefault(key, set()).add(pod.key)

    def released(self, key: str) -> None:
        """A pod was deleted: forget its chances (a prefill) or the chances it gave (a decode)."""
        self.chances.pop(key, None)
        for keys in self.chances.values():
            keys.discard(key)

    def had_chance(self, prefill_key: str) -> bool:
        return bool(self.chances.get(prefill_key))
