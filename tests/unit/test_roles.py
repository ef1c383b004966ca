"""Role detection on real-shaped llm-d pods (docs/architecture.md, "Pod roles") and model identity for P/D locality."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vgpu.roles import Role, detect_role, model_identity

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
