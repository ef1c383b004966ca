"""The pod corpus (tests/data/pods, real-shaped llm-d / vLLM / SGLang specs) through the whole review path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
from prometheus_client import CollectorRegistry

from vgpu import annotations as ann
from vgpu.devices import GpuDevice
from webhook import labels as L
from webhook.admission import Settings
from webhook.capacity import InventorySummary
from webhook.metrics import WebhookMetrics
from webhook.server import Reviewer
from webhook.testing import load_corpus, make_review, patch_ops

CORPUS = Path(__file__).resolve().parents[1] / "data" / "pods"
INDEX, PODS = load_corpus(CORPUS)


class _Inventory:
    expected = True

    def __init__(self, summary: InventorySummary) -> None:
        self._summary = summary

    def summary(self) -> InventorySummary:
        return self._summary

    def ready(self) -> bool:
        return True


def _cluster() -> InventorySummary:
    return InventorySummary.from_nodes(
        [
            GpuDevice(uuid=f"{n['node']}-{i}", index=i, model=n["model"], memory_mib=n["memoryMiB"])
            for i in range(n["gpus"])
        ]
        for n in INDEX["cluster"]
    )


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    reviewer = Reviewer(Settings(), _Inventory(_cluster()), WebhookMetrics(CollectorRegistry()))
    status, body = reviewer.handle(orjson.dumps(make_review(pod, uid="u-1")), mutating=True)
    assert status == 200
    out: dict[str, Any] = orjson.loads(body)
    return out


@pytest.mark.parametrize("name", sorted(INDEX["pods"]))
def test_corpus_pod(name: str) -> None:
    want = INDEX["pods"][name]
    pod = PODS[name]
    review = _review(pod)
    resp = review["response"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    assert resp["uid"] == "u-1"
    assert resp["allowed"] is want["allowed"], resp.get("status")
    if not want["allowed"]:
        assert "patch" not in resp and "patchType" not in resp
        assert resp["status"]["code"] == 400
        for fragment in want["mentions"]:
            assert fragment in resp["status"]["message"], (fragment, resp["status"]["message"])
        return
    assert ("patch" in resp) == ("patchType" in resp)
    if want.get("untouched"):
        assert "patch" not in resp and "warnings" not in resp
        return
    mutated = jsonpatch.apply_patch(pod, patch_ops(review))
    got_labels = mutated["metadata"]["labels"]
    assert got_labels[ann.LABEL_MANAGED] == "true"
    assert all(L.is_valid_value(v) for v in got_labels.values())
    if "role" in want:
        assert got_labels[ann.LABEL_ROLE] == want["role"]
    if "source" in want:
        assert got_labels[ann.LABEL_ROLE_SOURCE] == want["source"]
    for key, value in want.get("labels", {}).items():
        assert got_labels.get(key) == value, key
    for key in want.get("removed_labels", []):
        assert key not in got_labels
    for key in want.get("removed_annotations", []):
        assert key not in mutated["metadata"].get("annotations", {})
    if "scheduler" in want:
        assert mutated["spec"].get("schedulerName") == want["scheduler"]
    for cname in want.get("default_count", []):
        (container,) = [c for c in mutated["spec"]["containers"] if c["name"] == cname]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    warnings = resp.get("warnings", [])
    for fragment in want.get("warnings", []):
        assert any(fragment in w for w in warnings), (fragment, warnings)
    if want.get("no_warnings"):
        assert warnings == []
    # Untouched fields stay untouched: only labels, annotations, schedulerName, resources and the model server's
    # memory flag (index.yaml `flags`, added once) may change.
    flags = want.get("flags", {})
    for key in ("containers", "initContainers"):
        before, after = pod["spec"].get(key, []), mutated["spec"].get(key, [])
        assert [{k: v for k, v in c.items() if k != "resources"} for c in before] == [
            _without_flag({k: v for k, v in c.items() if k != "resources"}, flags.get(c["name"]), c in before)
            for c in after
        ]
    # Reinvocation (reinvocationPolicy: IfNeeded) on our own output changes nothing.
    again = _review(mutated)
    assert again["response"]["allowed"] is True
    assert patch_ops(again) == []


def _without_flag(container: dict[str, Any], flag: str | None, unchanged: bool) -> dict[str, Any]:
    """The container as written: `flag` (added once, as an args entry or inside a shell line) taken out."""
    if flag is None:
        return container
    assert not unchanged, f"no {flag} in {container['name']}"
    out = dict(container)
    hits = []
    for key in ("command", "args"):
        for i, token in enumerate(out.get(key) or []):
            if token == flag:
                hits.append((key, i, None))
            elif f" {flag} " in f" {token} ":
                hits.append((key, i, token.replace(" " + flag, "", 1)))
    assert len(hits) == 1, (flag, container)
    key, i, shell = hits[0]
    values = list(out[key])
    if shell is None:
        del values[i]
    else:
        values[i] = shell
    out[key] = values
    if key == "args" and not values:
        del out["args"]
    return out


def test_corpus_covers_every_file() -> None:
    on_disk = {p.name for p in CORPUS.glob("*.yaml")} - {"index.yaml"}
    assert on_disk == set(INDEX["pods"])
