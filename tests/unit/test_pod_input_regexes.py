"""The regexes still applied to what a pod author writes (audited for catastrophic backtracking; vgpu.roles' were
replaced by forward scans, tests/unit/test_roles.py): each is anchored or literal-led with no nested or overlapping
repetition, so one attempt is linear and a search makes one attempt per occurrence of its literal. Proved here by
completion, not by timing: on 200,000-character near misses a super-linear pattern would need ~10^10 steps and
run into the test's timeout; a linear one takes milliseconds."""

from __future__ import annotations

import re

import pytest

from vgpu import assignment_check, hami, model_servers
from webhook import labels

N = 200_000

# (pattern, how the code applies it, adversarial inputs: the longest prefix that almost matches, repeated)
CASES: list[tuple[str, re.Pattern[str], str, list[str]]] = [
    ("assignment_check.DNS1123_LABEL", assignment_check.DNS1123_LABEL, "fullmatch", ["a" * N + "-", "a-" * (N // 2)]),
    ("assignment_check.POD_UID", assignment_check.POD_UID, "fullmatch", ["0" * N, "01234567-" * (N // 9)]),
    ("hami.GPU_UUID", hami.GPU_UUID, "match", ["GPU-" + "a-" * (N // 2) + "!", "MIG-" + "a" * N + " "]),
    ("labels._VALUE", labels._VALUE, "match", ["a" * N + "-", "a." * (N // 2)]),
    ("model_servers._VLLM_IN_SCRIPT", model_servers._VLLM_IN_SCRIPT, "search", ["vllm " * (N // 5), "vllm" + " " * N]),
    ("model_servers._SGLANG_IN_SCRIPT", model_servers._SGLANG_IN_SCRIPT, "search", ["sglang.launch_" * (N // 14)]),
    ("model_servers._VERSION", model_servers._VERSION, "search", [":" + "1" * N, ":1" * (N // 2), ":v1." * (N // 4)]),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "pattern", "how", "texts"), CASES, ids=[c[0] for c in CASES])
def test_near_misses_of_any_length_complete(name: str, pattern: re.Pattern[str], how: str, texts: list[str]) -> None:
    for text in texts:
        getattr(pattern, how)(text)  # completing at all is the assertion; a quadratic pattern would not


def test_the_cases_cover_every_regex_on_pod_input() -> None:
    """A new pattern in these modules must be added above (or replaced by a scan, as vgpu.roles' were)."""
    compiled = {
        f"{mod.__name__.rsplit('.', 1)[-1]}.{attr}"
        for mod in (assignment_check, hami, labels, model_servers)
        for attr, value in vars(mod).items()
        if isinstance(value, re.Pattern)
    }
    assert compiled == {c[0] for c in CASES}
