"""Property tests over arbitrary (well-typed) pod specs: never an HTTP 5xx, always a valid AdmissionReview.

Pods are generated with the field types the apiserver guarantees (it has decoded them into Go structs)
but with arbitrary values: any strings for names, labels, args and quantities, any of our resources.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from vgpu import annotations as ann
from vgpu.devices import GpuDevice
from webhook import labels as L
from webhook.admission import Settings
from webhook.capacity import InventorySummary
from webhook.inventory import NoInventory
from webhook.metrics import WebhookMetrics
from webhook.review import AdmissionReview
from webhook.server import Reviewer
from webhook.testing import make_review, patch_ops

RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
    "cpu",
    "memory",
]
_VALID = st.one_of(st.integers(min_value=1, max_value=100).map(str), st.sampled_from(["1", "2", "50", "100", "40000"]))
_GARBAGE = st.one_of(
    st.integers(min_value=-5, max_value=200).map(str),
    st.sampled_from(["0", "101", "0.5", "1.0", "1Gi", "500m", "1000m", "-1", "1e3", ""]),
    st.text(max_size=8),
    st.integers(min_value=-(2**40), max_value=2**40),
)
# Mostly legal values, so that most generated GPU pods get admitted and mutated, not only refused.
QUANTITIES = st.one_of(_VALID, _VALID, _VALID, _GARBAGE)
ARGS = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "--disaggregation-mode",
                "prefill",
                "decode",
                "--disaggregation-mode=decode",
                "--kv-transfer-config",
                '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
                '{"kv_role":"kv_consumer"}',
                '{"kv_role":"kv_both"}',
                'vllm serve m --kv-transfer-config \'{"kv_role": "kv_producer"}\'',
                "{not json",
            ]
        ),
        st.text(max_size=20),
    ),
    max_size=6,
)
LABEL_KEYS = st.one_of(
    st.sampled_from(["llm-d.ai/role", "llm-d.ai/model", "app", *ann.WEBHOOK_LABELS, "a~b/c", "x/y/z"]),
    st.text(max_size=12),
)
LABEL_VALUES = st.one_of(
    st.sampled_from(["prefill", "decode", "both", "prefill-decode", "encode", "12345", "true", ""]),
    st.text(max_size=12),
)


def _resources() -> st.SearchStrategy[dict[str, Any]]:
    section = st.dictionaries(st.sampled_from(RESOURCES), QUANTITIES, min_size=1, max_size=3)
    return st.fixed_dictionaries({"limits": section}, optional={"requests": section})


def _container(init: bool) -> st.SearchStrategy[dict[str, Any]]:
    names = st.one_of(st.sampled_from(["vllm", "routing-sidecar", "routing-proxy", "app"]), st.text(max_size=10))
    required: dict[str, Any] = {"name": names, "image": st.just("img")}
    optional: dict[str, Any] = {"args": ARGS, "command": ARGS}
    if init:  # init containers rarely ask for GPUs (that is refused); app containers usually do
        optional["restartPolicy"] = st.sampled_from(["Always"])
        optional["resources"] = _resources()
    else:
        required["resources"] = _resources()
    return st.fixed_dictionaries(required, optional=optional)


PODS = st.fixed_dictionaries(
    {
        "apiVersion": st.just("v1"),
        "kind": st.just("Pod"),
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": st.text(max_size=12),
                "generateName": st.text(max_size=12),
                "namespace": st.text(max_size=8),
                "labels": st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=4),
                "annotations": st.dictionaries(
                    st.one_of(
                        st.sampled_from(
                            ["vgpu.io/assignment", "vgpu.io/bind-phase", "vgpu.io/bind-time", "vgpu.io/use-gpu-models"]
                        ),
                        st.text(max_size=10),
                    ),
                    st.text(max_size=20),
                    max_size=3,
                ),
            },
        ),
        "spec": st.fixed_dictionaries(
            {"containers": st.lists(_container(False), min_size=1, max_size=3)},
            optional={
                "initContainers": st.lists(_container(True), max_size=1),
                "schedulerName": st.one_of(
                    st.sampled_from(["default-scheduler", "vgpu-scheduler", "volcano", ""]), st.text(max_size=8)
                ),
            },
        ),
    }
)
OPERATIONS = st.sampled_from(["CREATE", "CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"])
SUMMARIES = st.one_of(
    st.none(),
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(["H100", "L40S", "A10"]), st.integers(1000, 100_000)), min_size=1, max_size=8
        ),
        min_size=1,
        max_size=3,
    ).map(
        lambda nodes: InventorySummary.from_nodes(
            [GpuDevice(uuid=f"g{n}-{i}", index=i, model=m, memory_mib=mem) for i, (m, mem) in enumerate(gpus)]
            for n, gpus in enumerate(nodes)
        )
    ),
)


class _Fixed:
    expected = True

    def __init__(self, summary: InventorySummary | None) -> None:
        self._summary = summary

    def summary(self) -> InventorySummary | None:
        return self._summary

    def ready(self) -> bool:
        return True


def _handle(reviewer: Reviewer, review: dict[str, Any], *, mutating: bool = True) -> dict[str, Any]:
    status, body = reviewer.handle(orjson.dumps(review), mutating=mutating)
    assert status == 200, body
    out: dict[str, Any] = orjson.loads(body)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=PODS, operation=OPERATIONS, summary=SUMMARIES, mutating=st.booleans())
def test_any_pod_gets_a_valid_review(
    pod: dict[str, Any], operation: str, summary: InventorySummary | None, mutating: bool
) -> None:
    reviewer = Reviewer(Settings(), _Fixed(summary), WebhookMetrics(CollectorRegistry()))
    out = _handle(reviewer, make_review(pod, operation=operation, uid="uid-42"), mutating=mutating)
    review = AdmissionReview.model_validate(out)  # the apiserver's shape, exactly
    resp = review.response
    assert resp is not None and review.request is None
    assert resp.uid == "uid-42"
    assert (resp.patch is None) == (resp.patchType is None)
    if not resp.allowed:
        assert resp.status is not None and resp.status.code == 400, resp.status  # 500 would be a bug of ours
        assert resp.status.message.startswith("container ")
        assert resp.patch is None
        return
    assert resp.status is None
    if operation != "CREATE" or not mutating:
        assert resp.patch is None
        return
    if resp.patch is None:
        return
    mutated = jsonpatch.apply_patch(pod, patch_ops(out))
    stamped = {k: v for k, v in mutated["metadata"]["labels"].items() if k in ann.WEBHOOK_LABELS}
    assert stamped and all(L.is_valid_value(v) for v in stamped.values())
    # Idempotent: our own output, reviewed again, needs no patch.
    again = _handle(reviewer, make_review(mutated, uid="uid-43"))
    assert again["response"]["allowed"] is True
    assert patch_ops(again) == []


@settings(max_examples=100, deadline=None)
@given(body=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
def test_garbage_bodies_get_400_not_500(body: bytes) -> None:
    reviewer = Reviewer(Settings(), NoInventory(), WebhookMetrics(CollectorRegistry()))
    status, _ = reviewer.handle(body, mutating=True)
    assert status in (200, 400)
