from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from webhook.patch import escape, pointer, remove_keys, set_entries


@pytest.mark.parametrize(
    ("token", "escaped"),
    [("vgpu.io/role", "vgpu.io~1role"), ("a~b", "a~0b"), ("~/", "~0~1"), ("~1", "~01"), ("plain", "plain"), (3, "3")],
)
def test_escape(token: str | int, escaped: str) -> None:
    assert escape(token) == escaped


def test_pointer_round_trips_through_a_real_json_patch() -> None:
    doc: dict[str, Any] = {"metadata": {"labels": {}}}
    path = pointer("metadata", "labels", "a~b/c")
    assert path == "/metadata/labels/a~0b~1c"
    assert jsonpatch.apply_patch(doc, [{"op": "add", "path": path, "value": "x"}]) == {
        "metadata": {"labels": {"a~b/c": "x"}}
    }


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"metadata": None},
        {"metadata": {}},
        {"metadata": {"labels": None}},
        {"metadata": {"labels": {"keep": "1", "k/x": "old"}}},
        {"metadata": {"labels": {"k/x": "new"}}},
    ],
)
def test_set_entries_creates_missing_levels_and_is_idempotent(doc: dict[str, Any]) -> None:
    entries = {"k/x": "new", "k/y": "2"}
    ops = set_entries(doc, ("metadata", "labels"), entries)
    out = jsonpatch.apply_patch(doc, ops)
    assert entries.items() <= out["metadata"]["labels"].items()
    if isinstance(doc.get("metadata"), dict) and isinstance(doc["metadata"].get("labels"), dict):
        for key, value in doc["metadata"]["labels"].items():
            if key not in entries:
                assert out["metadata"]["labels"][key] == value
    assert set_entries(out, ("metadata", "labels"), entries) == []


def test_set_entries_walks_through_lists() -> None:
    doc = {"spec": {"containers": [{"name": "a"}, {"name": "b", "resources": {}}]}}
    ops = set_entries(doc, ("spec", "containers", 1, "resources", "limits"), {"nvidia.com/gpu": "1"})
    assert ops == [{"op": "add", "path": "/spec/containers/1/resources/limits", "value": {"nvidia.com/gpu": "1"}}]
    out = jsonpatch.apply_patch(doc, ops)
    assert out["spec"]["containers"][0] == {"name": "a"}


@pytest.mark.parametrize(
    ("doc", "removed"),
    [
        ({}, []),
        ({"metadata": {"annotations": {"a/b": "1", "c": "2"}}}, ["a/b"]),
        ({"metadata": {"annotations": {"c": "2"}}}, []),
    ],
)
def test_remove_keys(doc: dict[str, Any], removed: list[str]) -> None:
    ops = remove_keys(doc, ("metadata", "annotations"), ["a/b", "zz"])
    assert [op["path"] for op in ops] == [pointer("metadata", "annotations", k) for k in removed]
    out = jsonpatch.apply_patch(doc, ops)
    assert "a/b" not in out.get("metadata", {}).get("annotations", {})
