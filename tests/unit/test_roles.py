"""Role detection on real-shaped llm-d pods (docs/architecture.md, "Pod roles") and model identity for P/D locality."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu import roles
from vgpu.roles import MAX_SCAN_CHARS, Role, detect_role, flag_in_text, kv_role_in_text, model_identity

VLLM = ["vllm", "serve", "Qwen/Qwen3-32B", "--port", "8200", "--enforce-eager"]
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-32B", "--port", "8000"]


def _pod(
    *,
    labels: dict[str, str] | None = None,
    command: list[str] | None = None,
    args: list[str] | None = None,
    init: list[dict[str, Any]] | None = None,
    namespace: str = "llm-d",
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "vllm", "image": "ghcr.io/llm-d/llm-d-cuda:v0.3.0"}
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    spec: dict[str, Any] = {"containers": [container]}
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": {"name": "ms-decode-0", "namespace": namespace, "labels": labels or {}}, "spec": spec}


def _kv(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role})


SIDECAR = {
    "name": "routing-proxy",
    "image": "ghcr.io/llm-d/llm-d-routing-sidecar:v0.3.0",
    "restartPolicy": "Always",
    "args": ["--port=8000", "--vllm-port=8200", "--connector=nixlv2"],
}


@pytest.mark.parametrize(
    ("pod", "role", "source"),
    [
        # The llm-d label, every value it takes.
        (_pod(labels={"llm-d.ai/role": "prefill"}), Role.PREFILL, "label"),
        (_pod(labels={"llm-d.ai/role": "decode"}), Role.DECODE, "label"),
        (_pod(labels={"llm-d.ai/role": "prefill-decode"}), Role.PREFILL_DECODE, "label"),
        (_pod(labels={"llm-d.ai/role": "both"}), Role.PREFILL_DECODE, "label"),  # deprecated alias
        (_pod(labels={"llm-d.ai/role": "encode"}), Role.ENCODE, "label"),
        (_pod(labels={"llm-d.ai/role": "encode-prefill"}), Role.ENCODE_PREFILL, "label"),
        (_pod(labels={"llm-d.ai/role": "encode-prefill-decode"}), Role.ENCODE_PREFILL_DECODE, "label"),
        # The label wins over every fallback.
        (
            _pod(labels={"llm-d.ai/role": "decode"}, command=SGLANG, args=["--disaggregation-mode=prefill"]),
            Role.DECODE,
            "label",
        ),
        # An unknown label value falls through to the next signal.
        (_pod(labels={"llm-d.ai/role": "router"}, args=["--disaggregation-mode=prefill"]), Role.PREFILL, "sglang-arg"),
        # SGLang flag: joined, split, and inside a shell string.
        (_pod(command=SGLANG, args=["--disaggregation-mode=decode"]), Role.DECODE, "sglang-arg"),
        (_pod(command=SGLANG, args=["--disaggregation-mode", "prefill"]), Role.PREFILL, "sglang-arg"),
        (
            _pod(
                command=["sh", "-c"],
                args=["python -m sglang.launch_server --model-path Qwen/Qwen3-32B --disaggregation-mode prefill"],
            ),
            Role.PREFILL,
            "sglang-arg",
        ),
        (
            _pod(command=["/bin/sh", "-c", "exec python3 -m sglang.launch_server --disaggregation-mode=decode --tp 2"]),
            Role.DECODE,
            "sglang-arg",
        ),
        # "null" is SGLang's aggregated mode: no signal.
        (_pod(command=SGLANG, args=["--disaggregation-mode", "null"]), Role.PREFILL_DECODE, "default"),
        # Routing sidecar: a native sidecar (init container, restartPolicy Always) marks the decode pod.
        (_pod(command=VLLM, init=[SIDECAR]), Role.DECODE, "routing-sidecar"),
        (_pod(command=VLLM, init=[{**SIDECAR, "name": "routing-sidecar"}]), Role.DECODE, "routing-sidecar"),
        (
            _pod(command=VLLM, init=[{k: v for k, v in SIDECAR.items() if k != "restartPolicy"}]),
            Role.PREFILL_DECODE,
            "default",
        ),
        (_pod(command=VLLM, init=[{**SIDECAR, "name": "model-downloader"}]), Role.PREFILL_DECODE, "default"),
        # The sidecar outranks kv_role (llm-d decode pods may carry kv_both).
        (
            _pod(command=VLLM, args=["--kv-transfer-config", _kv("kv_producer")], init=[SIDECAR]),
            Role.DECODE,
            "routing-sidecar",
        ),
        # vLLM --kv-transfer-config.
        (_pod(command=VLLM, args=["--kv-transfer-config", _kv("kv_producer")]), Role.PREFILL, "kv-transfer-config"),
        (_pod(command=VLLM, args=[f"--kv-transfer-config={_kv('kv_consumer')}"]), Role.DECODE, "kv-transfer-config"),
        (_pod(command=VLLM, args=["--kv-transfer-config", _kv("kv_both")]), Role.PREFILL_DECODE, "default"),
        (
            _pod(command=["sh", "-c", f"vllm serve Qwen/Qwen3-32B --kv-transfer-config '{_kv('kv_producer')}'"]),
            Role.PREFILL,
            "kv-transfer-config",
        ),
        (
            _pod(
                command=[
                    "sh",
                    "-c",
                    'vllm serve m --kv-transfer-config "{\\"kv_connector\\": \\"NixlConnector\\", '
                    '\\"kv_role\\": \\"kv_consumer\\"}" --port 8200',
                ]
            ),
            Role.DECODE,
            "kv-transfer-config",
        ),
        (
            _pod(command=VLLM, args=["--kv-transfer-config", "{not json, kv_role: kv_consumer}"]),
            Role.DECODE,
            "kv-transfer-config",
        ),
        (_pod(command=VLLM, args=["--kv-transfer-config", "[1, 2]"]), Role.PREFILL_DECODE, "default"),
        # No signal at all: aggregated.
        (_pod(command=VLLM), Role.PREFILL_DECODE, "default"),
        ({}, Role.PREFILL_DECODE, "default"),
    ],
)
def test_detect_role(pod: dict[str, Any], role: Role, source: str) -> None:
    decision = detect_role(pod)
    assert (decision.role, decision.source) == (role, source)


@pytest.mark.parametrize(
    ("role", "prefill", "decode"),
    [
        (Role.PREFILL, True, False),
        (Role.ENCODE_PREFILL, True, False),
        (Role.DECODE, False, True),
        (Role.PREFILL_DECODE, False, False),
        (Role.ENCODE, False, False),
        (Role.ENCODE_PREFILL_DECODE, False, False),
    ],
)
def test_role_work_kinds(role: Role, prefill: bool, decode: bool) -> None:
    assert (role.does_prefill, role.does_decode) == (prefill, decode)


@pytest.mark.parametrize(
    ("labels", "namespace", "identity"),
    [
        ({"llm-d.ai/model": "qwen3-32b"}, "team-a", "team-a/qwen3-32b"),
        ({"llm-d.ai/inferenceServing": "pool-x"}, "team-a", "team-a/pool-x"),
        ({"llm-d.ai/inference-serving": "pool-y"}, "team-b", "team-b/pool-y"),
        ({"llm-d.ai/guide": "pd-disaggregation"}, "team-a", "team-a/pd-disaggregation"),
        ({"llm-d.ai/model": "m", "llm-d.ai/guide": "g"}, "team-a", "team-a/m"),  # model first
        ({"llm-d.ai/model": "", "llm-d.ai/guide": "g"}, "team-a", "team-a/g"),  # empty values skipped
        ({"llm-d.ai/role": "decode"}, "team-a", None),
        ({"llm-d.ai/model": "m"}, "", "default/m"),
    ],
)
def test_model_identity_is_namespaced(labels: dict[str, str], namespace: str, identity: str | None) -> None:
    assert model_identity(_pod(labels=labels, namespace=namespace)) == identity


def test_same_model_name_in_two_namespaces_is_two_identities() -> None:
    a = model_identity(_pod(labels={"llm-d.ai/model": "m"}, namespace="a"))
    b = model_identity(_pod(labels={"llm-d.ai/model": "m"}, namespace="b"))
    assert a is not None and b is not None and a != b


# --- parsing pod-author text without regexes: the same answers as the regexes replaced, in linear time -----------

# The regexes vgpu.roles used before its forward scans, kept here as the specification they must agree with.
_FLAG_REGEX = r"(?:=|\s+)('([^']*)'|\"((?:[^\"\\]|\\.)*)\"|(\S+))"
_KV_REGEX = re.compile(r"""["']?kv_role["']?\s*:\s*["']?(kv_\w+)""")


def _flag_by_regex(text: str, flag: str) -> str | None:
    m = re.search(re.escape(flag) + _FLAG_REGEX, text)
    if m is None:
        return None
    if m.group(3) is not None:
        return re.sub(r"\\(.)", r"\1", m.group(3))
    return m.group(2) if m.group(2) is not None else m.group(4)


def _kv_by_regex(text: str) -> str | None:
    m = _KV_REGEX.search(text)
    return m.group(1) if m else None


# Text built from the pieces that matter to these grammars (flag, =, quotes, backslashes, whitespace incl. newline
# and a Unicode space, word characters), so that the interesting cases are common rather than rare.
_PIECES = st.sampled_from(
    ["--kv-transfer-config", "--kv", "=", " ", "  ", "\t", "\n", "\u2003", "'", '"', "\\", "\\\"", "x", "kv_",
     "kv_role", ":", "{", "}", "kv_producer", "é", "1", "_", ",", "-"]
)  # fmt: skip
_TEXT = st.lists(_PIECES, max_size=40).map("".join)


@settings(max_examples=3000, deadline=None)
@given(_TEXT)
def test_flag_scan_agrees_with_the_regex_it_replaced(text: str) -> None:
    assert flag_in_text(text, "--kv-transfer-config") == _flag_by_regex(text, "--kv-transfer-config")


@settings(max_examples=3000, deadline=None)
@given(_TEXT)
def test_kv_role_scan_agrees_with_the_regex_it_replaced(text: str) -> None:
    assert kv_role_in_text(text) == _kv_by_regex(text)


# Inputs that make a backtracking matcher work hardest: every occurrence of the flag or key an almost-match.
_ADVERSARIAL = [
    "--kv-transfer-config" + " " * 200_000,
    '--kv-transfer-config "' + "\\x" * 100_000,
    "--kv-transfer-config= " * 10_000,
    ("--kv-transfer-config" + " " * 50) * 4_000,
    "kv_role" + " " * 200_000 + ":" + " " * 200_000,
    "kv_role: " * 40_000,
    ("kv_role'" + "\t" * 30 + ": '" + "kv" + " ") * 5_000,
]


@pytest.mark.parametrize("text", _ADVERSARIAL, ids=lambda t: f"{t[:24]!r}x{len(t)}")
def test_adversarial_text_is_scanned_in_one_pass(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear by counting, not timing: every character the scans read goes through str.isspace / _is_word or
    str.find; the count of per-character reads stays within a small multiple of the text's length."""
    reads = 0
    real_is_word = roles._is_word

    def counting_is_word(c: str) -> bool:
        nonlocal reads
        reads += 1
        return real_is_word(c)

    class Text(str):
        def __getitem__(self, key: Any) -> Any:  # every character the scans look at
            nonlocal reads
            reads += 1
            return str.__getitem__(self, key)

    monkeypatch.setattr(roles, "_is_word", counting_is_word)
    flag_in_text(Text(text), "--kv-transfer-config")
    kv_role_in_text(Text(text))
    assert reads <= 4 * len(text) + 100, f"{reads} character reads for {len(text)} characters"


def test_flags_past_the_scan_cap_are_not_seen_and_inside_it_are() -> None:
    producer = "--kv-transfer-config '" + _kv("kv_producer") + "'"
    pad = "x" * (MAX_SCAN_CHARS - 1000)
    assert detect_role(_pod(command=["sh", "-c", f"vllm serve m {pad} {producer}"])).role is Role.PREFILL
    far = "x" * MAX_SCAN_CHARS
    assert detect_role(_pod(command=["sh", "-c", f"vllm serve m {far} {producer}"])).role is Role.PREFILL_DECODE
