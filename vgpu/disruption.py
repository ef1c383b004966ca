"""Which pods a PodDisruptionBudget protects from eviction now, as kube-scheduler's preemption counts it.

kube-scheduler (pkg/scheduler/framework/preemption/preemption.go, filterPodsWithPDBViolation, Kubernetes v1.34)
counts a victim as violating a PDB in its namespace whose selector matches its labels when the budget's
`status.disruptionsAllowed` is already used up by earlier victims of the same set (an empty selector matches
nothing there). We mark a pod protected when any matching budget allows no disruption at all (<= 0): a victim
set avoids such pods whenever another set works (vgpu.preemption).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels and matchExpressions In/NotIn/Exists/DoesNotExist); an empty or
    missing selector matches nothing, as kube-scheduler treats it for PDBs."""
    if not selector:
        return False
    match = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for e in exprs:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def protected(pods: Mapping[str, tuple[str, Mapping[str, str]]], pdbs: Iterable[Mapping[str, Any]]) -> set[str]:
    """Keys of `pods` (key -> (namespace, labels)) matched by a PDB whose status allows no disruption."""
    spent: list[tuple[str, Mapping[str, Any]]] = []
    for pdb in pdbs:
        allowed = (pdb.get("status") or {}).get("disruptionsAllowed", 0)
        if isinstance(allowed, int) and allowed <= 0:
            meta = pdb.get("metadata") or {}
            spent.append((str(meta.get("namespace") or "default"), (pdb.get("spec") or {}).get("selector") or {}))
    return {
        key
        for key, (ns, labels) in pods.items()
        if any(ns == pns and selector_matches(sel, labels) for pns, sel in spent)
    }
