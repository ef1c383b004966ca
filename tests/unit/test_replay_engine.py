from __future__ import annotations

import random

import pytest

from vgpu.planner import Evaluation, NodeResult
from vgpu.replay.engine import MODES, choose, replay
from vgpu.replay.metric import unallocated_curve
from vgpu.replay.trace import NodeRow, PodRow, parse_pods, to_request

NODE = NodeRow("n0", 64_000, 262_144, 2, "G2")


@pytest.mark.parametrize("mode", MODES)
def test_tiny_trace_by_hand(mode: str) -> None:
    # 2 GPUs, whole-GPU pods: inflation to 130 % of 2000 milli adds one pod; the third arrival fails.
    pods = [PodRow("a", 1000, 1024, 1, 1000), PodRow("b", 1000, 1024, 1, 1000)]
    run = replay([NODE], pods, "bestfit", 42, mode=mode)  # type: ignore[arg-type]
    assert run.arrived == [1000, 2000, 3000]
    assert run.allocated == [1000, 2000, 2000]
    assert run.failed == 1
    assert unallocated_curve(run.arrived, run.allocated, run.capacity_milli) == {50: 50.0, 100: 0.0}


def test_host_cpu_is_a_fit_check() -> None:
    pods = [PodRow("a", 60_000, 1024, 1, 500), PodRow("b", 60_000, 1024, 1, 500)]
    run = replay([NODE], pods, "fgd", 42, pods_limit=2)
    assert run.allocated == [500, 500]
    assert run.failed == 1


def test_pods_limit_and_cpu_only_nodes_ignored() -> None:
    pods = [PodRow("a", 1000, 1024, 1, 300)]
    run = replay([NODE, NodeRow("cpu", 1000, 1000, 0, "")], pods, "default", 42, pods_limit=3)
    assert run.capacity_milli == 2000
    assert run.pods == 3


def test_choose_modes() -> None:
    ev = Evaluation(feasible={n: NodeResult(None, score=s) for n, s in {"a": 0.0, "b": 0.96, "c": 1.0}.items()})
    rank = {"a": 0, "b": 1, "c": 2}
    assert choose(ev, "best", rank, random.Random(0)) == "c"
    # min-max buckets: b and c share the top bucket (10); the narrow filter re-buckets them and keeps only c.
    assert {choose(ev, "prioritize-minmax", rank, random.Random(s)) for s in range(20)} == {"b", "c"}
    assert {choose(ev, "narrow-minmax", rank, random.Random(s)) for s in range(20)} == {"c"}
    # rank priorities: only the best node gets 10.
    assert {choose(ev, "prioritize", rank, random.Random(s)) for s in range(20)} == {"c"}
    assert {choose(ev, "narrow", rank, random.Random(s)) for s in range(20)} == {"c"}
    assert choose(Evaluation(), "best", rank, random.Random(0)) is None


@pytest.mark.parametrize(
    ("milli", "pct", "mem"),
    [(460, 46, None), (1000, 100, None), (455, None, 45_500)],
)
def test_request_mapping_is_exact(milli: int, pct: int | None, mem: int | None) -> None:
    (req,) = to_request(PodRow("p", 0, 0, 1, milli)).containers
    assert (req.memory_percentage, req.memory_mib) == (pct, mem)
    assert req.cores == min(100, milli // 10)


def test_parse_pods_optional_gpu_spec() -> None:
    rows = [
        {
            "name": "x",
            "cpu_milli": "1000",
            "memory_mib": "10",
            "num_gpu": "1",
            "gpu_milli": "50",
            "gpu_spec": "T4|P100",
        },
        {"name": "y", "cpu_milli": "1000", "memory_mib": "10", "num_gpu": "8", "gpu_milli": "1000"},
    ]
    x, y = parse_pods(rows)
    assert x.gpu_spec == frozenset({"T4", "P100"}) and x.gpu_demand_milli == 50
    assert y.gpu_spec is None and y.gpu_demand_milli == 8000
