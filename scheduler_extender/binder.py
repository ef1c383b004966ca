"""What /bind needs from the outside world, as a Protocol with a Kubernetes and a file implementation."""

from __future__ import annotations

from typing import Any, Protocol

from vgpu.annotations import Assignment


class Binder(Protocol):
    """Reads a pod and binds it with its assignment in one write. Implementations raise on failure, with context:
    an answer the apiserver refused carries its HTTP `status` (nothing was applied), a call that got no answer none."""

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    def bind(
        self, *, namespace: str, name: str, uid: str, version: str, node: str, assignment: Assignment | None
    ) -> None:
        """Bind the pod to `node` only while it still has `uid` and resourceVersion `version` (preconditions the
        apiserver checks; "" checks none), writing `assignment` (phase allocating, bind time) onto the pod in the
        same update, where the device plugin and a restarted extender read it."""
        ...

    def fence(self, *, namespace: str, name: str, uid: str, version: str) -> bool:
        """After a Binding sent on `version` whose outcome is unknown: True once it can no longer land (a write
        conditional on `version` succeeded, or the pod reads changed, recreated or gone); False when it landed (the
        pod reads bound). Raises when the apiserver cannot tell (it is down: ask again later)."""
        ...
