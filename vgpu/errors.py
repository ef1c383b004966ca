"""Typed errors of the domain core; every message names what was wrong and what is allowed."""

from __future__ import annotations


class VgpuError(Exception):
    """Base of every error raised by the domain core."""


class RequestError(VgpuError):
    """A container asked for vGPU resources in a way that can never be satisfied."""

    def __init__(self, *, container: str, resource: str, value: object, allowed: str) -> None:
        self.container = container
        self.resource = resource
        self.value = value
        self.allowed = allowed
        super().__init__(f"container {container!r}: {resource}={value!r} is invalid; allowed: {allowed}")


class AnnotationError(RequestError):
    """A pod annotation's value can never be honoured; names the key, the value and what is allowed.

    A RequestError, so every path that refuses an impossible request (the webhook, /filter on every node,
    /bind) refuses it the same way."""

    def __init__(self, *, key: str, value: str, allowed: str) -> None:
        self.container = ""
        self.resource = f"annotation {key}"
        self.value = value
        self.allowed = allowed
        VgpuError.__init__(self, f"annotation {key}={value!r} is invalid; allowed: {allowed}")


class CodecError(VgpuError):
    """An annotation value could not be decoded."""

    def __init__(self, *, key: str, reason: str, value: str | None = None) -> None:
        self.key = key
        self.reason = reason
        shown = value if value is None or len(value) <= 120 else value[:117] + "..."
        suffix = f" (value: {shown!r})" if shown is not None else ""
        super().__init__(f"annotation {key}: {reason}{suffix}")


class CapacityError(VgpuError):
    """Applying an allocation would exceed a GPU's memory, cores or split count."""


class UnknownPolicyError(VgpuError):
    """A placement policy name is not in the registry."""
