"""--filter-answers-one with the real kube-scheduler: /filter answers one node, kube-scheduler binds it through the
extender without scoring, and /prioritize is never called (kubernetes v1.34.4 pkg/scheduler/schedule_one.go,
schedulePod: "When only one node after predicate, just use it"). The extender's own verb counters on /metrics say
which verbs it answered."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.e2e.controlplane import ControlPlane
from tests.e2e.test_extender_e2e import _check_invariants, _pod, _slice, _wait_settled
from tests.e2e.vgpu_stack import Extender, gpu_nodes, scheduler_config


@pytest.fixture(scope="module")
def one_node(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Extender]]:
    ext = Extender(control_plane, name="vgpu-extender-one", args=("--filter-answers-one",))
    ext.start()
    control_plane.start_scheduler(scheduler_config(control_plane, ext))
    try:
        yield control_plane, ext
    finally:
        control_plane.stop_scheduler()
        if ext.proc is not None:
            control_plane.stop_process(ext.proc)


def _verb_calls(ext: Extender) -> dict[str, float]:
    """Calls the extender answered, by verb (its request latency histogram's counts)."""
    text = ext.probe("/metrics").decode()
    pattern = r'^vgpu_extender_request_duration_seconds_count\{verb="(\w+)"\} (\S+)$'
    return {verb: float(n) for verb, n in re.findall(pattern, text, re.M)}


@pytest.mark.timeout(600)
def test_pods_are_bound_and_prioritize_is_never_called(one_node: tuple[ControlPlane, Extender], namespace: str) -> None:
    cp, ext = one_node
    core = client.CoreV1Api(cp.api_client())
    selector = gpu_nodes(cp, "onenode", 3, 2)
    before = _verb_calls(ext)
    whole = {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "100"}
    names = ["whole-0", "whole-1"]  # created together: each takes a node's both GPUs, so they share no node
    for name in names:
        core.create_namespaced_pod(namespace, _pod(name, selector, whole))
    _wait_settled(core, namespace, names, timeout=300)
    for i in range(6):  # the third node's two GPUs hold them all (four 25 % slices fit a GPU)
        names.append(f"slice-{i}")
        core.create_namespaced_pod(namespace, _pod(names[-1], selector, _slice(25, 25)))
    pods = _wait_settled(core, namespace, names, timeout=300)
    unbound = sorted(n for n, p in pods.items() if not p.spec.node_name)
    assert not unbound, f"not bound: {unbound}"
    assert pods["whole-0"].spec.node_name != pods["whole-1"].spec.node_name
    assert _check_invariants(pods, ext)["bound"] == len(names)
    after = _verb_calls(ext)
    calls = {v: after.get(v, 0.0) - before.get(v, 0.0) for v in ("filter", "prioritize", "bind")}
    assert calls["filter"] >= len(names) and calls["bind"] >= len(names), calls
    assert calls["prioritize"] == 0, calls  # one feasible node: kube-scheduler never scores
