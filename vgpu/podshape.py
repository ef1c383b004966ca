"""The JSON types of the Pod fields the core reads, checked once before any parse.

The parsers (vgpu.pod, vgpu.requests, vgpu.roles) read pods with `.get` chains that assume the types of core/v1
Pod; a hostile or broken body (`"spec": []`, `"labels": {"a": 1}`) must be answered with the field path and the
type expected, not an AttributeError. Only the fields read are checked, each once, so the check is linear in
their size; every other field passes untouched (a newer apiserver's fields are no concern of ours). JSON null is
accepted wherever Go's omitempty would leave the field out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_META_STRINGS = ("name", "namespace", "uid", "generateName", "resourceVersion")
_CONTAINER_STRINGS = ("name", "restartPolicy")


class PodShapeError(ValueError):
    """A field of the pod has the wrong JSON type; the message names its path and the type allowed."""


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _fail(path: str, want: str, value: object) -> PodShapeError:
    return PodShapeError(f"{path}: expected {want}, got {_kind(value)}")


def _object(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(f"{path}{key}", "an object", value)
    return value


def _array(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(f"{path}{key}", "an array", value)
    return value


def _string(parent: Mapping[str, Any], key: str, path: str) -> None:
    value = parent.get(key)
    if value is not None and not isinstance(value, str):
        raise _fail(f"{path}{key}", "a string", value)


def _string_map(parent: Mapping[str, Any], key: str, path: str) -> None:
    for k, v in _object(parent, key, path).items():
        if not isinstance(v, str):
            raise _fail(f"{path}{key}[{k!r}]", "a string", v)


def _quantities(parent: Mapping[str, Any], key: str, path: str) -> None:
    """requests/limits: resource name -> quantity (a string; a number where a hand-written body sends one)."""
    for k, v in _object(parent, key, path).items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise _fail(f"{path}{key}[{k!r}]", "a quantity string", v)


def _container(c: object, path: str) -> None:
    if not isinstance(c, Mapping):
        raise _fail(path, "an object (a container)", c)
    prefix = path + "."
    for key in _CONTAINER_STRINGS:
        _string(c, key, prefix)
    for key in ("command", "args"):
        for i, arg in enumerate(_array(c, key, prefix)):
            if not isinstance(arg, str):
                raise _fail(f"{prefix}{key}[{i}]", "a string", arg)
    resources = _object(c, "resources", prefix)
    _quantities(resources, "requests", prefix + "resources.")
    _quantities(resources, "limits", prefix + "resources.")


def check_pod_shape(pod: object, where: str = "") -> None:
    """Raise PodShapeError naming the first field (as `where` + its path) whose JSON type a Pod cannot have."""
    if not isinstance(pod, Mapping):
        raise _fail(where or "<pod>", "an object (a Pod)", pod)
    root = f"{where}." if where else ""
    meta = _object(pod, "metadata", root)
    for key in _META_STRINGS:
        _string(meta, key, root + "metadata.")
    _string_map(meta, "labels", root + "metadata.")
    _string_map(meta, "annotations", root + "metadata.")
    spec = _object(pod, "spec", root)
    _string(spec, "nodeName", root + "spec.")
    _string(spec, "schedulerName", root + "spec.")
    for key in ("containers", "initContainers"):
        for i, c in enumerate(_array(spec, key, root + "spec.")):
            _container(c, f"{root}spec.{key}[{i}]")
    _string(_object(pod, "status", root), "phase", root + "status.")
