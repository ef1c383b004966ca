"""Review of the first-evaluation speed-ups of the fragmentation model (`vgpu.placement.frag`): a memoised answer is
the plain computation's for the same node, also when two card types share a GPU model and memory size but not their
SM capacity (`GpuDevice.cores`, e.g. a clusterfile template with `cores: 50`): a task's share of such a card
(`slice_milli`) reads the card's cores, so every table the model keeps must tell the two cards apart."""

from __future__ import annotations

import pytest

from vgpu.devices import GpuDevice, NodeInventory
from vgpu.placement import frag
from vgpu.placement.frag import FragModel, TaskShape
from vgpu.state import NodeState

_PLENTY = 1 << 40


def _node(name: str, cores: int) -> NodeState:
    gpus = tuple(GpuDevice(uuid=f"{name}-g{i}", index=i, model="H100", memory_mib=81920, cores=cores) for i in range(2))
    return NodeState.of(NodeInventory(name=name, gpus=gpus))


def _workload() -> list[tuple[TaskShape, float]]:
    # One slice of 4000 MiB and 30 % of the SMs: 300 milli of a 100-core card, 600 milli of a 50-core one.
    return [(TaskShape(0, 0, 1, (4000, None, 30), None), 1.0)]


def _same(a: float, b: float) -> bool:
    return a == b and repr(a) == repr(b)


def test_frag_tells_cards_of_other_sm_capacity_apart() -> None:
    full, half = _node("full", 100), _node("half", 50)
    frees = (500, 1000)  # the task needs 600 milli on `half`: the 500 free there is fragmented for it
    alone = FragModel(_workload()).frag(half, frees, _PLENTY, _PLENTY)
    assert alone == 500.0
    model = FragModel(_workload())
    model.frag(full, frees, _PLENTY, _PLENTY)  # a 100-core card of the same model and size first
    assert _same(model.frag(half, frees, _PLENTY, _PLENTY), alone)


def test_growth_tells_cards_of_other_sm_capacity_apart() -> None:
    full, half = _node("full", 100), _node("half", 50)
    sig, host = (500, 1000), (_PLENTY, _PLENTY, _PLENTY, _PLENTY)
    alone = FragModel(_workload()).growth(half, sig, 1000, 600, host)
    assert alone == 400.0  # (500, 1000) -> (400, 500): both under the 600 the task needs on `half`
    model = FragModel(_workload())
    model.growth(full, sig, 1000, 600, host)
    assert _same(model.growth(half, sig, 1000, 600, host), alone)
    assert _same(model.growths(half, sig, host).of(half, 1000, 600), alone)


def test_growth_tables_stay_bounded_by_their_entries_over_all_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table count alone bounded 50,000 tables of up to 256 entries (~1.5 GiB); the entries are capped too, and
    an answer after a clear is the plain computation's."""
    monkeypatch.setattr(frag, "_ENTRIES_LIMIT", 50)
    model = FragModel(_workload())
    node = _node("full", 100)
    plain = FragModel(_workload())
    for cpu in range(40):  # a host room per table, as churn makes them
        host = (_PLENTY - cpu, _PLENTY, _PLENTY - cpu - 1, _PLENTY)
        for free in (500, 1000):
            got = model.growth(node, (500, 1000), free, 300, host)
            assert _same(got, plain.growth(node, (500, 1000), free, 300, host))
        held = sum(len(t.by) for t in model._growth.values())
        assert held <= 51 and model.growth_entries <= 51
