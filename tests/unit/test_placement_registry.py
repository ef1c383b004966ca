"""The policy registry: every policy by name, clear errors for unknown names."""

from __future__ import annotations

import pytest

from tests.conftest import make_info, make_node
from vgpu.errors import UnknownPolicyError
from vgpu.fit import NodePlacement
from vgpu.placement import registry
from vgpu.placement.binpack import Binpack
from vgpu.placement.spread import Spread
from vgpu.pod import PodInfo
from vgpu.state import NodeState


@pytest.mark.parametrize("name", ["binpack", "spread", "default"])
def test_builtin_policies_are_registered(name: str) -> None:
    assert name in registry.names()
    policy = registry.create(name)
    assert policy.epoch >= 0
    assert registry.create(name) is not policy  # fresh state per caller


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        registry.create("tetris")
    assert "'tetris'" in str(info.value)
    for name in registry.names():
        assert name in str(info.value)


def test_register_adds_a_policy() -> None:
    class Worst(Spread):
        name = "test-worst"

    registry.register("test-worst", Worst)
    try:
        assert "test-worst" in registry.names() and registry.create("test-worst").name == "test-worst"
    finally:
        registry._FACTORIES.pop("test-worst", None)


@pytest.mark.parametrize("policy", [Binpack(), Spread()])
def test_scores_stay_in_unit_range(policy: Binpack | Spread) -> None:
    node = NodeState.of(make_node("n", 2))
    pod: PodInfo = make_info()
    empty = NodePlacement("n", ())
    assert 0.0 <= policy.score(node, empty, pod) <= 1.0
    policy.observe(pod)


def test_production_names_leave_the_experiments_out() -> None:
    prod = registry.production_names()
    assert "default" in prod and "binpack" in prod
    assert registry.EXPERIMENTAL and not registry.EXPERIMENTAL & set(prod)
    assert set(prod) | registry.EXPERIMENTAL == set(registry.names())


@pytest.mark.parametrize("name", sorted(registry.EXPERIMENTAL))
def test_production_check_refuses_experiments_naming_the_allowed(name: str) -> None:
    with pytest.raises(UnknownPolicyError) as info:
        registry.check_production(name)
    msg = str(info.value)
    assert f"{name!r} is a benchmark experiment" in msg
    allowed = msg.split("allowed: ", 1)[1].split(", ")
    assert allowed == registry.production_names()


def test_production_check_refuses_unknown_names_and_passes_production_ones() -> None:
    with pytest.raises(UnknownPolicyError, match=r"unknown placement policy 'tetris'; allowed: bestfit, binpack"):
        registry.check_production("tetris")
    for name in registry.production_names():
        assert registry.check_production(name) == name


@pytest.mark.parametrize("name", sorted(registry.EXPERIMENTAL))
def test_benchmarks_still_resolve_experiments(name: str) -> None:
    # The replay engine (and `vgpu replay --policy`) resolve through names()/create(), which keep every policy.
    from vgpu.replay.engine import replay
    from vgpu.replay.trace import NodeRow, PodRow

    assert name in registry.names()
    pods = [PodRow("a", 1000, 1024, 1, 500), PodRow("b", 1000, 1024, 1, 1000)]
    run = replay([NodeRow("n0", 64_000, 262_144, 2, "G2")], pods, name, 42)
    assert run.policy == name and run.arrived[-1] > 2000  # arrivals go on until the two GPUs are full
