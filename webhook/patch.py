"""JSON Patch (RFC 6902) operations and JSON Pointer (RFC 6901) paths, as the apiserver applies them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict


class PatchOp(TypedDict):
    op: Literal["add", "replace", "remove"]
    path: str
    value: NotRequired[Any]


def escape(token: str | int) -> str:
    """One reference token: `~` -> `~0` first, then `/` -> `~1` (so label keys like `vgpu.io/role` work)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(t) for t in tokens)


def set_entries(root: Mapping[str, Any], tokens: Sequence[str | int], entries: Mapping[str, Any]) -> list[PatchOp]:
    """Ops that make the map at `tokens` contain `entries`, creating missing parent maps.

    The first missing (or non-map) level is added whole with the entries nested inside it, because
    JSON Patch `add` cannot create intermediate members. Entries already equal produce no op, so the
    result is empty when the object already has them (reinvocation stays a no-op).
    """
    node: Any = root
    for depth, token in enumerate(tokens):
        child = _child(node, token)
        last = depth == len(tokens) - 1
        if not (isinstance(child, Mapping) or (not last and isinstance(child, list))):
            value: Any = dict(entries)
            for inner in reversed(tokens[depth + 1 :]):
                value = {str(inner): value}
            return [{"op": "add", "path": pointer(*tokens[: depth + 1]), "value": value}] if entries else []
        node = child
    return [
        {"op": "add", "path": pointer(*tokens, key), "value": value}
        for key, value in entries.items()
        if key not in node or node[key] != value
    ]


def remove_keys(root: Mapping[str, Any], tokens: Sequence[str | int], keys: Sequence[str]) -> list[PatchOp]:
    """`remove` ops for those of `keys` present in the map at `tokens` (none if the map is absent)."""
    node: Any = root
    for token in tokens:
        node = _child(node, token)
        if not isinstance(node, Mapping):
            return []
    return [{"op": "remove", "path": pointer(*tokens, key)} for key in keys if key in node]


def _child(node: Any, token: str | int) -> Any:
    if isinstance(token, int):
        return node[token] if isinstance(node, list) and 0 <= token < len(node) else None
    return node.get(token) if isinstance(node, Mapping) else None
