"""The assignment annotations the extender wrote or read last, by their text, so a pod's watch events decode it once.

Every MODIFIED event of a pod that holds an assignment carries the same `vgpu.io/assignment` text: the Binding's
event (the text our bind encoded a moment before), kube-scheduler's status writes, the deletion's event. Decoding
it (JSON, then the Assignment's nested frozen dataclasses, checked) was ~40 % of such an event in the pod watch
(in-process, scheduler_extender.sync.pod_event under cProfile), on the thread that competes with the verbs for the
GIL. An Assignment is immutable and `decode_assignment(encode_assignment(a)) == a` (tests/unit/test_annotations.py,
round trip), so the text our bind sends stands for the assignment it encoded, and one decoded stands for itself.
"""

from __future__ import annotations

from vgpu import annotations as ann
from vgpu.annotations import Assignment

# Texts kept: about the pods bound or being bound between two clears. A clear costs one decode per pod seen again,
# never a wrong answer; 4,096 texts of ~300 B and their Assignments are ~4 MiB.
LIMIT = 4096
# The longest text kept. Anyone who may create a pod may write any text here, up to the apiserver's 256 KiB of
# annotations (k8s.io/apimachinery v0.34 pkg/api/validation/objectmeta.go, TotalAnnotationSizeLimitB), padded with
# fields the decoder ignores or with thousands of slices: 4,096 such texts held 1-3 GiB (the extender's limit is
# 1 GiB). Ours are ASCII (json.dumps escapes the rest) and ~100 B a slice; a longer or non-ASCII text is decoded
# every time, as before the memo. Held at most: 4,096 texts of 4 KiB and what they decode to.
MAX_TEXT = 4096

_by_text: dict[str, Assignment] = {}


def _keep(text: str, assignment: Assignment) -> None:
    if len(text) > MAX_TEXT or not text.isascii():
        return
    if len(_by_text) >= LIMIT:
        _by_text.clear()  # the GIL makes each dict call atomic: a reader meanwhile misses and decodes
    _by_text[text] = assignment


def encode(assignment: Assignment) -> str:
    """`ann.encode_assignment`, remembering the text: the Binding's watch event then finds it decoded."""
    text = ann.encode_assignment(assignment)
    _keep(text, assignment)
    return text


def decode(text: str) -> Assignment:
    """`ann.decode_assignment` (CodecError for a text that does not decode, never remembered), once per text."""
    found = _by_text.get(text)
    if found is None:
        found = ann.decode_assignment(text)
        _keep(text, found)
    return found


def forget_all() -> None:
    """Drop every text (tests)."""
    _by_text.clear()
