"""The webhook's side of vgpu.model_servers: each vLLM / SGLang container's memory flag as JSON Patch ops.

The card sizes a container may land on come from the inventory summary, narrowed by the pod's pins:
`vgpu.io/use-gpu-models`, else a `nvidia.com/gpu.product` node selector (GPU feature discovery's label:
NVML's name with spaces as dashes). Container args cannot change after creation, so what is decided here is
what the server gets: a card only known at bind cannot refine it (docs/model-servers.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu import annotations as ann
from vgpu import model_servers as ms
from vgpu.requests import PodRequest
from webhook.capacity import ANY_MODEL, InventorySummary
from webhook.config import ModelServerSizing
from webhook.patch import PatchOp, pointer

# GPU feature discovery's node label for the GPU model (NVIDIA k8s-device-plugin, gpu-feature-discovery).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True, slots=True)
class Plan:
    ops: tuple[PatchOp, ...] = ()
    warnings: tuple[str, ...] = ()
    sizings: tuple[ms.Sizing, ...] = ()


def plan(
    pod: Mapping[str, Any],
    request: PodRequest,
    summary: InventorySummary | None,
    gpu_models: frozenset[str] | None,
    sizing: ModelServerSizing = "card",
) -> Plan:
    """Ops adding the memory flag to every model-server container of `pod` that needs one, and warnings.

    `sizing` (the webhook's model_server_sizing): what CUDA reports on the nodes, the card or the slice; off: none.
    """
    meta = pod.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    if sizing == "off" or (
        isinstance(notes, Mapping) and notes.get(ann.POD_MODEL_SERVER_SIZING) == ann.MODEL_SERVER_SIZING_OFF
    ):
        return Plan()
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(containers, list):
        return Plan()
    models = gpu_models or _product_selector(spec)
    asks = {c.container: c for c in request.containers}
    ops: list[PatchOp] = []
    warnings: list[str] = []
    sizings: list[ms.Sizing] = []
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping):
            continue
        ask = asks.get(str(container.get("name") or "<unnamed>"))
        if ask is None:
            continue
        cards = candidate_cards(summary, models, ask.memory_mib)
        seen: ms.Seen = "slice" if sizing == "slice" else "card"
        sized = ms.size(container, ms.Slice(ask.memory_mib, ask.memory_percentage, cards, seen))
        sizings.append(sized)
        warnings += sized.warnings
        if sized.flag is not None and sized.invocation is not None:
            ops.append(_op(container, i, sized.invocation, sized.flag))
    return Plan(tuple(ops), tuple(warnings), tuple(sizings))


def candidate_cards(
    summary: InventorySummary | None, models: frozenset[str] | None, memory_mib: int | None
) -> tuple[int, ...]:
    """Distinct memory sizes (MiB) of the cluster's GPUs of an allowed model that can hold the slice."""
    if summary is None:
        return ()
    wanted = None if models is None else {_norm(m) for m in models}
    sizes = {
        mem
        for node in summary.nodes
        for model, mem in node.gpus
        if (wanted is None or model == ANY_MODEL or _norm(model) in wanted)
        and (memory_mib is None or mem >= memory_mib)
    }
    return tuple(sorted(sizes))


def _op(container: Mapping[str, Any], index: int, inv: ms.Invocation, flag: str) -> PatchOp:
    if inv.shell:
        assert inv.field is not None
        return {
            "op": "replace",
            "path": pointer("spec", "containers", index, inv.field, inv.position),
            "value": ms.with_flag(inv, flag),
        }
    if isinstance(container.get("args"), list):
        return {"op": "add", "path": pointer("spec", "containers", index, "args") + "/-", "value": flag}
    return {"op": "add", "path": pointer("spec", "containers", index, "args"), "value": [flag]}


def _product_selector(spec: Mapping[str, Any]) -> frozenset[str] | None:
    selector = spec.get("nodeSelector")
    value = selector.get(GPU_PRODUCT_LABEL) if isinstance(selector, Mapping) else None
    return frozenset({value}) if isinstance(value, str) and value else None


def _norm(model: str) -> str:
    return model.strip().replace(" ", "-")
