"""The `vgpu.io/` vocabulary is defined once: docs/annotations.md's table is `KEYS`, no other module spells a key,
and every key the docs and manifests name exists. Plus the codecs that joined the module with it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu import annotations as ann
from vgpu.errors import CodecError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "annotations.md"
CODE = ("vgpu", "vgpu_cli", "scheduler_extender", "device_plugin", "webhook")
KEY = re.compile(r"(?<![\w.])vgpu\.io/[a-z0-9][a-z0-9-]*")


def _doc_table() -> list[tuple[str, str, str]]:
    text = DOC.read_text()
    table = text[text.index("## Keys") : text.index("## Guarded by the admission policy")]
    rows = [line for line in table.splitlines() if line.startswith("| `vgpu.io/")]
    out = []
    for row in rows:
        key, kind, on = (cell.strip() for cell in row.strip("|").split("|")[:3])
        out.append((key.strip("`"), kind, on))
    return out


def test_the_docs_table_lists_exactly_the_keys_of_the_module() -> None:
    documented = _doc_table()
    assert len(documented) == len(set(documented)), "a key is listed twice"
    assert sorted(documented) == sorted((k.name, k.kind, k.on) for k in ann.KEYS)


def test_keys_are_unique_per_kind_and_under_the_prefix() -> None:
    pairs = [(k.name, k.kind) for k in ann.KEYS]
    assert len(pairs) == len(set(pairs))
    assert all(KEY.fullmatch(k.name) for k in ann.KEYS)
    assert {k.name for k in ann.KEYS if k.kind == "label" and k.name in ann.WEBHOOK_LABELS} == set(ann.WEBHOOK_LABELS)


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and (KEY.fullmatch(node.value) or node.value == ann.PREFIX)
    ]


def test_no_module_but_the_vocabulary_spells_a_key() -> None:
    """Messages may name a key in prose; a bare key literal (a dict key, a comparison) belongs in vgpu.annotations."""
    home = ROOT / "vgpu" / "annotations.py"
    found = []
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == home:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {value!r}" for line, value in _literals(path)]
    assert found == []


def test_every_key_the_docs_and_manifests_name_exists() -> None:
    known = {k.name for k in ann.KEYS}
    files = [
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "README.md",
        *sorted((ROOT / "deploy").rglob("*.yaml")),
        *sorted((ROOT / "vgpu_cli" / "data").rglob("*.yaml")),
        *sorted((ROOT / "tests" / "data").rglob("*.yaml")),
    ]
    unknown = {
        f"{path.relative_to(ROOT)}: {key}"
        for path in files
        for key in KEY.findall(path.read_text())
        if key not in known
    }
    assert unknown == set()


def test_the_cri_annotations_are_the_ones_allocate_returns() -> None:
    from device_plugin.envs import EnvSettings, container_slice

    c = ann.ContainerAssignment("vllm", (ann.DeviceSlice("GPU-a", 0, 1024, 10),))
    got = container_slice(
        c, namespace="ns", pod="p", pod_uid="6f1b3c2a-9d8e-4f70-a1b2-c3d4e5f60718", index=0, settings=EnvSettings()
    )
    assert got.annotations == {"vgpu.io/pod": "ns/p", "vgpu.io/container": "vllm"}
    assert set(got.annotations) == {k.name for k in ann.KEYS if k.kind == "CRI annotation"}


# --- vgpu.io/violation ----------------------------------------------------------------------------------

_TEXT = st.text(max_size=30)


@given(
    st.builds(
        ann.Violation,
        container=_TEXT,
        gpu=_TEXT,
        kinds=st.lists(st.sampled_from(["memory", "sm"]), max_size=2).map(tuple),
        reason=_TEXT,
        time=_TEXT,
    )
)
def test_violation_round_trips(v: ann.Violation) -> None:
    assert ann.decode_violation(ann.encode_violation(v)) == v


def test_violation_wire_format() -> None:
    v = ann.Violation(container="vllm", gpu="GPU-1", kinds=("memory",), reason="r", time="2026-01-05T10:12:03Z")
    assert ann.encode_violation(v) == (
        '{"container":"vllm","gpu":"GPU-1","kinds":["memory"],"reason":"r","time":"2026-01-05T10:12:03Z",'
        '"version":"v1"}'
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{", "not JSON"),
        ('{"version":"v2"}', "unsupported version 'v2'"),
        ('{"version":"v1","gpu":"g","kinds":[],"reason":"r","time":"t"}', "violation: missing field 'container'"),
        ('{"version":"v1","container":"c","gpu":"g","kinds":[1],"reason":"r","time":"t"}', "list of strings"),
    ],
)
def test_bad_violation(value: str, reason: str) -> None:
    with pytest.raises(CodecError) as info:
        ann.decode_violation(value)
    assert info.value.key == ann.POD_VIOLATION and reason in info.value.reason


# --- the user's per-pod keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "models"),
    [
        (None, None),
        ("", None),
        (" , ,", None),
        ("H100-80GB", frozenset({"H100-80GB"})),
        (" H100-80GB , A100-40GB,,", frozenset({"H100-80GB", "A100-40GB"})),
    ],
)
def test_use_gpu_models_parses_once(value: str | None, models: frozenset[str] | None) -> None:
    assert ann.parse_gpu_models(value) == models
    annotations = {} if value is None else {ann.POD_USE_GPU_MODELS: value}
    assert ann.pod_overrides(annotations).gpu_models == models


def test_pod_overrides_read_only_non_empty_strings() -> None:
    got = ann.pod_overrides({ann.POD_NODE_POLICY: "spread", ann.POD_GPU_POLICY: "", "other": "x"})
    assert got == ann.PodOverrides(node_policy="spread")
    assert ann.pod_overrides({ann.POD_NODE_POLICY: 3, ann.POD_USE_GPU_MODELS: ["a"]}) == ann.PodOverrides()


def test_pod_info_reads_the_overrides_through_the_one_parser() -> None:
    from tests.conftest import make_info

    annotations = {ann.POD_USE_GPU_MODELS: " L4 ,H100-80GB", ann.POD_NODE_POLICY: "binpack", ann.POD_GPU_POLICY: ""}
    info = make_info(annotations=annotations)
    want = ann.pod_overrides(annotations)
    assert (info.gpu_models, info.node_policy, info.gpu_policy) == (want.gpu_models, "binpack", None)
    assert want.gpu_models == frozenset({"L4", "H100-80GB"})
