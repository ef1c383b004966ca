"""The webhook on vgpu.io/require-nvlink: a bad value denied naming the key and the allowed values, a pointless one warned."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu.devices import GpuDevice
from webhook.admission import Settings, decide
from webhook.capacity import InventorySummary
from webhook.review import AdmissionRequest, AdmissionReview
from webhook.testing import make_review


def _request(annotations: dict[str, str], gpus: str = "2") -> AdmissionRequest:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
    }
    parsed = AdmissionReview.model_validate(make_review(pod)).request
    assert parsed is not None
    return parsed


@pytest.mark.parametrize("value", ["yes", "True", "1"])
def test_a_value_other_than_true_or_false_is_denied(value: str) -> None:
    out = decide(_request({"vgpu.io/require-nvlink": value}), Settings(), None, inventory_expected=False)
    assert not out.allowed and out.code == 400
    assert out.message == f'annotation vgpu.io/require-nvlink={value!r} is invalid; allowed: "true" or "false"'


@pytest.mark.parametrize("value", ["true", "false", ""])
def test_true_and_false_are_admitted(value: str) -> None:
    out = decide(_request({"vgpu.io/require-nvlink": value}), Settings(), None, inventory_expected=False)
    assert out.allowed, out.message
    assert not any("require-nvlink" in w for w in out.warnings)


def test_requiring_nvlink_of_a_single_gpu_pod_is_warned() -> None:
    out = decide(_request({"vgpu.io/require-nvlink": "true"}, gpus="1"), Settings(), None, inventory_expected=False)
    assert out.allowed
    assert (
        "vgpu.io/require-nvlink: no container asks for more than one vGPU, so it has nothing to connect" in out.warnings
    )


def _gpus(n: int, linked: str) -> list[GpuDevice]:
    uuids = [f"g{i}" for i in range(n)]
    peers = {
        "all": lambda i: tuple(u for u in uuids if u != uuids[i]),
        "pairs": lambda i: (uuids[i ^ 1],),
        "none": lambda i: (),
    }[linked]
    return [GpuDevice(uuid=uuids[i], index=i, model="H100", memory_mib=81920, nvlink_peers=peers(i)) for i in range(n)]


def test_a_cluster_without_enough_nvlink_peers_denies_the_required_size() -> None:
    pairs_only = InventorySummary.from_nodes([_gpus(8, "pairs"), _gpus(8, "none")])
    out = decide(_request({"vgpu.io/require-nvlink": "true"}, gpus="4"), Settings(), pairs_only)
    assert not out.allowed
    assert out.message == (
        "container 'main': nvidia.com/gpu=4 is invalid; "
        "allowed: 1..2 with vgpu.io/require-nvlink (the most GPUs of any node that are all NVLink peers)"
    )
    assert decide(_request({"vgpu.io/require-nvlink": "true"}, gpus="2"), Settings(), pairs_only).allowed
    assert decide(_request({}, gpus="4"), Settings(), pairs_only).allowed  # only preferred: admitted
    with_nvswitch = InventorySummary.from_nodes([_gpus(8, "pairs"), _gpus(8, "all")])
    assert decide(_request({"vgpu.io/require-nvlink": "true"}, gpus="8"), Settings(), with_nvswitch).allowed
    static = InventorySummary.static(max_gpu_memory_mib=81920, max_gpus_per_node=8)  # links unknown: not checked
    assert decide(_request({"vgpu.io/require-nvlink": "true"}, gpus="8"), Settings(), static).allowed
