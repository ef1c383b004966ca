"""The llm-d workload generator: deterministic, role-labelled pods, consistent creates and deletes."""

from __future__ import annotations

import pytest

from vgpu.perf.workload import RACK_LABEL, TEMPLATES, Checkpoint, Create, Delete, cluster, generate
from vgpu.pod import pod_info
from vgpu.roles import Role


def test_same_seed_same_workload_and_different_seeds_differ() -> None:
    a, b, c = generate(1), generate(1), generate(2)
    assert a.events == b.events
    assert a.events != c.events


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_every_delete_names_a_live_pod_and_checkpoints_match_live_replicas(seed: int) -> None:
    live: set[str] = set()
    for ev in generate(seed).events:
        if isinstance(ev, Create):
            meta = ev.pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            assert key not in live
            live.add(key)
        elif isinstance(ev, Delete):
            assert ev.key in live
            live.remove(ev.key)
        elif isinstance(ev, Checkpoint):
            want = sum(d.prefill + d.decode for d in ev.deployments)
            assert want == len(live)


def test_pods_carry_llm_d_roles_models_and_the_template_shape() -> None:
    for ev in generate(3).events:
        if not isinstance(ev, Create):
            continue
        info = pod_info(ev.pod)
        assert info.role in (Role.PREFILL, Role.DECODE)
        assert info.model is not None and info.model.startswith(info.namespace + "/")
        name = info.model.split("/", 1)[1].rsplit("-", 1)[0]
        t = TEMPLATES[name]
        shape = t.prefill if info.role is Role.PREFILL else t.decode
        (c,) = info.request.containers
        assert (c.count, c.memory_mib, c.cores) == (shape.count, shape.memory_mib, shape.cores)


def test_cluster_has_nvlink_nodes_in_racks() -> None:
    nodes = cluster(nodes=8, gpus_per_node=8, nodes_per_rack=4)
    assert {n.labels[RACK_LABEL] for n in nodes} == {"rack-0", "rack-1"}
    g = nodes[0].gpus[0]
    assert len(g.nvlink_peers) == 7 and g.uuid not in g.nvlink_peers
