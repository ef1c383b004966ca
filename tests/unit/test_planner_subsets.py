"""The memoised evaluation asked about rotating subsets of the nodes decides what the uncached full path decides.

kube-scheduler asks /filter about ~10 % of the nodes a pod (percentageOfNodesToScore), a different tenth each time,
and /prioritize about those that passed. The planner keeps one evaluation per shape over every node, leaves the nodes
that changed since out of it until a call asks about them (`_Memo.stale`), narrows it to the names asked (`_subset`)
and ranks the best ten of them without a subset evaluation (`_rank_of`). Each is checked here, through binds, releases,
node changes (a cordon, a node leaving and coming back), learning relearns and every policy family, against
`Planner.evaluate_node` on each asked node (no memo, no class, no cache) and the rank mapping over its scores.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from tests.conftest import GPU_MEM, make_assignment, make_info, make_node
from tests.unit.test_fit_fast import SHAPES, _cluster
from vgpu import planner as planner_module
from vgpu.devices import Cordon, NodeInventory
from vgpu.planner import Evaluation, Planner, Ranked, RankKeys, _rank_of, _top_of, to_priorities
from vgpu.pod import PodInfo
from vgpu.roles import Role
from vgpu.state import ClusterState


def _oracle(p: Planner, pod: PodInfo, names: list[str]) -> Evaluation:
    """The full path on every asked node, in the order asked (a name asked twice is where it came first)."""
    out = Evaluation()
    for name in dict.fromkeys(names):
        r = p.evaluate_node(name, pod)
        if r.failure is None:
            out.feasible[name] = r
            out.scores[name] = r.score
        elif r.failure.unresolvable:
            out.unresolvable[name] = r.failure.reason
        else:
            out.failed[name] = r.failure.reason
    return out


def _same(ev: Evaluation, want: Evaluation) -> None:
    """The same decisions (dict order aside: a call over every name returns the memoised evaluation itself, its
    changed nodes last, as before)."""
    assert {n: (r.placement, r.score) for n, r in ev.feasible.items()} == {
        n: (r.placement, r.score) for n, r in want.feasible.items()
    }
    assert ev.scores == want.scores
    assert ev.failed == want.failed
    assert ev.unresolvable == want.unresolvable


def _change(
    state: ClusterState, p: Planner, rng: random.Random, step: int, asked: list[str], *, new_nodes: bool = False
) -> None:
    """One cluster event: a bind (often on a node just asked about), a release, a cordon, a node leaving and back."""
    roll = rng.random()
    names = sorted(state.nodes)
    if roll < 0.55:
        pod = make_info(f"b{step}-{len(state.assignments)}-{rng.random()}", **rng.choice(SHAPES))  # type: ignore[arg-type]
        node = rng.choice(asked if asked and rng.random() < 0.7 else names)
        r = p.evaluate_node(node, pod)
        if r.placement is not None:
            state.apply(pod.key, r.placement.assignment(pod))
    elif roll < 0.75 and state.assignments:
        state.release(rng.choice(sorted(state.assignments)))
    elif roll < 0.85:
        node = state.nodes[rng.choice(names)]
        inv = node.inventory
        cordon = Cordon() if inv.cordon.uuids else Cordon(frozenset({inv.gpus[rng.randrange(len(inv.gpus))].uuid}))
        state.upsert_node(dataclasses.replace(inv, cordon=cordon))
    elif roll < 0.92 or not new_nodes:
        gone = rng.choice(names)
        inv = state.nodes[gone].inventory
        state.remove_node(gone)
        if rng.random() < 0.5:
            state.upsert_node(inv)
    else:  # a node the memoised evaluations never saw: the next call asking about it evaluates afresh
        name = f"new{step}-{rng.randrange(10**6)}"
        state.upsert_node(make_node(name, 8, split=4))
        a = make_assignment(name, [(rng.randrange(8), 20480, 25)], role=Role.DECODE, model="m")
        state.apply(f"bg/{name}", a)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "policy", ["default", "fgd", "fragaware-gpusteps", "fragaware-wg100", "random", "binpack", "bestfit"]
)
def test_rotating_subsets_decide_as_the_full_path(seed: int, policy: str) -> None:
    state = _cluster(seed, policy, nodes=40)
    p = Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    for pod in pods:
        p.evaluate(pod)  # every shape's memo covers every node, as after the learning phase
    start = 0
    for step in range(60):
        pod = rng.choice(pods)
        if step % 9 == 4:
            p.observe(pod)  # a learning policy relearns: a new epoch, evaluated again
        names = sorted(state.nodes)
        size = rng.choice([4, 7, 12, len(names)])
        asked = [names[(start + k) % len(names)] for k in range(size)]
        start = (start + size) % len(names)
        if step % 7 == 3:
            asked += asked[:2]  # a name asked twice
        ev = p.evaluate(pod, asked)
        want = _oracle(p, pod, asked)
        _same(ev, want)
        feasible = [n for n in asked if n in ev.feasible]
        passed = p.passing(pod, asked, ev)  # /filter's NodeNames, which /prioritize gets back as they are
        assert passed == feasible
        prios = to_priorities(want.scores, state.config.priority_mapping)
        if step % 3 == 1 and feasible:  # a bind between /filter and /prioritize: the list is not taken on trust
            _change(state, p, rng, step, feasible[:1])
            prios = to_priorities(_oracle(p, pod, feasible).scores, state.config.priority_mapping)
        assert p.priorities_for(pod, passed) == prios
        assert p.priorities_for(pod, list(passed)) == prios
        mixed = asked[::2]  # a set that is not what /filter passed: scaled over its feasible nodes alone
        assert p.priorities_for(pod, mixed) == to_priorities(
            _oracle(p, pod, mixed).scores, state.config.priority_mapping
        )
        for name in feasible[:3]:
            got, full = p.cached_result(name, pod), p.evaluate_node(name, pod)
            assert (got.placement, got.score) == (full.placement, full.score)
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            _change(state, p, rng, step, asked, new_nodes=step > 50)  # late: a new name makes the memo start over


@pytest.mark.parametrize("seed", range(3))
def test_a_call_over_every_node_after_subsets_is_the_evaluation_of_every_node(seed: int) -> None:
    """Nodes left stale by calls over subsets are all evaluated again when a call asks about every node: the whole
    evaluation, in the order refreshing each bind in turn gives (changed nodes last, in name order)."""
    state = _cluster(seed, "default", nodes=40)
    p = Planner(state)
    rng = random.Random(seed)
    pod = make_info("s", **SHAPES[2])  # type: ignore[arg-type]
    p.evaluate(pod)
    for step in range(12):
        _change(state, p, rng, step, [])
        p.evaluate(pod, sorted(state.nodes)[:5])
    names = list(state.nodes)
    ev = p.evaluate(pod, names)
    want = _oracle(p, pod, names)
    assert {n: (r.placement, r.score) for n, r in ev.feasible.items()} == {
        n: (r.placement, r.score) for n, r in want.feasible.items()
    }
    assert (ev.failed, ev.unresolvable) == (want.failed, want.unresolvable)
    assert p.priorities(ev) == to_priorities(want.scores)


def test_a_changed_node_not_asked_about_is_not_evaluated() -> None:
    """The point of leaving changed nodes stale: a bind on a node outside the names asked costs those calls nothing."""
    state = _cluster(0, "default", nodes=40)
    p = Planner(state)
    pod = make_info("s", **SHAPES[3])  # type: ignore[arg-type]
    p.evaluate(pod)
    names = sorted(state.nodes)
    evaluated: list[str] = []
    inner = p._evaluate

    def counting(name: str, *args: object, **kw: object) -> object:
        evaluated.append(name)
        return inner(name, *args, **kw)  # type: ignore[arg-type]

    p._evaluate = counting  # type: ignore[assignment,method-assign]
    other = make_info("o", **SHAPES[0])  # type: ignore[arg-type]
    r = p.evaluate_node(names[-1], other)
    assert r.placement is not None
    state.apply(other.key, r.placement.assignment(other))
    evaluated.clear()
    p.evaluate(pod, names[:10])
    assert evaluated == []
    p.evaluate(pod, names[-10:])
    assert evaluated == [names[-1]]


def test_the_best_ten_of_a_subset_are_those_of_its_own_evaluation() -> None:
    """`_rank_of` against `Ranked.of` over the subset's own scores: many ties at the tenth score, names asked twice
    (among the best too), names with no score, fewer than ten."""
    rng = random.Random(5)
    for _ in range(3000):
        pool = [f"n{i}" for i in range(rng.randrange(0, 40))]
        scores = {x: rng.choice([0.1, 0.2, 0.3, 0.3, 1, 2, 3]) for x in pool if rng.random() < 0.8}
        names = [rng.choice(pool) for _ in range(rng.randrange(0, 50))] if pool else []
        sub = {x: scores[x] for x in names if x in scores}
        want = Ranked.of(sub, 64).priorities() if sub else {}
        assert _rank_of(scores, names) == want, (scores, names)


def test_top_of_is_rank_of_for_feasible_names() -> None:
    """`_top_of` (one `heapq.nlargest` pass over the memo's `RankKeys`) against `_rank_of` on /filter-like answers:
    every name feasible, many ties, names asked twice among the best and elsewhere, fewer than ten."""
    rng = random.Random(6)
    for _ in range(3000):
        pool = [f"n{i}" for i in range(rng.randrange(1, 40))]
        scores = {x: rng.choice([0.1, 0.2, 0.3, 0.3, 1, 2, 3]) for x in pool}
        names = [rng.choice(pool) for _ in range(rng.randrange(0, 50))]
        assert _top_of(RankKeys(scores), names) == _rank_of(scores, names, scored=True), (scores, names)


def _check_order(p: Planner) -> None:
    """Each memo's `_Order` holds exactly its evaluation's feasible nodes, by key rising."""
    for memo in p._memo.values():
        if memo.order is not None:
            got = memo.order.rising
            assert sorted(got) == sorted(memo.evaluation.scores)
            keys = [memo.keys[n] for n in got]
            assert keys == sorted(keys)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["default", "fgd", "random", "binpack"])
def test_filter_names_answers_as_evaluate_and_passing(seed: int, policy: str) -> None:
    """/filter's planner call (`Planner.filter_names`: no subset evaluation) against `evaluate` + `passing` on the same
    state: the same NodeNames, FailedNodes in the same order, the same unresolvable nodes; and /prioritize over its
    answer (the rank order kept per memo, `_Order`, after the first) ranks as the full path, through binds, releases,
    cordons and nodes leaving, between /filter and /prioritize too."""
    state = _cluster(seed, policy, nodes=40)
    p = Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    for pod in pods:
        p.evaluate(pod)
    start = 0
    ordered = 0
    for step in range(80):
        pod = rng.choice(pods)
        names = sorted(state.nodes)
        size = rng.choice([5, 9, 14, len(names)])
        asked = [names[(start + k) % len(names)] for k in range(size)]
        start = (start + size) % len(names)
        if step % 7 == 3:
            asked += asked[:2]  # a name asked twice
        ev = p.evaluate(pod, list(asked))
        want_passed = p.passing(pod, asked, ev)
        want_failed, want_unresolvable = dict(ev.failed), dict(ev.unresolvable)
        passed, failed, unresolvable = p.filter_names(pod, asked)
        assert passed == want_passed
        assert list(failed.items()) == list(want_failed.items())
        assert unresolvable == want_unresolvable
        if step % 4 == 1 and passed:  # a bind between /filter and /prioritize: the list is not taken on trust
            _change(state, p, rng, step, passed[:1])
        want = to_priorities(_oracle(p, pod, passed).scores, state.config.priority_mapping)
        assert p.priorities_for(pod, passed) == want
        _check_order(p)
        ordered += any(m.order is not None for m in p._memo.values())
        for _ in range(rng.choice([0, 1, 1, 2])):
            _change(state, p, rng, step, asked)
    if policy != "random":  # per-pod memos are ranked once each: no order is kept for them
        assert ordered > 40


def test_equal_keys_among_the_best_keep_the_names_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crc collision (equal score and tie-break) among the first eleven along the kept order: `_top_of`'s answer,
    in which equal keys keep the order asked, not the kept order's."""
    monkeypatch.setattr(planner_module, "_tiebreak", lambda name: len(name))  # every name of a length collides
    monkeypatch.setattr(planner_module, "_CRCS", {})
    state = _cluster(0, "default", nodes=40)
    p = Planner(state)
    pod = make_info("s", **SHAPES[0])  # type: ignore[arg-type]
    names = sorted(state.nodes)
    p.evaluate(pod, names)
    for step in range(6):
        asked = list(reversed(names[step * 5 : step * 5 + 25]))
        passed, _, _ = p.filter_names(pod, asked)
        got = p.priorities_for(pod, passed)
        assert got == _rank_of(p.evaluate(pod, names).scores, passed, scored=True)
        assert got == to_priorities({n: p.evaluate_node(n, pod).score for n in passed})
    assert any(m.order is not None for m in p._memo.values())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["default", "fgd", "random", "binpack"])
def test_a_memo_made_over_a_window_grows_with_the_next_windows(seed: int, policy: str) -> None:
    """No call over every node first (as after a relearn): each shape's memo is made over one window and the next
    windows add their new names to it (`Planner._extend`) until it covers every node; /filter and /prioritize decide
    as the full path through binds, releases, cordons, nodes leaving and joining and relearns, the kept rank order
    holds the added nodes, and a memo that covers every node is not added to again."""
    state = _cluster(seed, policy, nodes=40)
    p = Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    extended = 0
    real = Planner._extend

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        nonlocal extended
        extended += 1
        return real(*a, **k)

    p._extend = lambda *a, **k: counted(p, *a, **k)  # type: ignore[method-assign]
    start = 0
    covered = 0
    for step in range(90):
        pod = pods[step % len(pods)] if step < 40 else rng.choice(pods)
        if step in (20, 60):
            p.observe(pod)  # a learning policy relearns: the new epoch's memo starts over a window
        names = sorted(state.nodes)
        size = rng.choice([6, 9, 13])
        asked = [names[(start + k) % len(names)] for k in range(size)]
        start = (start + size) % len(names)
        if step % 7 == 3:
            asked += asked[:2]  # a name asked twice
        passed, failed, unresolvable = p.filter_names(pod, asked)
        want = _oracle(p, pod, asked)
        assert passed == [n for n in asked if n in want.feasible]
        assert failed == {n: want.failed[n] for n in asked if n in want.failed}
        assert unresolvable == {n: want.unresolvable[n] for n in asked if n in want.unresolvable}
        if step % 5 == 2 and passed:  # /prioritize after a bind: the list is not taken on trust
            _change(state, p, rng, step, passed[:1])
        assert p.priorities_for(pod, passed) == to_priorities(
            _oracle(p, pod, passed).scores, state.config.priority_mapping
        )
        _check_order(p)
        covered += sum(m.name_set.issuperset(state.nodes) for m in p._memo.values())
        for _ in range(rng.choice([0, 1, 1, 2])):
            _change(state, p, rng, step, asked, new_nodes=step > 70)
    assert extended > 30
    assert covered > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["default", "fgd", "binpack"])
def test_filter_names_with_names_without_an_inventory(seed: int, policy: str) -> None:
    """/filter's call with the request's own names (`filter_names(..., unknown=...)`: names without an inventory among
    them, told apart as each name is looked up once while the shape's memo covers every node) against the way before
    it, on a second planner over the same state: the names with an inventory first, then those without appended as
    failed. The same NodeNames, FailedNodes in the same order and unresolvable nodes, and the same priorities over
    the answer, through stale nodes asked, names asked twice, names never known, nodes that left (asked while stale,
    and after), nodes joining, binds, releases and relearns; and both ways answer many calls."""
    state = _cluster(seed, policy, nodes=40)
    p, ref = Planner(state), Planner(state)
    rng = random.Random(seed)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    for pod in pods:
        p.evaluate(pod)
        ref.evaluate(pod)
    covered = Planner._filter_covered
    fast = 0

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        nonlocal fast
        out = covered(p, *a, **k)
        fast += out is not None
        return out

    p._filter_covered = counted  # type: ignore[method-assign]
    gone: list[str] = []
    start = 0
    for step in range(90):
        pod = rng.choice(pods)
        if step in (30, 31):
            p.observe(pod)  # a relearn: a new epoch, a new memo over the names of the next call
            ref.observe(pod)
        names = sorted(state.nodes)
        size = rng.choice([5, 9, 14, len(names)])
        asked = [names[(start + k) % len(names)] for k in range(size)]
        start = (start + size) % len(names)
        if step % 7 == 3:
            asked += asked[:2]  # a name asked twice
        if step % 5 == 1:
            asked.insert(rng.randrange(len(asked) + 1), f"ghost-{step % 3}")  # never a node
        if gone and step % 4 == 2:
            asked.insert(rng.randrange(len(asked) + 1), rng.choice(gone))  # a node that left
        if step % 11 == 6:
            leaving = rng.choice(names)  # leaves now, asked while each memo still holds it (stale)
            state.remove_node(leaving)
            gone.append(leaving)
            asked.append(leaving)
        if rng.random() < 0.3:
            asked = [x for x in asked for _ in range(2)] if step % 2 else asked[::-1]
        got = p.filter_names(pod, list(asked), unknown="no inventory")
        known = [x for x in asked if x in state.nodes]
        want_passed, want_failed, want_unresolvable = ref.filter_names(pod, known)
        if len(known) < len(asked):
            want_failed = {**want_failed, **dict.fromkeys((x for x in asked if x not in state.nodes), "no inventory")}
        assert got[0] == want_passed
        assert list(got[1].items()) == list(want_failed.items())
        assert got[2] == want_unresolvable
        if step % 4 == 1 and got[0]:  # a bind between /filter and /prioritize
            _change(state, p, rng, step, got[0][:1])
        assert p.priorities_for(pod, got[0]) == ref.priorities_for(pod, want_passed)
        _check_order(p)
        for _ in range(rng.choice([0, 1, 1, 2])):
            _change(state, p, rng, step, asked, new_nodes=step > 60)
    assert 25 < fast < 90  # both ways taken


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["default", "fgd", "binpack"])
def test_filter_over_every_name_cuts_the_names_not_feasible(seed: int, policy: str) -> None:
    """/filter over every node, the same names each time (`_filter_every`: NodeNames are the names less the positions
    kept of those not feasible, `_Memo.out_at`) against the way before on a second planner: the same NodeNames,
    FailedNodes in the same order and priorities, through binds (most on nodes just passed), releases, cordons, a
    node leaving and coming back, nodes joining, and relearns; the positions kept match the evaluation after each
    call."""
    state = _cluster(seed, policy, nodes=40)
    p, ref = Planner(state), Planner(state)
    rng = random.Random(seed)
    order = list(state.nodes)
    pods = [make_info(f"s{i}", **kw) for i, kw in enumerate(SHAPES)]  # type: ignore[arg-type]
    for pod in pods:
        p.evaluate(pod, order)
        ref.evaluate(pod, order)
    every = Planner._filter_every
    cut = 0

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        nonlocal cut
        cut += 1
        return every(p, *a, **k)

    p._filter_every = counted  # type: ignore[method-assign]
    away: NodeInventory | None = None
    for step in range(70):
        pod = rng.choice(pods)
        if step in (20, 25):  # a node joins: each memo adds it when next asked (`_extend`), then covers it again
            name = f"new{step}"
            state.upsert_node(make_node(name, 8, split=4))
            state.apply(
                f"bg/{name}", make_assignment(name, [(rng.randrange(8), 20480, 25)], role=Role.DECODE, model="m")
            )
            order.append(name)
        if step in (22, 27):  # the new node fills up after its memos added it: no longer feasible
            name = f"new{step - 2}"
            full = make_assignment(name, [(i, GPU_MEM, 100) for i in range(8)], role=Role.DECODE, model="m")
            state.release(f"bg/{name}")
            state.apply(f"bg/{name}", full)
        if step in (40, 41):
            p.observe(pod)
            ref.observe(pod)
            p.evaluate(pod, order)
            ref.evaluate(pod, order)
        asked = [n for n in order if n in state.nodes]
        got = p.filter_names(pod, list(asked), unknown="no inventory")
        want = ref.filter_names(pod, asked)
        assert got[0] == want[0]
        assert list(got[1].items()) == list(want[1].items())
        assert got[2] == want[2]
        assert p.priorities_for(pod, got[0]) == ref.priorities_for(pod, want[0])
        for memo in p._memo.values():
            if memo.out_at is not None:
                ev = memo.evaluation
                assert memo.out_at == {i for i, n in enumerate(memo.names) if n not in ev.feasible}
        roll = rng.random()
        if roll < 0.6:
            for _ in range(rng.choice([1, 1, 2, 3])):
                if rng.random() < 0.7:
                    shape = make_info(f"b{step}-{rng.random()}", **rng.choice(SHAPES))  # type: ignore[arg-type]
                    r = p.evaluate_node(rng.choice(got[0][:3] or order), shape)
                    if r.placement is not None:
                        state.apply(shape.key, r.placement.assignment(shape))
                elif state.assignments:
                    state.release(rng.choice(sorted(state.assignments)))
        elif roll < 0.65:
            node = state.nodes[rng.choice(sorted(state.nodes))]
            inv = node.inventory
            cordon = Cordon() if inv.cordon.uuids else Cordon(frozenset({inv.gpus[0].uuid}))
            state.upsert_node(dataclasses.replace(inv, cordon=cordon))
        elif roll < 0.7 and away is None:
            gone = rng.choice(order)
            away = state.nodes[gone].inventory
            state.remove_node(gone)
            if rng.random() < 0.5:
                state.upsert_node(away)  # back at once: its name is where it was in `order`
                away = None
            continue
        if away is not None:  # back after a call without it
            state.upsert_node(away)
            away = None
    assert cut > 30
