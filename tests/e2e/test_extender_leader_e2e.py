"""Two extender replicas with --leader-elect on a real apiserver: one serves, the other stands by and takes over.

The Lease, the RBAC (deploy/manifests/extender.yaml's leader-election Role) and the pod label the Service selects
are the real objects; each replica is its own process, stopped cleanly (SIGTERM: it releases the lease) or killed.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.e2e.controlplane import ControlPlane
from tests.e2e.vgpu_stack import Extender, lease_rbac
from vgpu import annotations as ann

NS = "kube-system"
LEASE_S, RENEW_S, RETRY_S = 12.0, 8.0, 0.5
# A standby that finds the lease held waits it out from when it saw the record change, so after a crash it takes
# over no sooner than LEASE_S after the last renewal that landed (checked against the Lease's renewTime). A release
# must hand over well before a lease would have run out: sooner than this after the stop (was 4 s; a loaded CI
# machine needs the time to notice the release and serve, and a 10 s wait is not the broken case).
LEASE_WAIT_MIN_S = LEASE_S - 2 * RETRY_S - 1


def _post(ext: Extender, verb: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        ext.url + "/" + verb, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, context=ext.ctx, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


FILTER = {"Pod": {"metadata": {"name": "probe", "namespace": "default", "uid": "u-probe"}, "spec": {}}, "NodeNames": []}


def _serving(exts: list[Extender]) -> list[Extender]:
    """The replicas that answer /filter (a standby answers 503)."""
    out = []
    for e in exts:
        if e.proc is None or not e.proc.alive():
            continue
        try:
            code, _ = _post(e, "filter", FILTER)
        except (OSError, ssl.SSLError):
            continue
        if code == 200:
            out.append(e)
    return out


def _wait_one_leader(exts: list[Extender], timeout: float) -> tuple[Extender, float]:
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        serving = _serving(exts)
        assert len(serving) <= 1, f"two replicas serve at once: {[e.name for e in serving]}"
        if serving:
            return serving[0], time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError("no replica took over:\n" + "\n".join(e.proc.tail(20) for e in exts if e.proc))


@pytest.fixture
def replicas(control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, str, list[Extender]]]:
    lease = f"vgpu-extender-{uuid.uuid4().hex[:6]}"
    lease_rbac(control_plane, lease)  # the shipped Role names only the default Lease
    core = client.CoreV1Api(control_plane.api_client())
    exts = []
    for name in ("ext-a", "ext-b"):
        pod = f"{lease}-{name}"
        core.create_namespaced_pod(  # the replica's own pod, as the downward API would name it; never scheduled
            NS,
            {
                "metadata": {"name": pod},
                "spec": {"schedulerName": "nobody", "containers": [{"name": "extender", "image": "kube-vgpu"}]},
            },
        )
        args = (
            "--leader-elect",
            f"--leader-elect-resource-name={lease}",
            f"--leader-elect-resource-namespace={NS}",
            f"--leader-elect-lease-duration-seconds={LEASE_S}",
            f"--leader-elect-renew-deadline-seconds={RENEW_S}",
            f"--leader-elect-retry-period-seconds={RETRY_S}",
            f"--pod-name={pod}",
            f"--pod-namespace={NS}",
        )
        exts.append(Extender(control_plane, name=pod, args=args))
    try:
        yield control_plane, lease, exts
    finally:
        for e in exts:
            if e.proc is not None:
                control_plane.stop_process(e.proc)
        for e in exts:
            core.delete_namespaced_pod(e.name, NS)


def _labelled(core: client.CoreV1Api, exts: list[Extender]) -> list[str]:
    return [
        e.name
        for e in exts
        if (core.read_namespaced_pod(e.name, NS).metadata.labels or {}).get(ann.EXTENDER_LEADER_LABEL) == "true"
    ]


def _wait_labelled(core: client.CoreV1Api, exts: list[Extender], want: list[str], timeout: float = 60) -> None:
    """The leader labels its pod after it starts serving (scheduler_extender.leadership: set_leading, then the PATCH;
    the old label is cleared the same way), so serving says nothing yet of the label: wait for it."""
    deadline = time.monotonic() + timeout
    while (got := _labelled(core, exts)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == want, f"leader labels {got}, want {want}"


def _standby_names(standby: Extender, holder: str, timeout: float = 60) -> str:
    """A standby's 503 names the holder it last read from the Lease; its election reads the Lease only once the
    replica is ready (then every retry period), so a refusal sent just after it became ready may still say
    "unknown": poll for the holder. Returns the last refusal's message."""
    deadline = time.monotonic() + timeout
    message = ""
    while True:
        try:
            code, body = _post(standby, "filter", FILTER)
        except (OSError, ssl.SSLError) as exc:  # a slow answer on a loaded machine: ask again
            message = repr(exc)
        else:
            assert code == 503, (code, body)
            message = str(body["Error"])
        if f"the leader is {holder}" in message or time.monotonic() > deadline:
            return message
        time.sleep(0.1)


def test_one_replica_serves_and_a_standby_takes_over_on_release_and_on_crash(
    replicas: tuple[ControlPlane, str, list[Extender]],
) -> None:
    cp, lease, exts = replicas
    core = client.CoreV1Api(cp.api_client())
    coord = client.CoordinationV1Api(cp.api_client())
    for e in exts:
        e.start()  # both synced and ready (/readyz): a standby is ready to take over
    leader, _ = _wait_one_leader(exts, timeout=60)
    standby = next(e for e in exts if e is not leader)
    held = coord.read_namespaced_lease(lease, NS).spec
    assert held.holder_identity.startswith(leader.name + "_") and held.lease_duration_seconds == LEASE_S
    message = _standby_names(standby, held.holder_identity)
    assert f"the leader is {held.holder_identity}" in message, message
    _wait_labelled(core, exts, [leader.name])

    # A clean stop (SIGTERM, as on a rolling update) releases the lease: the standby serves within a few retries,
    # well before the lease would have run out.
    assert leader.proc is not None
    cp.stop_process(leader.proc)
    second, took = _wait_one_leader(exts, timeout=LEASE_S * 3)
    assert second is standby and took < LEASE_WAIT_MIN_S, f"the release handed over after {took:.1f} s"
    assert coord.read_namespaced_lease(lease, NS).spec.lease_transitions == 1
    _wait_labelled(core, exts, [standby.name])

    # The stopped replica comes back as a standby; then the leader crashes (SIGKILL: no release). The standby
    # waits out the lease, then takes over.
    leader.start()
    time.sleep(RETRY_S * 3)
    # Polled, not asked once: _serving counts a replica whose answer timed out (5 s, a loaded machine) as not serving,
    # so one look could miss the standby. The restarted replica must not serve at any look.
    deadline = time.monotonic() + 30
    while (serving := _serving(exts)) != [standby]:
        assert leader not in serving, f"the restarted replica serves while {standby.name} holds the lease"
        assert time.monotonic() < deadline, f"serving: {[e.name for e in serving]}, want only {standby.name}"
        time.sleep(0.2)
    standby.kill()
    # The lease runs out LEASE_S after the last renewal that landed, whenever that was: on a loaded machine the
    # crashed leader's renewals may have lagged seconds behind its kill, so the takeover is measured from the
    # renewTime it left (its own clock, the same machine's), not from the kill. A renewal still in flight at the
    # kill only lands later, which makes the lease run out later still.
    held = coord.read_namespaced_lease(lease, NS).spec
    assert held.holder_identity.startswith(standby.name + "_"), held.holder_identity
    last_renewal = held.renew_time.timestamp()
    third, took = _wait_one_leader(exts, timeout=LEASE_S * 3)
    after_renewal = time.time() - last_renewal
    assert third is leader and after_renewal >= LEASE_S - 0.25, (
        f"took over {took:.1f} s after a crash, {after_renewal:.2f} s after the last renewal: before the lease ran out"
    )
    _wait_labelled(core, exts, [leader.name])  # the crashed leader's stale label is gone too
    assert coord.read_namespaced_lease(lease, NS).spec.lease_transitions == 2

    # Someone else writes the Lease (as a replica that saw it expire during a long pause would): the leader sees
    # another holder at its next renewal, stops serving and exits 1, to come back as a standby.
    # The leader renews every RETRY_S: a renewal between the read and the write makes the write a 409 Conflict
    # (3 of 11 tries on a loaded machine), so read again and write again, as a real intruder would.
    deadline = time.monotonic() + 30
    while True:
        held = coord.read_namespaced_lease(lease, NS)
        held.spec.holder_identity = "intruder"
        try:
            coord.replace_namespaced_lease(lease, NS, held)
            break
        except client.ApiException as exc:
            if exc.status != 409 or time.monotonic() > deadline:
                raise
    assert third.proc is not None
    deadline = time.monotonic() + 60  # its next renewal, a retry away, then a clean exit: slow on a loaded machine
    while third.proc.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert third.proc.popen.poll() == 1, third.proc.tail(20)
    assert "lost the lease" in third.proc.tail(20) and _labelled(core, exts) == []  # it removed its own label


def _placed(name: str, index: int) -> dict[str, object]:
    """A pod bound with our assignment on it, as the leader's bind leaves it (its node need not exist: a learning
    policy learns the pod's shape, not where it runs)."""
    node = "learn-node"
    slice_ = ann.DeviceSlice(f"GPU-{node}-{index}", index, 40960, 50)
    assignment = ann.Assignment(node=node, containers=(ann.ContainerAssignment("c", (slice_,)),))
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}
    return {
        "metadata": {
            "name": name,
            "annotations": {
                ann.POD_ASSIGNMENT: ann.encode_assignment(assignment),
                ann.POD_BIND_PHASE: ann.BindPhase.ALLOCATED.value,
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


def _learned(ext: Extender) -> float:
    """vgpu_extender_learning_seeded_pods_total: running pods fed to learning from a list or the watch."""
    for line in ext.probe("/metrics").decode().splitlines():
        if line.startswith("vgpu_extender_learning_seeded_pods_total "):
            return float(line.split()[1])
    raise AssertionError("no vgpu_extender_learning_seeded_pods_total on /metrics")


def _wait_learned(ext: Extender, want: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while (got := _learned(ext)) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def test_a_standby_learns_the_leaders_pods_from_its_watch_and_takes_over_without_learning_them_again(
    replicas: tuple[ControlPlane, str, list[Extender]], namespace: str
) -> None:
    cp, _lease, exts = replicas
    core = client.CoreV1Api(cp.api_client())
    for e in exts:
        e.start()
    leader, _ = _wait_one_leader(exts, timeout=60)
    standby = next(e for e in exts if e is not leader)
    # Its first list seeds learning in the background once it is ready (other modules' pods included): count from
    # after that, so only this test's pods move the count.
    assert standby.proc is not None
    deadline = time.monotonic() + 60
    while "learning seeded from running pods" not in standby.proc.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, standby.proc.tail(20)
        time.sleep(0.2)
    before = _learned(standby)
    names = [f"placed-{i}" for i in range(4)]
    try:
        for i, name in enumerate(names[:3]):
            core.create_namespaced_pod(namespace, _placed(name, i))
        assert _wait_learned(standby, before + 3, timeout=60) == before + 3  # from its own pod watch

        leader.kill()  # no release: the standby waits out the lease, then leads with what its watch taught it
        new, _ = _wait_one_leader(exts, timeout=LEASE_S * 3)
        assert new is standby
        core.create_namespaced_pod(namespace, _placed(names[3], 3))  # a pod after the takeover: learned once
        assert _wait_learned(standby, before + 4, timeout=60) == before + 4
        time.sleep(RETRY_S * 4)  # nothing else arrives late: none of the four is learned twice
        assert _learned(standby) == before + 4
    finally:  # bound to a node no later module has: never left for another module's extender to hold
        for name in names:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
