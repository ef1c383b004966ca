"""State from a cluster file, for demos, tests and benchmarks.

Binds are recorded in memory and, with `persist`, written back to the file atomically (write to a
temporary file, fsync, rename), so allocations survive a restart of the extender in file mode too.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml

from vgpu.annotations import Assignment
from vgpu.clusterfile import dump_cluster, parse_cluster
from vgpu.devices import NodeInventory
from vgpu.state import ClusterState


def load_cluster_file(path: Path, state: ClusterState) -> list[NodeInventory]:
    """Fill `state` from the file; raises ClusterFileError/CapacityError with the problem named."""
    with path.open("rb") as fh:
        if path.suffix == ".json":
            doc = json.load(fh)
        else:
            doc = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    nodes, allocations = parse_cluster(doc)
    for inv in nodes:
        state.upsert_node(inv)
    for key, assignment in allocations:
        state.apply(key, assignment)
    return nodes


class FileBinder:
    """Binder over an in-memory pod registry (pods seen by filter), optionally persisting to the file."""

    def __init__(
        self,
        state: ClusterState,
        nodes: list[NodeInventory],
        *,
        state_lock: threading.RLock,
        persist_to: Path | None = None,
    ) -> None:
        self.state = state
        self.state_lock = state_lock
        self.nodes = nodes
        self.persist_to = persist_to
        self.bound: dict[str, str] = {}
        self._io = threading.Lock()

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # no apiserver: the service takes the pod /filter last saw (ServiceOptions.pods_from_filter)

    def bind(
        self, *, namespace: str, name: str, uid: str, version: str, node: str, assignment: Assignment | None
    ) -> None:
        self.bound[f"{namespace}/{name}"] = node  # the state already holds the assignment; persisted here
        self._persist()

    def fence(self, *, namespace: str, name: str, uid: str, version: str) -> bool:
        return f"{namespace}/{name}" not in self.bound  # no apiserver: nothing is in flight

    def _persist(self) -> None:
        if self.persist_to is None:
            return
        with self.state_lock:
            allocations = sorted(self.state.assignments.items())
        doc = dump_cluster(self.nodes, allocations)
        with self._io:
            target = self.persist_to
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    if target.suffix == ".json":
                        json.dump(doc, fh)
                    else:
                        yaml.dump(doc, fh, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
