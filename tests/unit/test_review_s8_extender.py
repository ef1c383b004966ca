"""Review of the extender's assignment memo and one-write pools: what a pod author's text may cost the memo.

The `vgpu.io/assignment` annotation is written by our bind, but anyone who may create a pod may write any text
there, up to the apiserver's 256 KiB of annotations, padded with fields the decoder ignores or with thousands of
slices. The pod watch decodes it (and refuses it later, in the state); the memo must not keep such texts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from scheduler_extender import assignment_memo
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice


def _base() -> dict[str, object]:
    a = Assignment("n1", (ContainerAssignment("vllm", (DeviceSlice("GPU-1", 0, 1024, 20),)),))
    obj: dict[str, object] = json.loads(ann.encode_assignment(a))
    return obj


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    assignment_memo.forget_all()
    yield
    assignment_memo.forget_all()


def _held_chars() -> int:
    return sum(len(t) for t in assignment_memo._by_text)


def test_a_flood_of_padded_texts_is_decoded_but_not_held() -> None:
    """64 distinct 128 KiB texts (valid: the decoder ignores an unknown field) held 8 MiB; at the memo's 4,096
    texts of 256 KiB that is 1 GiB, the extender's memory limit (deploy/manifests/extender.yaml)."""
    for i in range(64):
        text = json.dumps({**_base(), "pad": "x" * (128 * 1024), "i": i})
        assert assignment_memo.decode(text) == ann.decode_assignment(text)
    assert _held_chars() <= 4 * 1024 * 1024, f"{_held_chars() / 2**20:.1f} MiB of pod authors' texts held"


def test_a_text_of_thousands_of_slices_is_not_held() -> None:
    """Such a text decodes to ~700 KiB of objects; 4,096 of them were ~2.8 GiB in the memo."""
    devices = [{"uuid": str(j), "index": 0, "memoryMiB": 0, "cores": 0} for j in range(4000)]
    text = json.dumps({**_base(), "containers": [{"name": "c", "devices": devices}]})
    assert len(assignment_memo.decode(text).containers[0].devices) == 4000
    assert _held_chars() == 0


def test_a_non_ascii_text_is_not_held_and_ours_still_is() -> None:
    """Ours are ASCII (json.dumps escapes the rest), so a text with a 4-byte character is a hand-written one."""
    text = json.dumps({**_base(), "model": "\U0001f600" * 1000}, ensure_ascii=False)
    assert assignment_memo.decode(text).model == "\U0001f600" * 1000
    assert _held_chars() == 0
    a = Assignment("n1", (ContainerAssignment("vllm", (DeviceSlice("GPU-1", 0, 1024, 20),)),), model="é")
    ours = assignment_memo.encode(a)
    assert assignment_memo.decode(ours) is a
