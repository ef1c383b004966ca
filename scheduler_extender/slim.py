"""What the extender keeps of a listed object: the fields it reads, so a list of 40k pods holds no more.

A pod's managedFields and most of its status, a node's status (image lists alone can be tens of KB a node) are
read by nothing here; a list page of whole objects is parsed, slimmed and dropped (scheduler_extender.kube.list_all).
"""

from __future__ import annotations

from typing import Any

# Objects per list page: a page of whole pods is the most a list holds at once (~12 KB a pod as Python objects),
# and every page is a round trip, so pages are large.
LIST_PAGE = 5000


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the extender reads of a listed pod: its metadata without managedFields, its spec, and of its status
    the phase and nominatedNodeName (vgpu.pod, scheduler_extender.preempt). A relist of 40k pods holds these."""
    meta = dict(pod.get("metadata") or {})
    meta.pop("managedFields", None)
    status = pod.get("status") or {}
    return {
        "metadata": meta,
        "spec": pod.get("spec") or {},
        "status": {k: status[k] for k in ("phase", "nominatedNodeName") if k in status},
    }


def slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """What the extender reads of a listed node: name, labels, annotations (scheduler_extender.sync.node_event);
    not its status (image lists alone can be tens of KB a node)."""
    meta = node.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "labels", "annotations", "resourceVersion") if k in meta}}
