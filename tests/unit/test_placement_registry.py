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
