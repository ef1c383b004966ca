"""The names of a /filter that have an inventory come back as the state's own string objects, in the order asked
(`ExtenderService._known_names`): a request's names are new objects, and the planner's dicts then compare them by
identity instead of by their characters. A node joining or leaving is seen at once."""

from __future__ import annotations

from scheduler_extender.service import ExtenderService
from tests.unit.test_extender_service import FakeBinder
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.state import ClusterState


def _inventory(name: str) -> NodeInventory:
    return NodeInventory(name, (GpuDevice(f"GPU-{name}-0", 0, "H100", 81920),))


def _fresh(name: str) -> str:
    """An equal string that is another object, as a request's JSON parse makes."""
    return "".join(list(name))


def test_known_names_are_the_states_own_objects_in_the_order_asked() -> None:
    state = ClusterState()
    for n in ("node-a", "node-b", "node-c"):
        state.upsert_node(_inventory(n))
    svc = ExtenderService(state, FakeBinder())
    asked = [_fresh(n) for n in ("node-c", "ghost", "node-a", "node-c")]
    assert all(a is not k for a in asked for k in state.nodes)
    known = svc._known_names("filter", asked)
    assert known == ["node-c", "node-a", "node-c"]
    keys = {k: k for k in state.nodes}
    assert all(k is keys[k] for k in known)

    state.upsert_node(_inventory("ghost"))  # it joins: the next call knows it
    again = svc._known_names("filter", [_fresh(n) for n in ("node-c", "ghost")])
    assert again == ["node-c", "ghost"] and again[1] is next(k for k in state.nodes if k == "ghost")
    state.remove_node("node-c")  # it leaves: no longer known
    assert svc._known_names("filter", [_fresh("node-c"), _fresh("node-b")]) == ["node-b"]
