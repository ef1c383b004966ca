"""The reflectors' list: read in pages, each object slimmed to what the extender reads, the same state rebuilt."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from scheduler_extender.kube import Reflector
from scheduler_extender.service import ExtenderService
from scheduler_extender.slim import slim_node, slim_pod
from vgpu import annotations as ann
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice
from vgpu.state import ClusterState

DEMO_CLUSTER = Path(__file__).resolve().parents[2] / "vgpu_cli" / "data" / "demo-cluster.yaml"


def _node(name: str) -> dict[str, Any]:
    gpus = [GpuDevice(uuid=f"{name}-g{i}", index=i, model="H100", memory_mib=81920, split_count=10) for i in range(2)]
    return {
        "metadata": {
            "name": name,
            "labels": {"zone": "a"},
            "annotations": {ann.NODE_INVENTORY: ann.encode_inventory(gpus)},
            "managedFields": [{"manager": "kubelet"}],
        },
        "status": {"images": [{"names": ["x" * 100]}] * 50, "conditions": [{"type": "Ready"}]},
    }


def _pod(i: int, *, nominated: str = "") -> dict[str, Any]:
    node = f"n{i % 2}"
    a = Assignment(
        node=node, containers=(ContainerAssignment("c", (DeviceSlice(f"{node}-g{i % 2}", i % 2, 8192, 10),)),)
    )
    status: dict[str, Any] = {"phase": "Running", "conditions": [{"type": "Ready"}], "podIP": "10.0.0.1"}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {
        "metadata": {
            "name": f"p{i}",
            "namespace": "ns",
            "uid": f"u{i}",
            "creationTimestamp": f"2026-01-01T00:00:{i:02d}Z",
            "labels": {"llm-d.ai/role": "decode"},
            "annotations": {ann.POD_ASSIGNMENT: ann.encode_assignment(a), ann.POD_BIND_PHASE: "allocated"},
            "managedFields": [{"manager": "kube-scheduler", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": "" if nominated else node,
            "containers": [
                {
                    "name": "c",
                    "args": ["--model", "m"],
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}},
                }
            ],
        },
        "status": status,
    }


class Pages:
    """list_pod_for_all_namespaces as the apiserver pages it: `limit` objects, then a `continue` token."""

    def __init__(self, items: list[dict[str, Any]], *, expire_after: int = -1) -> None:
        self.items = items
        self.calls: list[dict[str, Any]] = []
        self.expire_after = expire_after  # the continue token of this page has expired (410)

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        start = int(kwargs.get("_continue") or 0)
        if self.expire_after >= 0 and len(self.calls) > self.expire_after + 1:
            raise ApiException(status=410, reason="Expired: the continue token is too old")
        limit = kwargs.get("limit") or len(self.items)
        end = min(start + limit, len(self.items))
        meta: dict[str, Any] = {"resourceVersion": "42"}
        if end < len(self.items):
            meta["continue"] = str(end)
        return SimpleNamespace(data=orjson.dumps({"metadata": meta, "items": self.items[start:end]}))


def test_a_list_is_read_page_by_page_and_each_object_slimmed() -> None:
    pods = [_pod(i) for i in range(7)]
    pages = Pages(pods)
    got: list[list[dict[str, Any]]] = []
    r = Reflector(
        name="pods", list_call=pages, replace=got.append, handle=lambda k, o: None, page_size=3, slim=slim_pod
    )
    assert r._list() == "42"
    assert [c.get("limit") for c in pages.calls] == [3, 3, 3]
    assert [c.get("_continue") for c in pages.calls] == [None, "3", "6"]
    assert [p["metadata"]["name"] for p in got[0]] == [f"p{i}" for i in range(7)]
    assert all("managedFields" not in p["metadata"] for p in got[0])
    assert got[0][0]["status"] == {"phase": "Running"}
    assert got[0][0]["spec"] == pods[0]["spec"]


def test_an_expired_continue_token_fails_the_list_so_it_starts_over() -> None:
    got: list[list[dict[str, Any]]] = []
    r = Reflector(
        name="pods", list_call=Pages([_pod(i) for i in range(7)], expire_after=1), replace=got.append,
        handle=lambda k, o: None, page_size=3,
    )  # fmt: skip
    with pytest.raises(ApiException):
        r._list()
    assert got == []  # nothing half-listed was applied


def test_a_node_keeps_name_labels_and_annotations_only() -> None:
    n = _node("n0")
    assert slim_node(n) == {
        "metadata": {"name": "n0", "labels": {"zone": "a"}, "annotations": n["metadata"]["annotations"]}
    }


def test_slimmed_objects_rebuild_the_same_state_and_books() -> None:
    """What a restart builds from slimmed pods and nodes equals what it built from the whole objects."""
    nodes = [_node("n0"), _node("n1")]
    pods = [_pod(i) for i in range(6)] + [_pod(6, nominated="n1")]

    def rebuilt(slim: bool) -> ExtenderService:
        svc = ExtenderService(ClusterState(PlacementConfig()), binder=None)  # type: ignore[arg-type]
        ns, ps = copy.deepcopy(nodes), copy.deepcopy(pods)
        svc.replace_nodes([slim_node(n) for n in ns] if slim else ns)
        svc.replace_pods([slim_pod(p) for p in ps] if slim else ps, seed_learning=True)
        return svc

    whole, slim = rebuilt(False), rebuilt(True)
    assert (
        slim.state.assignments == whole.state.assignments and len(whole.state.assignments) == 7
    )  # p6: unbound, in its grace
    assert slim.state.nodes.keys() == whole.state.nodes.keys()
    assert slim.books.pods == whole.books.pods
    assert slim.books.nominated.keys() == whole.books.nominated.keys() == {"ns/p6"}
    assert slim.learning.learned == whole.learning.learned == 7


def test_the_collector_is_paused_while_lists_run_and_resumes_after_the_last() -> None:
    import gc

    from scheduler_extender.gcpause import paused_gc

    assert gc.isenabled()
    seen: list[bool] = []
    r = Reflector(
        name="pods", list_call=Pages([_pod(i) for i in range(3)]), replace=lambda items: seen.append(gc.isenabled()),
        handle=lambda k, o: None,
    )  # fmt: skip
    with paused_gc():  # another reflector's list overlapping this one
        r._list()
        assert seen == [False] and not gc.isenabled()  # the other list still runs
    assert gc.isenabled()
    with pytest.raises(ApiException):  # a failing list resumes the collector too
        Reflector(
            name="p", list_call=Pages([_pod(i) for i in range(7)], expire_after=0), replace=seen.append,
            handle=lambda k, o: None, page_size=3,
        )._list()  # fmt: skip
    assert gc.isenabled()


def test_in_the_extenders_process_what_the_lists_built_is_frozen_once_the_last_is_done() -> None:
    """Later full collections then skip the state (scheduler_extender.gcpause); off by default, as in this test
    runner's process, where the first test above freezes nothing."""
    import gc

    from scheduler_extender import gcpause
    from scheduler_extender.gcpause import paused_gc

    gc.unfreeze()
    built: list[dict[str, object]] = []
    try:
        with paused_gc():
            built.extend({"n": i} for i in range(1000))
        assert gc.get_freeze_count() == 0  # off: nothing frozen
        gcpause.freeze_after_lists()
        with paused_gc():
            with paused_gc():  # an overlapping list
                built.extend({"n": i} for i in range(1000))
            assert gc.get_freeze_count() == 0  # the outer list still runs
        assert gc.get_freeze_count() >= len(built) and gc.isenabled()
    finally:
        gcpause.freeze_after_lists(False)
        gc.unfreeze()


def test_the_file_sources_cluster_is_frozen_like_the_lists_in_the_extenders_process() -> None:
    """The file source (benchmarks/extender_latency.py serves through it) loads its cluster as a list: frozen after,
    so a full collection does not walk 5,000 nodes' state inside a measured call."""
    import gc

    from scheduler_extender import gcpause
    from scheduler_extender import main as ext_main
    from scheduler_extender.settings import SCHEMA

    settings = SCHEMA.load(["--source", "file", "--cluster-file", str(DEMO_CLUSTER)], {}, lambda p: Path(p).read_text())
    gc.unfreeze()
    try:
        ext_main.build_service(settings)
        assert gc.get_freeze_count() == 0  # off, as in this test runner's process
        gcpause.freeze_after_lists()
        service, _, _ = ext_main.build_service(settings)
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        assert len(service.state.nodes) == 4
    finally:
        gcpause.freeze_after_lists(False)
        gc.unfreeze()
