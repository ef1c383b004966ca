"""The model on a placed cluster: SM oversubscription, bandwidth contention, KV locality, pairing."""

from __future__ import annotations

import pytest

from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig, RoleRules
from vgpu.perf import cluster
from vgpu.perf.params import H200, PerfParams
from vgpu.perf.workload import TEMPLATES, Deployment
from vgpu.perf.workload import cluster as make_cluster
from vgpu.roles import Role
from vgpu.state import ClusterState

P = PerfParams()
DEP = Deployment("pool", "ns", TEMPLATES["llama-8b"], decode=1, prefill=1)


def _state() -> ClusterState:
    s = ClusterState(PlacementConfig(roles=RoleRules.off()))
    for inv in make_cluster(nodes=8):
        s.upsert_node(inv)
    return s


def _put(s: ClusterState, key: str, role: Role, node: int, gpu: int, mem: int, cores: int) -> None:
    name = f"node-{node:02d}"
    d = DeviceSlice(uuid=f"GPU-{name}-{gpu}", index=gpu, memory_mib=mem, cores=cores)
    s.apply(key, Assignment(node=name, containers=(ContainerAssignment("vllm", (d,)),), role=role, model="ns/pool"))


def _goodput(s: ClusterState) -> float:
    return cluster.evaluate(s, [DEP], H200, P)[0].goodput_rps


@pytest.mark.parametrize(
    ("d_node", "d_gpu", "link"),
    [(0, 0, "same-gpu"), (0, 1, "nvlink"), (1, 0, "rack"), (4, 0, "cross-rack")],
)
def test_kv_locality_orders_goodput(d_node: int, d_gpu: int, link: str) -> None:
    s = _state()
    _put(s, "ns/p", Role.PREFILL, 0, 0, 24576, 40)
    _put(s, "ns/d", Role.DECODE, d_node, d_gpu, 40960, 29)
    assert cluster.link(s, s.assignments["ns/p"], s.assignments["ns/d"]) == link
    metrics = cluster.evaluate(s, [DEP], H200, P)[0]
    assert metrics.pair_node == (1.0 if d_node == 0 else 0.0)
    assert metrics.pair_gpu == (1.0 if link == "same-gpu" else 0.0)


def test_farther_decode_lowers_prefill_capacity() -> None:
    near, far = _state(), _state()
    for s, node in ((near, 0), (far, 4)):
        _put(s, "ns/p", Role.PREFILL, 0, 0, 24576, 40)
        _put(s, "ns/d", Role.DECODE, node, 1, 40960, 29)
    ttft_near = cluster.evaluate(near, [DEP], H200, P.with_(load_factor=5.0))[0].ttft_attainment
    ttft_far = cluster.evaluate(far, [DEP], H200, P.with_(load_factor=5.0))[0].ttft_attainment
    assert ttft_near > ttft_far


def test_best_effort_neighbour_of_a_prefill_is_sm_oversubscription() -> None:
    s = _state()
    _put(s, "ns/p", Role.PREFILL, 0, 0, 24576, 40)
    _put(s, "ns/d", Role.DECODE, 0, 0, 40960, 0)
    metrics, views = cluster.evaluate(s, [DEP], H200, P)
    assert metrics.prefill_sm_oversubscribed == 1
    assert views["GPU-node-00-0"].prefill_slowdown == P.unpartitioned_slowdown
    partitioned = _state()
    _put(partitioned, "ns/p", Role.PREFILL, 0, 0, 24576, 40)
    _put(partitioned, "ns/d", Role.DECODE, 0, 0, 40960, 29)
    assert cluster.evaluate(partitioned, [DEP], H200, P)[0].prefill_sm_oversubscribed == 0
    assert _goodput(partitioned) > _goodput(s)


@pytest.mark.parametrize(("decodes", "s_sat", "overcommitted"), [(1, 0.35, False), (2, 0.2, True), (2, 0.5, False)])
def test_bandwidth_overcommit_depends_on_s_sat(decodes: int, s_sat: float, overcommitted: bool) -> None:
    s = _state()
    for i in range(decodes):
        _put(s, f"ns/d{i}", Role.DECODE, 0, 0, 40960, 30)
    view = cluster.gpu_view(s.nodes["node-00"].gpus[0], P.with_(s_sat=s_sat))
    assert view.bw_overcommitted is overcommitted
    assert view.decode_slowdown >= 1.0


def test_nothing_placed_means_no_goodput() -> None:
    m = cluster.evaluate(_state(), [DEP], H200, P)[0]
    assert m.goodput_rps == 0.0 and m.slo_attainment == 0.0 and m.nominal_rps > 0
