"""`ClusterState.changed_since`: the nodes changed after a version, read from the change log by offset."""

from __future__ import annotations

import random

from tests.conftest import make_assignment, make_node
from vgpu.state import ClusterState


def test_changed_since_is_every_node_changed_after_the_version_through_log_trims() -> None:
    rng = random.Random(5)
    state = ClusterState()
    state._CHANGE_LOG = 64  # type: ignore[misc]  # trims the log often
    history: list[tuple[int, str]] = []  # every change ever: (cluster version after it, node)
    names = [f"n{i}" for i in range(12)]
    for name in names:
        state.upsert_node(make_node(name, 2, split=8))
        history.append((state.version, name))
    held: list[str] = []
    for step in range(600):
        name = rng.choice(names)
        if held and rng.random() < 0.4:
            key = held.pop(rng.randrange(len(held)))
            node = state.assignments[key].node
            state.release(key)
            history.append((state.version, node))
        else:
            a = make_assignment(name, [(rng.randrange(2), 1024, 5)])
            if state.check(a) is None:
                state.apply(f"p/{step}", a)
                held.append(f"p/{step}")
                history.append((state.version, name))
        for back in (0, 1, 2, 7, 40, 63, 64, 65, 130, 200):
            version = state.version - back
            got = state.changed_since(version)
            oldest = state._changes[0][0]
            if version + 1 < oldest:
                assert got is None
            else:
                assert got == {n for v, n in history if v > version}
