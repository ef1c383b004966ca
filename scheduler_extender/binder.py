"""What /bind needs from the outside world, as a Protocol with a Kubernetes and a file implementation."""

from __future__ import annotations

from typing import Any, Protocol

from vgpu.annotations import Assignment


class Binder(Protocol):
    """Writes a pod's assignment and binds it. Implementations raise on failure, with context."""

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    def known(self, *, namespace: str, name: str, pod: dict[str, Any]) -> None:
        """The pod as the watch delivered it stands in for a get_pod: later writes are conditional on its version."""
        ...

    def write_assignment(self, *, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        """Record the assignment (phase allocating) where the device plugin and a restarted extender read it."""
        ...

    def bind(self, *, namespace: str, name: str, uid: str, node: str) -> None: ...

    def fence(self, *, namespace: str, name: str, uid: str) -> bool:
        """After a Binding whose outcome is unknown: True once it can no longer land (a write conditional on the
        version it was sent on succeeded, or the pod reads changed, recreated or gone); False when it landed (the pod
        reads bound). Raises when the apiserver cannot tell (it is down: ask again later)."""
        ...

    def mark_failed(self, *, namespace: str, name: str, uid: str, reason: str) -> None:
        """Best effort: mark a written assignment as failed so nobody serves it."""
        ...
