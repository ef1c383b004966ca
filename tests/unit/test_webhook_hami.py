"""The webhook and HAMi's annotations: bad values denied naming the key, ignored keys warned about in the
AdmissionReview's `warnings`, a plain HAMi pod admitted without a word."""

from __future__ import annotations

from typing import Any

from vgpu import annotations as ann
from vgpu import hami
from webhook.admission import Settings, decide, review_dict
from webhook.capacity import InventorySummary
from webhook.review import AdmissionReview
from webhook.testing import make_review

UUID = "GPU-57463d96-17d5-e17c-5abe-3ea736b52b73"


def _review(annotations: dict[str, str]) -> dict[str, Any]:
    pod = {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
            ]
        },
    }
    request = AdmissionReview.model_validate(make_review(pod)).request
    assert request is not None
    outcome = decide(request, Settings(), None, inventory_expected=False)
    return review_dict(request.uid, outcome)["response"]


def test_a_hami_pod_is_admitted_without_warnings() -> None:
    resp = _review({hami.USE_GPU_TYPE: "A100", hami.NOUSE_GPU_UUID: UUID, hami.GPU_POLICY: "spread"})
    assert resp["allowed"] is True and "warnings" not in resp


def test_where_both_are_given_ours_win_and_the_response_warns() -> None:
    resp = _review(
        {
            ann.POD_USE_GPU_MODELS: "NVIDIA L4",
            hami.USE_GPU_TYPE: "A100",
            ann.POD_NODE_POLICY: "binpack",
            hami.NODE_POLICY: "spread",
            hami.USE_GPU_UUID: UUID,
            hami.NOUSE_GPU_UUID: UUID,
        }
    )
    assert resp["allowed"] is True
    assert resp["warnings"] == [
        "nvidia.com/use-gputype is ignored: vgpu.io/use-gpu-models is set and kube-vgpu's own key wins",
        "nvidia.com/nouse-gpuuuid is ignored: nvidia.com/use-gpuuuid is set, and HAMi then reads only that one",
        "hami.io/node-scheduler-policy is ignored: vgpu.io/node-policy is set and kube-vgpu's own key wins",
    ]


def test_bad_values_are_denied_naming_the_annotation_and_what_is_allowed() -> None:
    resp = _review({hami.GPU_POLICY: "Binpack"})
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    assert resp["status"]["message"] == (
        "annotation hami.io/gpu-scheduler-policy='Binpack' is invalid; allowed: binpack | spread | topology-aware"
    )
    resp = _review({hami.NOUSE_GPU_UUID: "GPU 0"})
    assert resp["allowed"] is False
    assert "annotation nvidia.com/nouse-gpuuuid='GPU 0' is invalid" in resp["status"]["message"]


def test_the_capacity_check_still_uses_our_own_models() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {ann.POD_USE_GPU_MODELS: "B200", hami.USE_GPU_TYPE: "A100"}},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
            ]
        },
    }
    request = AdmissionReview.model_validate(make_review(pod)).request
    assert request is not None
    summary = InventorySummary(frozenset())
    assert decide(request, Settings(), summary).allowed
