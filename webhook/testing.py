"""Helpers for tests and benchmarks: build AdmissionReview requests, decode responses. Never imported by the service."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from vgpu.annotations import NODE_INVENTORY, encode_inventory
from vgpu.devices import GpuDevice


def make_review(
    pod: Mapping[str, Any], *, operation: str = "CREATE", uid: str | None = None, namespace: str | None = None
) -> dict[str, Any]:
    """An AdmissionReview v1 request for `pod`, shaped as kube-apiserver sends it."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": str(meta.get("name") or ""),
            "namespace": namespace or str(meta.get("namespace") or "default"),
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": dict(pod),
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patch_ops(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch array of an AdmissionReview response body (empty when none)."""
    resp = response["response"]
    if "patch" not in resp:
        return []
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert isinstance(ops, list)
    return ops


def node_annotation(gpus: Iterable[tuple[str, int]], node: str) -> dict[str, str]:
    """`vgpu.io/node-inventory` for a node with GPUs given as (model, memory MiB)."""
    devices = [
        GpuDevice(uuid=f"GPU-{node}-{i}", index=i, model=model, memory_mib=mem) for i, (model, mem) in enumerate(gpus)
    ]
    return {NODE_INVENTORY: encode_inventory(devices)}


def load_corpus(directory: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(index.yaml, {file name: pod}) of a pod corpus folder such as tests/data/pods."""
    index = yaml.safe_load((directory / "index.yaml").read_text())
    pods = {name: yaml.safe_load((directory / name).read_text()) for name in index["pods"]}
    return index, pods
