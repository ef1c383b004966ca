"""scheduler_extender.schema: the answers' reasons made safe for kube-scheduler's FailedScheduling event."""

from __future__ import annotations

import orjson
import pytest

from scheduler_extender import schema

FULL = "container 'c' needs 1 vGPU(s) of 40000 MiB/50% cores; 0 of 1 GPUs can host one (GPU memory full on 1)"
SMALL = "container 'c' needs 1 vGPU(s) of 90000 MiB/100% cores; 0 of 1 GPUs can host one (card too small on 1)"
CASES = {
    "few-distinct": {f"n{i:04d}": (FULL, SMALL, "no inventory")[i % 3] for i in range(3000)},
    "all-distinct": {f"n{i}": f"{i}% of x" for i in range(50)},
    "no-percent": {f"n{i}": "no inventory" for i in range(10)},
    "one": {"n0": FULL},
    "empty": {},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_answers_reasons_are_each_reason_made_event_safe_in_the_nodes_order(case: str) -> None:
    """Converting each distinct reason once must answer the same bytes as converting every node's reason."""
    reasons = CASES[case]
    answer = schema.filter_result(node_names=[], nodes=None, failed=reasons, unresolvable=reasons)
    expected = {node: why.replace("%", " percent") for node, why in reasons.items()}
    for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
        assert orjson.dumps(answer[key]) == orjson.dumps(expected)
        assert answer[key] is not reasons  # a copy: the planner may hand out its memoised evaluation's dict
