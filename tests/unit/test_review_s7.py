"""Review of this stop's fit_node memo: `vgpu.fit._JUDGED` stays small in a long-running extender.

The memo is process-wide and keyed by GPU state id; churn makes new states (and ids) all the time while the old ones
stay in their table until it is full. A cluster's live states are few, so what bounds the memo is how many tables and
how many states per table it keeps: these tests drive `fit_node` past both limits and check each holds, then work out
the worst case from the bytes a filled table really takes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import make_container, make_pod
from vgpu import fit
from vgpu.annotations import Assignment, ContainerAssignment, DeviceSlice
from vgpu.config import PlacementConfig
from vgpu.devices import GpuDevice, NodeInventory
from vgpu.fit import FitFailure, NodePlacement, fit_node
from vgpu.placement.gpushare import rank_best_fit
from vgpu.pod import PodInfo, pod_info
from vgpu.state import ClusterState

GPUS = 8
# What the memo may take at most next to the extender's RSS target (<= 1 GiB at 5,000 nodes x 8 GPUs, 40k pods).
BUDGET = 64 << 20


@pytest.fixture(autouse=True)
def _fresh_memo() -> Iterator[None]:
    fit._JUDGED.clear()
    yield
    fit._JUDGED.clear()


def _slots() -> int:
    # The per-table cap (the shared `_SLOTS_LIMIT`, 65,536, before the memo had its own).
    return int(getattr(fit, "_JUDGED_SLOTS", fit._SLOTS_LIMIT))


def _cluster() -> tuple[ClusterState, str]:
    state = ClusterState(PlacementConfig(node_policy="default"))
    gpus = tuple(
        GpuDevice(uuid=f"n0-g{i}", index=i, model="H100", memory_mib=81920, split_count=10) for i in range(GPUS)
    )
    state.upsert_node(NodeInventory(name="n0", gpus=gpus))
    return state, "n0"


def _pod(name: str, **limits: Any) -> PodInfo:
    return pod_info(make_pod(name, [make_container("main", **limits)]))


def _churn(state: ClusterState, node: str, i: int) -> None:
    """A pod of a size never seen before on GPU 0: a new GPU state (and state id) there."""
    devs = (DeviceSlice(uuid="n0-g0", index=0, memory_mib=100 + i, cores=1),)
    state.apply(f"bg/{i}", Assignment(node=node, containers=(ContainerAssignment("main", devs),)))


def _fresh_answer(state: ClusterState, node: str, pod: PodInfo, config: PlacementConfig) -> NodePlacement | FitFailure:
    saved = dict(fit._JUDGED)
    fit._JUDGED.clear()
    try:
        return fit_node(state.nodes[node], pod, config, rank_best_fit)
    finally:
        fit._JUDGED.clear()
        fit._JUDGED.update(saved)


def _table_bytes(table: dict[int, Any]) -> int:
    """The bytes a table holds of its own: the dict, each verdict tuple and the ints not shared with anything else
    (state ids; a slice's memory, worked out per GPU for a share of memory). Small ints and reason strings are shared."""
    total = sys.getsizeof(table)
    for k, v in table.items():
        total += sys.getsizeof(k) + sys.getsizeof(v)
        total += sum(sys.getsizeof(x) for x in v if isinstance(x, int) and not -5 <= x <= 256)
    return total


def test_one_shape_under_churn_keeps_at_most_the_cap_of_states() -> None:
    """Every round leaves a new state on GPU 0; the shape's table is emptied at its cap instead of keeping them all."""
    state, node = _cluster()
    config = state.config
    pod = _pod("p", gpu=2, gpumem_percentage=30)
    cap = min(_slots(), 1 << 11)
    rounds = cap * 3 // 2 + 50
    biggest = 0
    for i in range(rounds):
        _churn(state, node, i)
        got = fit_node(state.nodes[node], pod, config, rank_best_fit)
        assert isinstance(got, NodePlacement)
        if i % 97 == 0:  # the memo never changes an answer, filled or just emptied
            assert got == _fresh_answer(state, node, pod, config)
        state.release(f"bg/{i}")
        (table,) = (t for _, t in fit._JUDGED.values())
        biggest = max(biggest, len(table))
    assert biggest > 100  # the memo was in use
    assert biggest <= cap + GPUS, f"one shape's table held {biggest} GPU states after {rounds} rounds of churn"


def test_many_shapes_keep_at_most_the_limit_of_tables() -> None:
    state, node = _cluster()
    config = state.config
    most = 0
    for k in range(fit._JUDGED_LIMIT + 40):
        pod = _pod(f"p{k}", gpu=2, gpumem=1000 + k)
        assert isinstance(fit_node(state.nodes[node], pod, config, rank_best_fit), NodePlacement)
        most = max(most, len(fit._JUDGED))
    assert most == fit._JUDGED_LIMIT


def test_worst_case_memo_fits_the_rss_budget() -> None:
    """Every table full: the bytes of a really filled table per state, times the most states the limits allow."""
    state, node = _cluster()
    config = state.config
    pod = _pod("p", gpu=2, gpumem_percentage=30)
    n = min(_slots(), 1 << 10) - GPUS
    for i in range(n):
        _churn(state, node, i)
        fit_node(state.nodes[node], pod, config, rank_best_fit)
        state.release(f"bg/{i}")
    (table,) = (t for _, t in fit._JUDGED.values())
    assert len(table) > n // 2
    per_state = _table_bytes(table) / len(table)
    worst = per_state * fit._JUDGED_LIMIT * (_slots() + GPUS)
    assert worst <= BUDGET, f"{per_state:.0f} B a state: up to {worst / 2**20:.0f} MiB in the memo"
