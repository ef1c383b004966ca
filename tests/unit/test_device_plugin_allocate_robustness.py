"""Allocate under junk and faults: final refusals are immediate, only "not visible yet" waits and without the
lock, a multi-container request is all or none, unhealthy or unadvertised replicas are refused, messages fit."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_plugin.envs import EnvSettings
from device_plugin.health import GpuHealth, HealthBoard
from device_plugin.manager import AllocationError, DeviceManager
from device_plugin.pods import PodRecord
from device_plugin.status_text import MAX_STATUS_BYTES, encoded_len, trimmed
from device_plugin.testing.pods import MemoryPods
from device_plugin.testing.workload import PlacedPod, pod_uid, spec_containers
from vgpu import annotations as ann
from vgpu.devices import GpuDevice

NODE = "gpu-1"
GPUS = tuple(GpuDevice(f"GPU-{i:08x}-1111-2222-3333-444444444444", i, "H100", 81920, split_count=4) for i in range(4))


class CountingPods(MemoryPods):
    """MemoryPods whose LIST can be slowed down (an apiserver under load), or held until `gate` is set (a LIST
    in flight for as long as the test needs, whatever the machine's load; `listing` says one is)."""

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.gate = gate
        self.listing = threading.Event()

    def list_node_pods(self, *, node: str) -> list[PodRecord]:
        self.listing.set()
        if self.gate is not None:
            assert self.gate.wait(60), "the test never released the LIST"
        time.sleep(self.delay_s)
        return super().list_node_pods(node=node)


def manager(pods: MemoryPods, *, retry_s: float = 0.0, sleeps: list[float] | None = None) -> DeviceManager:
    board = HealthBoard(g.uuid for g in GPUS)

    def sleep(s: float) -> None:
        if sleeps is not None:
            sleeps.append(s)
        time.sleep(s)

    return DeviceManager(
        node=NODE,
        resource="nvidia.com/gpu",
        gpus=GPUS,
        board=board,
        pods=pods,
        kubelet=None,
        settings=EnvSettings(),
        retry_s=retry_s,
        retry_interval_s=0.05,
        sleep=sleep,
    )


def pod(name: str, *containers: tuple[str, list[int]], i: int = 0, mem: int = 4096) -> PodRecord:
    a = ann.Assignment(
        node=NODE,
        containers=tuple(
            ann.ContainerAssignment(c, tuple(ann.DeviceSlice(GPUS[g].uuid, g, mem, 10) for g in gpus))
            for c, gpus in containers
        ),
    )
    return PlacedPod(name, pod_uid(16, i), a).record(namespace="ns", node=NODE, bind_time=f"t{i:03d}")


def rid(g: int, n: int = 0) -> str:
    return f"{GPUS[g].uuid}::{n}"


@pytest.mark.parametrize(
    ("request_ids", "expected"),
    [
        ([], "the request names no container"),
        ([[]], "container request 0 names no device"),
        ([["junk"]], "device 'junk' is not advertised by this plugin for nvidia.com/gpu"),
        ([[f"{GPUS[0].uuid}::9"]], "is not advertised"),  # split_count 4: ::9 was never advertised
        ([["GPU-0badc0de-0000-0000-0000-000000000000::0"]], "is not advertised"),
        ([[f"{GPUS[0].uuid}::\u00b2"]], "is not advertised"),
        ([[rid(0), rid(0, 1)]], "put two vGPUs of one container on the same GPU"),
    ],
)
def test_requests_that_can_never_succeed_are_refused_at_once(request_ids: list[list[str]], expected: str) -> None:
    pods = CountingPods()
    pods.add(pod("a", ("c0", [0, 1])))
    sleeps: list[float] = []
    m = manager(pods, retry_s=5.0, sleeps=sleeps)
    t0 = time.monotonic()
    with pytest.raises(AllocationError, match="vGPU Allocate refused: ") as info:
        m.allocate(request_ids)
    assert expected in str(info.value)
    # sleeps == [] is the proof; a retried refusal would also take the 5 s retry_s (the bound is loose for load)
    assert sleeps == [] and time.monotonic() - t0 < 5.0 / 2, "a final refusal was retried"
    assert m.served() == {}


def test_a_refused_assignment_is_final_not_retried() -> None:
    pods = CountingPods()
    asks_less = pod("x", ("c0", [0]), mem=2048).assignment
    assert asks_less is not None
    p = pod("greedy", ("c0", [0]), mem=4096)
    pods.add(dataclasses.replace(p, spec={"spec": {"containers": spec_containers(asks_less)}}))
    sleeps: list[float] = []
    m = manager(pods, retry_s=5.0, sleeps=sleeps)
    with pytest.raises(AllocationError, match="requests resolve to 2048 MiB"):
        m.allocate([[rid(0)]])
    assert sleeps == [] and pods.lists == 1


def test_unhealthy_replica_is_refused_with_the_reason() -> None:
    pods = CountingPods()
    pods.add(pod("a", ("c0", [2])))
    m = manager(pods, retry_s=5.0)
    m.board.set(GPUS[2].uuid, GpuHealth(False, "XID 79 (GPU fell off the bus)"))
    with pytest.raises(AllocationError) as info:
        m.allocate([[rid(2, 3)]])
    assert str(info.value) == f"vGPU Allocate refused: device {rid(2, 3)} is unhealthy (XID 79 (GPU fell off the bus))"
    assert m.served() == {}


def test_not_yet_visible_is_retried_until_the_assignment_appears() -> None:
    pods = CountingPods()
    m = manager(pods, retry_s=60.0)  # long enough for a late Timer on a loaded machine; success ends the wait
    late = pod("late", ("c0", [1]))

    def add_after_the_first_list() -> None:  # not a timer: a stalled test thread could list after it fired
        give_up = time.monotonic() + 60
        while pods.lists < 1 and time.monotonic() < give_up:
            time.sleep(0.005)
        time.sleep(0.3)
        pods.add(late)

    threading.Thread(target=add_after_the_first_list, daemon=True).start()
    t0 = time.monotonic()
    out = m.allocate([[rid(1)]])
    assert time.monotonic() - t0 >= 0.3 and pods.lists > 1  # it waited and re-read until the pod appeared
    assert out[0].envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[1].uuid
    assert m.served() == {(late.uid, "c0"): (rid(1),)}


def test_not_yet_visible_gives_up_after_retry_s_with_the_reason() -> None:
    m = manager(CountingPods(), retry_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(AllocationError, match="no pod in bind-phase allocating on node gpu-1"):
        m.allocate([[rid(1)]])
    # not before retry_s; the upper bound only tells "gave up" from "waits for ever" (loose for a loaded machine)
    assert 0.3 <= time.monotonic() - t0 < 10.0


def test_a_waiting_request_does_not_hold_up_other_pods() -> None:
    """Ten requests nobody is waiting for (each re-read for 4 s) and then a valid one: served in ms, not after
    the others' waits (20.9 s before the fail-fast change; behind even one of them it would wait ~4 s)."""
    pods = CountingPods(delay_s=0.01)
    valid = pod("valid", ("c0", [3]), i=1)
    m = manager(pods, retry_s=4.0)
    junk = [threading.Thread(target=_refused, args=(m, [[rid(g % 3, g % 4)]])) for g in range(10)]
    for t in junk:
        t.start()
    give_up = time.monotonic() + 30
    while pods.lists < 10 and time.monotonic() < give_up:  # all ten have read the list and are in their wait
        time.sleep(0.01)
    assert pods.lists >= 10
    pods.add(valid)
    t0 = time.monotonic()
    m.allocate([[rid(3)]])
    waited = time.monotonic() - t0
    for t in junk:
        t.join()
    assert waited < 2.0, f"the valid Allocate waited {waited:.2f} s behind junk"


def _refused(m: DeviceManager, ids: list[list[str]]) -> None:
    with pytest.raises(AllocationError):
        m.allocate(ids)


def test_multi_container_request_is_all_or_none() -> None:
    pods = CountingPods()
    two = pod("two", ("c0", [0]), ("c1", [1]))
    pods.add(two)
    m = manager(pods)
    # the second container request names the wrong GPU: nothing of the request may stay served
    with pytest.raises(AllocationError, match="kubelet picked GPUs"):
        m.allocate([[rid(0)], [rid(2)]])
    assert m.served() == {}
    # ... so the kubelet's retry of the same pod is served, both containers
    out = m.allocate([[rid(0)], [rid(1)]])
    assert [s.annotations[ann.CRI_CONTAINER] for s in out] == ["c0", "c1"]
    assert set(m.served()) == {(two.uid, "c0"), (two.uid, "c1")}


def test_patches_are_queued_once_per_pod_of_a_multi_container_request() -> None:
    pods = CountingPods()
    two = pod("two", ("c0", [0]), ("c1", [1]))
    pods.add(two)
    m = manager(pods)
    m.start()
    try:
        m.allocate([[rid(0)], [rid(1)]])
        m.drain()
    finally:
        m.stop()
    assert pods.get(two.key).bind_phase == ann.BindPhase.ALLOCATED


def test_preferred_reads_pods_outside_the_lock() -> None:
    """While GetPreferredAllocation's LIST is in flight (held open by the test), the manager's lock is free."""
    gate = threading.Event()
    pods = CountingPods(gate=gate)
    m = manager(pods)
    t = threading.Thread(target=m.preferred, args=([rid(0)], [], 1))
    t.start()
    try:
        assert pods.listing.wait(30), "preferred() never listed the pods"
        served = threading.Thread(target=m.served)  # takes the lock
        served.start()
        served.join(timeout=30)
        assert not served.is_alive(), "served() waited for the LIST: preferred() holds the lock while listing"
    finally:
        gate.set()
        t.join(timeout=30)


# --- status text ------------------------------------------------------------------------------------------------


def test_short_messages_are_kept_whole() -> None:
    assert trimmed("vGPU Allocate refused: nope") == "vGPU Allocate refused: nope"


def test_long_message_is_cut_with_the_count_of_bytes_left_out() -> None:
    msg = "vGPU Allocate refused: ambiguous: " + ", ".join(f"ns/pod-{i}[c0] on GPU-{i:08x}" for i in range(500))
    out = trimmed(msg)
    assert encoded_len(out) <= MAX_STATUS_BYTES
    head, _, tail = out.rpartition("... (")
    assert msg.startswith(head) and tail == f"{len(msg) - len(head)} more bytes)"


@given(st.text(max_size=5000))
def test_trimmed_always_fits_and_keeps_a_prefix(text: str) -> None:
    out = trimmed(text, limit=512)
    assert encoded_len(out) <= 512
    if out != text:
        head = out.rpartition("... (")[0]
        assert text.startswith(head)
        assert out.endswith(f"({len(text.encode()) - len(head.encode())} more bytes)")
