"""The user's own deployment for the what-if: which `vgpu.perf.params` model a pool serves and which GPU
spec a cluster file's GPU model is, so pods placed by the planner on a cluster file become pools. Pure.

A pool's model is read from its `llm-d.ai/model` label (vgpu.roles.MODEL_LABELS) or the engine's `--model`
flag: a bundled model matches when every dash-separated part of its name occurs in it (`llama-8b` matches
`llama-3.1-8b-instruct` and `meta-llama/Llama-3.1-8B-Instruct`), the most specific name first.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpu.perf.params import GPUS, MODELS, GpuSpec, ModelSpec


def match_model(texts: Iterable[str]) -> ModelSpec | None:
    """The bundled model named in any of `texts` (label value, --model argument), or None."""
    lowered = [t.lower() for t in texts if t]
    for name in sorted(MODELS, key=lambda n: (-len(n.split("-")), n)):
        parts = name.split("-")
        if any(all(p in t for p in parts) for t in lowered):
            return MODELS[name]
    return None


def match_gpu(model: str) -> GpuSpec | None:
    """The GPU spec of a cluster file's GPU model (`H100-80GB` -> H100), or None."""
    upper = model.upper()
    for name, spec in GPUS.items():
        if upper.startswith(name) or f"-{name}" in upper:
            return spec
    return None
