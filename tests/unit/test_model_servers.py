"""vLLM / SGLang sized to their slice: recognition, the flags each pod ends up with, and that they keep the server's
memory inside the slice on every card it may land on (computed from the mutated pod, not from the sizing's own
numbers). The corpus (tests/data/pods) and the shipped examples (deploy/examples) go through the whole review."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from vgpu import annotations as ann
from vgpu import model_servers as ms
from vgpu.devices import GpuDevice
from vgpu.requests import parse_pod_request
from webhook.admission import Settings
from webhook.capacity import InventorySummary
from webhook.metrics import WebhookMetrics
from webhook.model_servers import candidate_cards
from webhook.server import Reviewer
from webhook.testing import load_corpus, make_review, patch_ops

ROOT = Path(__file__).resolve().parents[2]
INDEX, PODS = load_corpus(ROOT / "tests" / "data" / "pods")
EXAMPLES = [d for d in yaml.safe_load_all((ROOT / "deploy" / "examples" / "llm-d-pd-pods.yaml").read_text()) if d]


class _Inventory:
    expected = True

    def __init__(self, summary: InventorySummary) -> None:
        self._summary = summary

    def summary(self) -> InventorySummary:
        return self._summary

    def ready(self) -> bool:
        return True


CLUSTER = InventorySummary.from_nodes(
    [GpuDevice(uuid=f"{n['node']}-{i}", index=i, model=n["model"], memory_mib=n["memoryMiB"]) for i in range(n["gpus"])]
    for n in INDEX["cluster"]
)


def _admit(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    reviewer = Reviewer(Settings(), _Inventory(CLUSTER), WebhookMetrics(CollectorRegistry()))
    status, body = reviewer.handle(orjson.dumps(make_review(pod, uid="u")), mutating=True)
    assert status == 200
    review: dict[str, Any] = orjson.loads(body)
    return review, jsonpatch.apply_patch(pod, patch_ops(review)) if review["response"]["allowed"] else pod


def _server_memory(server: ms.Server, fraction: float, card: int, argv: tuple[str, ...]) -> int:
    """The most the server takes on `card` under `fraction`, by its own rules (vgpu/model_servers.py docstring):
    vLLM the whole utilisation budget plus the 1 GiB it does not budget; SGLang weights + KV pool up to the fraction
    plus its own activation reserve."""
    if server is ms.Server.VLLM:
        return math.ceil(fraction * card) + ms.VLLM_MARGIN_MIN_MIB
    return math.ceil(fraction * card) + ms.sglang_reserve_mib(argv)


def _check_pod(name: str, pod: dict[str, Any]) -> list[str]:
    """One line per vGPU container: the flag it ends up with and the memory it takes on each card vs its slice."""
    review, mutated = _admit(pod)
    resp = review["response"]
    if not resp["allowed"]:
        return [f"{name}: denied ({resp['status']['message'][:60]})"]
    warnings = resp.get("warnings", [])
    request = parse_pod_request(pod)
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    if notes.get(ann.POD_MODEL_SERVER_SIZING) == ann.MODEL_SERVER_SIZING_OFF:
        assert mutated["spec"]["containers"] == [
            dict(c, resources=c.get("resources")) for c in pod["spec"]["containers"]
        ]
        return [f"{name}: opted out ({ann.POD_MODEL_SERVER_SIZING}: off), args as written"]
    models = ann.pod_overrides(notes).gpu_models
    selector = (pod["spec"].get("nodeSelector") or {}).get("nvidia.com/gpu.product")
    models = models or (frozenset({selector}) if selector else None)
    lines = []
    for ask in request.containers:
        (container,) = [c for c in mutated["spec"]["containers"] if c.get("name") == ask.container]
        inv = ms.recognise(container)
        if inv is None:
            lines.append(f"{name}/{ask.container}: not a model server")
            continue
        slice_ = ms.Slice(ask.memory_mib, ask.memory_percentage, candidate_cards(CLUSTER, models, ask.memory_mib))
        flag = ms.MEMORY_FLAG[inv.server]
        value = ms.flag_value(inv.argv, flag, "--kv-cache-memory-bytes")
        if value is None:
            whole = ask.memory_percentage == 100 or all((ask.memory_mib or 0) >= c for c in slice_.cards_mib)
            assert whole or any(f"container {ask.container!r}" in w for w in warnings), (name, warnings)
            lines.append(f"{name}/{ask.container}: {inv.server} unchanged ({'whole card' if whole else 'warned'})")
            continue
        if ms.flag_value(inv.argv, "--kv-cache-memory-bytes") is not None:
            assert any(f"container {ask.container!r}" in w for w in warnings), (name, warnings)
            lines.append(f"{name}/{ask.container}: {inv.server} --kv-cache-memory-bytes={value} kept (warned)")
            continue
        takes = {c: _server_memory(inv.server, float(value), c, inv.argv) for c in slice_.cards_mib}
        inside = all(takes[c] <= slice_.on(c) for c in takes)
        # Inside the slice on every card, or the user's own value, kept and warned about.
        assert inside or any(f"{flag}={value} (kept as set)" in w for w in warnings), (name, takes, warnings)
        shown = ", ".join(f"{takes[c]}/{slice_.on(c)} MiB on {c}" for c in sorted(takes))
        lines.append(f"{name}/{ask.container}: {flag}={value}: {shown}{'' if inside else ' (user value, warned)'}")
    return lines


def test_corpus_and_examples_stay_inside_their_slices(capsys: pytest.CaptureFixture[str]) -> None:
    lines = [line for name in sorted(PODS) for line in _check_pod(name, PODS[name])]
    lines += [line for pod in EXAMPLES for line in _check_pod(f"example {pod['metadata']['name']}", pod)]
    with capsys.disabled():
        print("\nflags per pod (server memory / slice on each card it may get):\n  " + "\n  ".join(lines))
    sized = [line for line in lines if "MiB on" in line and "warned" not in line]
    assert len(sized) == 17, lines  # every sized vLLM/SGLang container of the corpus and the examples


# The shipped examples' flags, one by one (deploy/examples/llm-d-pd-pods.yaml against the corpus cluster).
EXAMPLE_FLAGS = {
    "llama-8b-prefill-0": "--gpu-memory-utilization=0.2862",
    "llama-8b-decode-0": "--gpu-memory-utilization=0.3339",
    "llama-8b-decode-1": "--gpu-memory-utilization=0.3339",
    "qwen-32b-decode-tp2": "--gpu-memory-utilization=0.5699",
}


@pytest.mark.parametrize("pod", EXAMPLES, ids=lambda p: p["metadata"]["name"])
def test_shipped_examples_flags(pod: dict[str, Any]) -> None:
    review, mutated = _admit(pod)
    name = pod["metadata"]["name"]
    if name not in EXAMPLE_FLAGS:
        assert review["response"]["allowed"] is False  # too-big: asks more than the largest card
        return
    args = mutated["spec"]["containers"][0]["args"]
    assert args[: len(pod["spec"]["containers"][0]["args"])] == pod["spec"]["containers"][0]["args"]
    assert args[-1] == EXAMPLE_FLAGS[name]
    assert _admit(mutated)[0]["response"].get("patch") is None  # reinvocation adds nothing


def test_example_math_by_hand() -> None:
    # llama-8b-prefill-0: 24576 MiB on an H100 (81559) or L40S (46068): sized for the H100, margin 1229 MiB (5 %).
    assert ms.vllm_margin_mib(24576) == 1229
    assert (
        EXAMPLE_FLAGS["llama-8b-prefill-0"]
        == f"--gpu-memory-utilization={math.floor((24576 - 1229) / 81559 * 1e4) / 1e4}"
    )
    # qwen-32b-decode-tp2: 60 % of either card; the L40S is the tighter: (27640 - 1382) / 46068.
    assert (
        EXAMPLE_FLAGS["qwen-32b-decode-tp2"]
        == f"--gpu-memory-utilization={math.floor((27640 - 1382) / 46068 * 1e4) / 1e4}"
    )


@pytest.mark.parametrize(
    ("container", "server", "argv"),
    [
        ({"command": ["vllm", "serve"], "args": ["m", "--port=8000"]}, ms.Server.VLLM, ("m", "--port=8000")),
        ({"command": ["/usr/local/bin/vllm", "serve", "m"]}, ms.Server.VLLM, ("m",)),
        (
            {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "m"]},
            ms.Server.VLLM,
            ("--model", "m"),
        ),
        ({"image": "vllm/vllm-openai:v0.11.0", "args": ["--model=m"]}, ms.Server.VLLM, ("--model=m",)),
        ({"image": "docker.io/vllm/vllm-openai@sha256:ab", "args": []}, ms.Server.VLLM, ()),
        (
            {"command": ["python", "-m", "sglang.launch_server", "--model-path", "m"]},
            ms.Server.SGLANG,
            ("--model-path", "m"),
        ),
        (
            {"command": ["/bin/sh", "-c"], "args": ["exec vllm serve m --port 1 && echo done"]},
            ms.Server.VLLM,
            ("m", "--port", "1"),
        ),
        (
            {"command": ["bash", "-lc", "pip list; python3 -m sglang.launch_server --tp 2"]},
            ms.Server.SGLANG,
            ("--tp", "2"),
        ),
    ],
)
def test_recognised(container: dict[str, Any], server: ms.Server, argv: tuple[str, ...]) -> None:
    inv = ms.recognise(container)
    assert inv is not None and inv.server is server and inv.argv == argv


@pytest.mark.parametrize(
    "container",
    [
        {"image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"},
        {"image": "ghcr.io/llm-d/llm-d-cuda:v0.3.0"},  # its entrypoint is not known to be a server: say nothing
        {"image": "vllm/vllm-openai:v0.11.0", "command": ["python3", "bench.py"]},
        {"command": ["sh", "-c", "vllm serve a & vllm serve b"]},  # two servers in one script: not guessed at
        {"command": ["vllm", "bench", "serve"]},
    ],
)
def test_not_recognised(container: dict[str, Any]) -> None:
    assert ms.recognise(container) is None


def test_version_only_from_the_servers_own_image() -> None:
    assert ms.recognise({"image": "vllm/vllm-openai:v0.10.1", "args": []}).version == (0, 10, 1)  # type: ignore[union-attr]
    llmd = ms.recognise({"image": "ghcr.io/llm-d/llm-d-cuda:v0.3.0", "command": ["vllm", "serve"]})
    assert llmd is not None and llmd.version is None
    sg = ms.recognise({"image": "lmsysorg/sglang:v0.5.2-cu126", "command": ["python3", "-m", "sglang.launch_server"]})
    assert sg is not None and sg.version == (0, 5, 2)


def test_shell_line_gets_the_flag_after_the_invocation() -> None:
    container = {"command": ["/bin/sh", "-c"], "args": ["vllm serve m --port 8100 --kv-transfer-config '{\"a\": 1}'"]}
    sizing = ms.size(container, ms.Slice(30000, None, (81559,)))
    assert sizing.invocation is not None and sizing.flag is not None
    script = ms.with_flag(sizing.invocation, sizing.flag)
    assert shlex.split(script) == [
        "vllm",
        "serve",
        sizing.flag,
        "m",
        "--port",
        "8100",
        "--kv-transfer-config",
        '{"a": 1}',
    ]


def test_user_value_never_overridden() -> None:
    abbreviated = ms.size(
        {"image": "vllm/vllm-openai:v0.11.0", "args": ["--gpu-memory", "0.3"]}, ms.Slice(40000, None, (81559,))
    )
    assert abbreviated.outcome == "user-set" and abbreviated.flag is None  # argparse would read it as the fraction
    for value in ("0.3", "0.95", "abc"):
        container = {"image": "vllm/vllm-openai:v0.11.0", "args": [f"--gpu_memory_utilization={value}"]}
        sizing = ms.size(container, ms.Slice(40000, None, (81559,)))
        assert sizing.outcome == "user-set" and sizing.flag is None
        assert bool(sizing.warnings) is (value != "0.3")  # 0.3 of 81559 = 24468 MiB fits 40000; 0.95 does not


def test_hami_core_nodes_size_against_the_slice() -> None:
    # With HAMi-core preloaded CUDA reports the slice: 0.9 of it is wrong only by the margin, 0.2316 would waste 77 %.
    vllm = {"image": "vllm/vllm-openai:v0.11.0", "args": []}
    seen_slice = ms.size(vllm, ms.Slice(20000, None, (), seen="slice"))
    assert seen_slice.flag == "--gpu-memory-utilization=0.9488"  # (20000 - 1024) / 20000
    seen_card = ms.size(vllm, ms.Slice(20000, None, (81920,)))
    assert seen_card.flag == "--gpu-memory-utilization=0.2316"
    own = {"image": "vllm/vllm-openai:v0.11.0", "args": ["--gpu-memory-utilization=0.9"]}
    assert ms.size(own, ms.Slice(20000, None, (81920,), seen="slice")).warnings == ()  # 0.9 of the slice fits


def test_a_config_file_is_not_overridden() -> None:
    container = {"image": "vllm/vllm-openai:v0.11.0", "args": ["--config", "/etc/vllm/serve.yaml"]}
    sizing = ms.size(container, ms.Slice(40000, None, (81559,)))
    assert (
        sizing.flag is None and "--config=/etc/vllm/serve.yaml may set --gpu-memory-utilization" in sizing.warnings[0]
    )


def test_no_inventory_percentage_sized_for_the_smallest_card_mib_warned() -> None:
    vllm = {"image": "vllm/vllm-openai:v0.11.0", "args": []}
    pct = ms.size(vllm, ms.Slice(None, 50, ()))
    assert pct.fraction == math.floor((7680 - 1024) / 15360 * 1e4) / 1e4
    mib = ms.size(vllm, ms.Slice(20000, None, ()))
    assert mib.flag is None and "no GPU memory known" in mib.warnings[0]


# --- property: any slice, any cards, either server: inside the slice on every card, or no flag and a warning ---

_SERVERS = st.sampled_from(
    [
        {"image": "vllm/vllm-openai:v0.11.0", "args": ["--model=m"]},
        {"command": ["python3", "-m", "sglang.launch_server", "--model-path", "m"]},
        {"command": ["python3", "-m", "sglang.launch_server", "--chunked-prefill-size", "2048", "--tp", "4"]},
        {"command": ["sh", "-c", "vllm serve m --port 8000"]},
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    container=_SERVERS,
    cards=st.lists(st.integers(8000, 200_000), min_size=0, max_size=4).map(lambda c: tuple(sorted(set(c)))),
    memory=st.one_of(st.none(), st.integers(1, 200_000)),
    percentage=st.integers(1, 100),
    seen=st.sampled_from(["card", "slice"]),
)
def test_sized_server_stays_inside_its_slice(
    container: dict[str, Any], cards: tuple[int, ...], memory: int | None, percentage: int, seen: ms.Seen
) -> None:
    cards = tuple(c for c in cards if memory is None or c >= memory)
    slice_ = ms.Slice(memory, None if memory is not None else percentage, cards, seen)
    sizing = ms.size({"name": "s", **container}, slice_)
    assert sizing.server is not None and sizing.invocation is not None
    if sizing.flag is None:
        assert sizing.outcome == "whole-card" or sizing.warnings
        return
    fraction = sizing.fraction
    assert fraction is not None and 0 < fraction < 1
    anywhere = (memory or 0, ms.SMALLEST_CARD_MIB, 2 * ms.SMALLEST_CARD_MIB, 8 * ms.SMALLEST_CARD_MIB)
    for card in cards or [c for c in anywhere if c >= (memory or 1)]:  # no inventory: any card that holds it
        seen_mib = slice_.seen_on(card)  # what the server takes its fraction of
        assert _server_memory(sizing.server, fraction, seen_mib, sizing.invocation.argv) <= slice_.on(card)
    # Idempotent: the sized container, sized again, keeps the value and says nothing.
    flagged = dict(container, args=[*container.get("args", []), sizing.flag]) if not sizing.invocation.shell else None
    if flagged is not None:
        again = ms.size({"name": "s", **flagged}, slice_)
        assert again.outcome == "user-set" and again.flag is None and again.warnings == ()
