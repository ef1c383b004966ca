"""The parts ExtenderService is made of, each through its own interface: the pending pods and their nudges, what
learning policies are fed, the reservations of binds in flight, the verbs' recent pods, the Replica the election
drives; and the pod-metadata helpers of the core."""

from __future__ import annotations

import copy
import datetime as dt
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, cast

import pytest

from scheduler_extender import leadership
from scheduler_extender.kube import CoreApi
from scheduler_extender.leader import LeaseRecord
from scheduler_extender.learning import Learning, seed_candidates
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.pending import Pending
from scheduler_extender.recent import RecentPods
from scheduler_extender.reservations import Refused, Reservations
from scheduler_extender.settings import load
from scheduler_extender.sync import StateSync
from tests.unit.test_extender_leader import MemoryLease
from tests.unit.test_extender_service import _pod, _running, _state
from vgpu import annotations as ann
from vgpu.errors import RequestError, UnknownPolicyError
from vgpu.planner import Planner
from vgpu.pod import PodInfo, bound_node, is_finished, pod_info, pod_key, pod_uid
from vgpu.state import ClusterState

# -- vgpu.pod's metadata helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "uid", "key", "node", "finished"),
    [
        ({}, "", "default/", "", False),
        ({"metadata": None, "spec": None, "status": None}, "", "default/", "", False),
        ({"metadata": {"name": "p", "uid": "u1"}}, "u1", "default/p", "", False),
        (
            {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n0"}, "status": {"phase": "Running"}},
            "",
            "ns/p",
            "n0",
            False,
        ),
        ({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}}, "", "default/p", "", True),
        ({"metadata": {"name": "p"}, "status": {"phase": "Failed"}}, "", "default/p", "", True),
    ],
)
def test_pod_metadata_helpers_read_partial_objects(
    pod: dict[str, Any], uid: str, key: str, node: str, finished: bool
) -> None:
    assert (pod_uid(pod), pod_key(pod), bound_node(pod), is_finished(pod)) == (uid, key, node, finished)


# -- Pending: rejected pods and the nudge --------------------------------------------------------------------------


class RecordingNudger:
    def __init__(self) -> None:
        self.requests: list[list[tuple[str, str]]] = []
        self.forgotten: list[str] = []

    def request(self, pods: Iterable[tuple[str, str]]) -> int:
        self.requests.append(list(pods))
        return len(self.requests[-1])

    def forget(self, key: str) -> None:
        self.forgotten.append(key)


def test_pending_keeps_rejections_oldest_first_and_nudges_them_when_capacity_frees() -> None:
    nudger, counts = RecordingNudger(), list[int]()
    pending = Pending(nudger, on_count=counts.append)
    pending.capacity_freed()
    assert nudger.requests == []  # nobody pending: no request at all
    pending.filtered("ns/a", "ua", fits=False)
    pending.filtered("ns/b", "ub", fits=False)
    pending.filtered("ns/a", "ua", fits=False)  # rejected again: now the newest
    pending.filtered("ns/c", "uc", fits=True)  # fits: never pending
    assert list(pending) == ["ns/b", "ns/a"] and "ns/c" not in pending and counts[-1] == 2
    pending.capacity_freed()
    assert nudger.requests == [[("ns/b", "ub"), ("ns/a", "ua")]]
    pending.filtered("ns/b", "ub", fits=True)  # fits now: no longer pending
    pending.done("ns/a")  # bound or deleted: dropped, and its queued nudge forgotten
    assert len(pending) == 0 and counts[-1] == 0 and nudger.forgotten == ["ns/a"]


def test_pending_without_a_nudger_only_counts() -> None:
    counts: list[int] = []
    pending = Pending(on_count=counts.append)
    pending.filtered("ns/a", "ua", fits=False)
    pending.capacity_freed()
    pending.done("ns/a")
    assert counts == [1, 0] and len(pending) == 0


# -- Learning: batches, seeding ------------------------------------------------------------------------------------


class RecordingPolicy:
    def __init__(self, refuse: str = "") -> None:
        self.observed: list[str] = []
        self.refuse = refuse

    def observe(self, pod: PodInfo) -> None:
        if pod.name == self.refuse:
            raise UnknownPolicyError(f"{pod.name}: no such policy")
        self.observed.append(pod.name)


def _info(name: str, pct: int = 10) -> PodInfo:
    return pod_info(_pod(name, pct))


def test_learning_feeds_the_bootstrap_at_once_then_one_batch_per_interval() -> None:
    policy, now = RecordingPolicy(refuse="bad"), [0.0]
    learning = Learning(policy, relearn_interval_s=10, bootstrap=3, clock=lambda: now[0])
    for name in ("p0", "bad", "p1"):
        learning.arrived(_info(name))
    assert policy.observed == ["p0", "p1"] and learning.learned == 3  # a refused pod neither stops nor poisons
    learning.arrived(_info("p2"))
    learning.arrived(_info("p3"))
    assert policy.observed == ["p0", "p1"] and learning.queued == 2  # within the interval: held
    now[0] = 10.0
    learning.arrived(_info("p4"))
    assert policy.observed[2:] == ["p2", "p3", "p4"] and learning.queued == 0


def test_first_seen_is_true_once_per_uid_and_never_for_a_seeded_pod() -> None:
    learning = Learning(RecordingPolicy())
    assert learning.first_seen("") is False  # a pod without UID is never "new"
    assert learning.first_seen("u1") is True and learning.first_seen("u1") is False
    learning.seed([("u2", _info("seeded"))], Counter())
    assert learning.first_seen("u2") is False


def test_seeding_feeds_each_running_pod_once_and_counts_what_it_skipped() -> None:
    policy, metrics = RecordingPolicy(refuse="unknown"), ExtenderMetrics(ClusterState())
    learning = Learning(policy, metrics=metrics)
    learning.arrived(_info("queued"))  # fed in the same batch as the seeding
    candidates = [("u1", _info("r1")), ("u2", _info("r2")), ("u3", _info("unknown"))]
    assert learning.seed(candidates, Counter({"invalid-request": 2})) == 2
    assert policy.observed == ["queued", "r1", "r2"]
    assert learning.seed(candidates, Counter()) == 0  # seeded before: never twice
    learning.forget("u1")  # deleted or finished
    learning.keep_only(["u1", "u3"])  # a relist without u2
    assert learning.seed(candidates, Counter()) == 2 and policy.observed[3:] == ["r1", "r2"]
    sample = metrics.registry.get_sample_value
    assert sample("vgpu_extender_learning_seeded_pods_total") == 4
    assert sample("vgpu_extender_learning_seed_skipped_pods_total", {"reason": "invalid-request"}) == 2
    assert sample("vgpu_extender_learning_seed_skipped_pods_total", {"reason": "unknown-policy"}) == 3


def test_seed_candidates_are_the_running_pods_holding_an_assignment() -> None:
    def parse(pod: Any) -> PodInfo:
        if pod["metadata"]["name"] == "broken":
            raise KeyError("containers")
        return pod_info(pod)

    running, empty = _running("r", 50, "GPU-a-0"), _running("empty", 50, "GPU-a-1")
    empty["spec"]["containers"][0]["resources"] = {}
    pods = [
        running,
        _running("invalid", 150, "GPU-a-0"),
        _running("broken", 50, "GPU-a-0"),
        empty,
        _running("done", 50, "GPU-a-0") | {"status": {"phase": "Succeeded"}},
        _pod("unassigned"),
    ]
    out, skipped = seed_candidates(pods, parse)
    assert [(uid, info.name) for uid, info in out] == [(running["metadata"]["uid"], "r")]
    assert skipped == Counter({"invalid-request": 1, "unparsable": 1, "empty-request": 1})


# -- Reservations: binds in flight ---------------------------------------------------------------------------------


def _reservations(grace: float = 30.0) -> tuple[Reservations, ClusterState, list[str], list[int]]:
    state, freed, counts = _state(), list[str](), list[int]()
    reservations: Reservations
    sync = StateSync(state, is_inflight=lambda key: key in reservations, bind_grace_s=grace)
    reservations = Reservations(
        state, Planner(state), sync, on_freed=lambda: freed.append("freed"), on_count=counts.append
    )
    return reservations, state, freed, counts


def _books(state: ClusterState) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(state.assignments), dict(state.orphans)


def test_reserve_holds_the_slices_and_refuses_a_second_bind_with_nothing_changed() -> None:
    reservations, state, _freed, counts = _reservations()
    held = reservations.reserve("ns/p", "a", _info("p", 50))
    assert held is not None and held.node == "a" and state.assignments["ns/p"] == held
    assert "ns/p" in reservations and counts == [1]
    before = _books(state)
    with pytest.raises(Refused, match="a bind of this pod is already in progress"):
        reservations.reserve("ns/p", "a", _info("p", 50))
    reservations.bound("ns/p")
    assert "ns/p" not in reservations and counts == [1, 0] and _books(state) == before
    with pytest.raises(Refused, match=r"holds a live assignment on a; .* expires after 30 s"):
        reservations.reserve("ns/p", "b", _info("p", 50))
    assert _books(state) == before and len(reservations) == 0


def test_reserve_refuses_a_pod_that_no_longer_fits_and_holds_nothing_for_an_empty_request() -> None:
    reservations, state, _freed, _counts = _reservations()
    for i in range(2):
        assert reservations.reserve(f"ns/full{i}", "a", _info(f"full{i}", 100)) is not None
    before = _books(state)
    with pytest.raises(Refused, match="no longer fits"):
        reservations.reserve("ns/late", "a", _info("late", 50))
    assert _books(state) == before and "ns/late" not in reservations
    empty = copy.deepcopy(_pod("cpu-only"))
    empty["spec"]["containers"][0]["resources"] = {}
    assert reservations.reserve("ns/cpu-only", "a", pod_info(empty)) is None
    assert "ns/cpu-only" in reservations and _books(state) == before


def test_roll_back_frees_the_slices_and_reports_the_freed_capacity() -> None:
    reservations, state, freed, counts = _reservations()
    held = reservations.reserve("ns/p", "a", _info("p", 50))
    reservations.roll_back("ns/p", held)
    assert "ns/p" not in state.assignments and "ns/p" not in reservations and freed == ["freed"]
    assert counts == [1, 0] and state.totals()["memory_used_mib"] == 0
    assert reservations.reserve("ns/q", "a", _info("q", 10)) is not None
    reservations.roll_back("ns/r", None)  # a bind that held nothing frees nothing
    assert freed == ["freed"] and "ns/q" in state.assignments


def test_release_stale_drops_only_the_pods_own_unbound_reservation_and_expire_frees_past_the_grace() -> None:
    reservations, state, freed, _counts = _reservations(grace=30)
    now = [100.0]
    reservations.sync.clock = lambda: now[0]
    pod = _pod("p", 50)
    info = pod_info(pod)
    assert reservations.reserve("ns/p", "a", info) is not None
    reservations.bound("ns/p")
    # The watch shows the pod unbound with the assignment: its Binding never landed.
    pod["metadata"]["annotations"] = {ann.POD_ASSIGNMENT: ann.encode_assignment(state.assignments["ns/p"])}
    reservations.sync.pod_event("MODIFIED", pod)
    assert reservations.sync.unbound == {"ns/p": 130.0} and "ns/p" in state.assignments
    bound = pod_info({**pod, "spec": {**pod["spec"], "nodeName": "a"}})
    reservations.release_stale(bound)  # a body naming a bound pod never frees its slices
    assert "ns/p" in state.assignments
    forged = pod_info({**pod, "metadata": {**pod["metadata"], "uid": "forged"}})
    reservations.release_stale(forged)  # nor one under another UID than the pod the watch showed
    assert "ns/p" in state.assignments and "ns/p" in reservations.sync.unbound
    reservations.release_stale(info)  # scheduled again: its earlier bind failed
    assert "ns/p" not in state.assignments and "ns/p" not in reservations.sync.unbound and freed == []
    reservations.reserve("ns/q", "a", _info("q", 50))
    reservations.bound("ns/q")
    reservations.sync.unbound["ns/q"] = 130.0
    now[0] = 129.0
    reservations.expire()
    assert "ns/q" in state.assignments and freed == []
    now[0] = 130.0
    reservations.expire()
    assert "ns/q" not in state.assignments and freed == ["freed"]


# -- RecentPods: the verbs' parse cache, the file source's bodies ---------------------------------------------------


def test_recent_pods_reuse_a_parse_for_an_equal_pod_and_never_keep_an_invalid_one() -> None:
    parsed: list[str] = []

    def parse(pod: Any) -> PodInfo:
        parsed.append(pod["metadata"]["name"])
        return pod_info(pod)

    recent = RecentPods(parse, size=2)
    pod = _pod("p")
    assert recent.parse(copy.deepcopy(pod)) is recent.parse(copy.deepcopy(pod)) and parsed == ["p"]
    changed = copy.deepcopy(pod)
    changed["metadata"]["labels"] = {"x": "y"}
    recent.parse(changed)
    assert parsed == ["p", "p"]
    bad = _pod("bad", 150)
    for _ in range(2):
        with pytest.raises(RequestError):
            recent.parse(bad)
    recent.parse(_pod("q"))
    recent.parse(_pod("r"))  # size 2: p (the oldest) goes
    recent.parse(changed)
    assert parsed == ["p", "p", "bad", "bad", "q", "r", "p"]
    no_uid = _pod("anon")
    no_uid["metadata"]["uid"] = ""
    recent.parse(no_uid)
    recent.parse(no_uid)
    assert parsed[-2:] == ["anon", "anon"]  # nothing to key it by: parsed each time


def test_recent_pods_keep_filter_bodies_only_for_the_file_source() -> None:
    pod = _pod("p")
    off = RecentPods(pod_info)
    off.keep(pod)
    assert off.body("ns/p") is None
    on = RecentPods(pod_info, keep_bodies=True, size=1)
    on.keep(pod)
    assert on.body("ns/p") == pod  # kept as JSON bytes, handed back as a new dict
    anon = _pod("anon") | {"metadata": {"name": "anon", "namespace": "ns"}}
    on.keep(anon)
    assert on.body("ns/anon") is None and on.body("ns/p") == pod  # no UID: never kept
    on.keep(_pod("q"))
    assert on.body("ns/p") is None and on.body("ns/q") is not None  # size 1: the oldest goes


def test_recent_pods_hold_digests_and_parses_bounded_by_bytes_never_the_pods() -> None:
    """6 x 8 MB pods once kept 1.2 GiB: the cache held each whole pod to compare the next one with."""
    big = _pod("big")
    big["metadata"]["labels"] = {f"l{i}": "x" * 1000 for i in range(8000)}  # ~8 MB of labels, not kept
    recent = RecentPods(pod_info, max_bytes=100_000)
    info = recent.parse(big)
    assert recent.parse(copy.deepcopy(big)) is info  # recognised by its digest
    assert recent.held_bytes < 2_000
    for i in range(10):  # 20 KB of annotations each: the byte budget, not the entry count, evicts
        pod = _pod(f"a{i}")
        pod["metadata"]["annotations"] = {"note": "y" * 20_000}
        recent.parse(pod)
    assert recent.held_bytes <= 100_000
    bodies = RecentPods(pod_info, keep_bodies=True, max_bytes=50_000)
    for i in range(10):
        pod = _pod(f"b{i}")
        pod["metadata"]["annotations"] = {"note": "z" * 20_000}
        bodies.keep(pod)
    assert bodies.held_bytes <= 50_000 and bodies.body("ns/b9") is not None and bodies.body("ns/b0") is None


# -- leadership drives a Replica ------------------------------------------------------------------------------------


class RecordingReplica:
    def __init__(self) -> None:
        self.ready = threading.Event()
        self.calls: list[tuple[str, Any]] = []

    def set_leading(self, leading: bool, *, leader: str = "") -> None:
        self.calls.append(("leading" if leading else "standing by", leader))

    def leader_seen(self, holder: str) -> None:
        self.calls.append(("leader seen", holder))

    def bind_only_until(self, until: Callable[[], float]) -> None:
        self.until = until  # the lease's end for binds; not a call the assertions below follow


@pytest.fixture
def lease(monkeypatch: pytest.MonkeyPatch) -> MemoryLease:
    store = MemoryLease()
    monkeypatch.setattr(leadership, "lease_store", lambda **kw: store)
    return store


# Neither test below waits for a lease to lapse, so the lease is long: a leader whose renewals stalled past a short
# renew deadline on a loaded machine would lose the lease and SIGTERM its own process - here, pytest.
_ELECTION = {
    "leader_elect": True,
    "leader_elect_lease_duration_seconds": 60,
    "leader_elect_renew_deadline_seconds": 40,
    "leader_elect_retry_period_seconds": 0.05,
}


def test_the_election_stands_by_until_ready_then_leads_and_on_release_stands_down(lease: MemoryLease) -> None:
    """Taking over calls nothing on the apiserver but the lease (the api here is None: a pod list would fail): the
    standby's pod watch fed learning already (tests/unit/test_warm_standby.py)."""
    replica = RecordingReplica()
    election = leadership.start_leader_election(
        load(flags=_ELECTION, env={}, config_file=None), replica, api=cast(CoreApi, None)
    )
    assert replica.calls == [("standing by", "")] and lease.record is None  # not synced: not a candidate
    replica.ready.set()
    waiting = threading.Event()
    for _ in range(600):  # up to 30 s: the election thread's first round may be late on a loaded machine
        if any(call[0] == "leading" for call in replica.calls):
            break
        waiting.wait(0.05)
    identity = replica.calls[2][1]
    assert replica.calls[1:] == [("leader seen", identity), ("leading", identity)]
    assert election.elector.leading.is_set() and not election.lost.is_set()
    election.release()
    assert replica.calls[-1] == ("standing by", identity) and not election.lost.is_set()  # released: no SIGTERM
    assert lease.record is not None and lease.record.holder == ""


def test_a_standby_names_the_holder_and_never_leads_while_the_lease_is_live(lease: MemoryLease) -> None:
    now = dt.datetime.now(dt.UTC)
    lease.record = LeaseRecord(holder="other_1a2b", duration_s=60, acquire_time=now, renew_time=now, version="1")
    replica = RecordingReplica()
    replica.ready.set()
    election = leadership.start_leader_election(
        load(flags=_ELECTION, env={}, config_file=None), replica, api=cast(CoreApi, None)
    )
    deadline = threading.Event()
    for _ in range(600):  # up to 30 s: the election thread's first round may be late on a loaded machine
        if ("leader seen", "other_1a2b") in replica.calls:
            break
        deadline.wait(0.05)
    election.release()
    assert replica.calls == [("standing by", ""), ("leader seen", "other_1a2b")]
    assert lease.record.holder == "other_1a2b"


def test_the_service_is_a_replica() -> None:
    from scheduler_extender.service import ExtenderService
    from tests.unit.test_extender_service import FakeBinder

    service: leadership.Replica = ExtenderService(_state(), FakeBinder())
    service.leader_seen("other")
    assert service.seed_learning_from([_running(f"r{uuid.uuid4().hex[:4]}", 50, "GPU-a-0")]) == 1
