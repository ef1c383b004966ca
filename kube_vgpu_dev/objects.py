"""Talking to the cluster as its admin: API clients, kubectl, and the Node and Pod helpers the tests share.

Without a kubelet, a Node is an object whose status the harness writes, and a bound pod stays bound until it
is deleted with grace period 0.
"""

from __future__ import annotations

import contextlib
import datetime
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client, config

from kube_vgpu_dev.components import KWOK_NODE_ANNOTATION

DEFAULT_NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110"}


class ClusterObjects:
    """The admin's view of a running cluster; ``ControlPlane`` sets ``admin_kubeconfig`` and ``bin_dir``."""

    admin_kubeconfig: Path
    bin_dir: Path

    def __init__(self) -> None:
        self._clients: list[Any] = []
        self._admin: Any = None

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` authenticated as cluster admin (closed on stop)."""
        api = config.new_client_from_config(config_file=str(self.admin_kubeconfig))
        self._clients.append(api)
        return api

    def close_clients(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):  # a client of a stopped apiserver may fail to close
                c.close()
        self._clients.clear()
        self._admin = None

    def _core(self) -> Any:
        """A CoreV1Api on one shared admin client, for the helpers below."""
        if self._admin is None:
            self._admin = self.api_client()
        return client.CoreV1Api(self._admin)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster as admin; returns the CompletedProcess (text)."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            input=input,
        )

    def env(self) -> dict[str, str]:
        """Environment for child processes that should talk to this cluster (KUBECONFIG)."""
        return {"KUBECONFIG": str(self.admin_kubeconfig)}

    def add_node(
        self,
        name: str,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        kwok: bool = False,
    ) -> Any:
        """Create Node *name* and write status.capacity/allocatable (= capacity unless given) and Ready=True
        through ``/status``. ``pods: 110`` is added when capacity has no ``pods``; capacity None means
        ``DEFAULT_NODE_CAPACITY``. ``kwok=True`` adds ``KWOK_NODE_ANNOTATION`` so that the controller of
        ``start_kwok`` runs this node's pods. Returns the V1Node after the status patch."""
        cap = dict(DEFAULT_NODE_CAPACITY if capacity is None else capacity)
        cap.setdefault("pods", "110")
        alloc = dict(allocatable) if allocatable is not None else dict(cap)
        alloc.setdefault("pods", cap["pods"])
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {**(KWOK_NODE_ANNOTATION if kwok else {}), **(annotations or {})},
            },
            "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        }
        self._core().create_node(body)
        return self.set_node_status(name, cap, alloc)

    def set_node_status(
        self, name: str, capacity: Mapping[str, str], allocatable: Mapping[str, str] | None = None, ready: bool = True
    ) -> Any:
        """Patch status.capacity/allocatable and the Ready condition of an existing node via ``/status``."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            "capacity": dict(capacity),
            "allocatable": dict(allocatable if allocatable is not None else capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeVgpuE2E",
                    "message": "simulated node",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
        }
        return self._core().patch_node_status(name, {"status": status})

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete a pod at once (grace period 0): without a kubelet a bound pod never finishes graceful deletion."""
        self._core().delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def wait_for_pod(
        self,
        name: str,
        namespace: str = "default",
        timeout: float = 90.0,
        condition: Callable[[Any], bool] | None = None,
    ) -> Any:
        """Poll pod *name* until ``condition(pod)`` (default: ``spec.nodeName`` set) holds; return the pod.
        Raises TimeoutError with the pod's events otherwise. 90 s by default: a pod created just after its nodes may
        meet a kube-scheduler that has not seen their status yet, and then waits for a requeue and its backoff; it
        returns as soon as the condition holds."""
        api = self._core()
        cond = condition or (lambda p: bool(p.spec.node_name))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = api.read_namespaced_pod(name, namespace)
            if cond(pod):
                return pod
            time.sleep(0.2)
        events = [e.message for e in self.pod_events(name, namespace)]
        raise TimeoutError(f"pod {namespace}/{name} did not reach the condition in {timeout}s; events: {events}")

    def pod_events(self, name: str, namespace: str = "default") -> list[Any]:
        """Core/v1 Events whose involvedObject is pod *name*, oldest first."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={name}"
        evs = self._core().list_namespaced_event(namespace, field_selector=selector).items
        return sorted(evs, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
