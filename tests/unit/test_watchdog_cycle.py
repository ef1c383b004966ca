"""The watchdog on fake-NVML scenarios: attribution, violations, the escalation ladder, dry-run, hard caps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from device_plugin.testing.node_sim import RecordingKube, SimNode, build
from device_plugin.watchdog.actions import Enforcer
from device_plugin.watchdog.cgroup import CgroupResolver
from device_plugin.watchdog.hardlimit import HardLimiter
from device_plugin.watchdog.ladder import LadderConfig, Step
from device_plugin.watchdog.sampling import NvmlSampler
from device_plugin.watchdog.watchdog import Watchdog, saturation
from vgpu import annotations as ann

ALL = (Step.EVENT, Step.ANNOTATE, Step.EVICT)


def pod(
    name: str, gpu: int, mem: int, cores: int, timeline: list[dict[str, Any]], pid: int, role: str = "decode"
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": "serving",
        "role": role,
        "containers": [
            {
                "name": "vllm",
                "slices": [{"gpu": gpu, "memoryMiB": mem, "cores": cores}],
                "processes": [{"pid": pid, "gpu": gpu, "timeline": timeline}],
            }
        ],
    }


SCENARIO: dict[str, Any] = {
    "pods": [
        # over its 10 GiB memory from t=3 on
        pod(
            "mem-hog",
            0,
            10240,
            30,
            [{"t": 0, "memoryMiB": 8000, "sm": 20}, {"t": 3, "memoryMiB": 12000, "sm": 20}],
            5001,
        ),
        # over its 30 % SM quota from t=2 on, for good
        pod(
            "sm-hog", 1, 10240, 30, [{"t": 0, "memoryMiB": 4000, "sm": 20}, {"t": 2, "memoryMiB": 4000, "sm": 70}], 5002
        ),
        # a 3 s burst above quota, then back
        pod(
            "bursty",
            2,
            10240,
            30,
            [
                {"t": 0, "memoryMiB": 4000, "sm": 20},
                {"t": 2, "sm": 90, "memoryMiB": 4000},
                {"t": 5, "sm": 20, "memoryMiB": 4000},
            ],
            5003,
        ),
        # well-behaved prefill sharing GPU 0 with mem-hog
        pod("good", 0, 20480, 50, [{"t": 0, "memoryMiB": 15000, "sm": 45}], 5004, role="prefill"),
    ],
    "hostProcesses": [{"pid": 9001, "gpu": 0, "timeline": [{"t": 0, "memoryMiB": 512, "sm": 0}]}],
}


def make(
    tmp_path: Path,
    *,
    dry_run: bool = False,
    kube: RecordingKube | None = None,
    scenario: dict[str, Any] | None = None,
    steps: tuple[Step, ...] = ALL,
) -> tuple[SimNode, Watchdog, RecordingKube]:
    sim = build(scenario or SCENARIO, tmp_path / "proc")
    kube = kube if kube is not None else RecordingKube()
    wd = Watchdog(
        node=sim.node,
        gpus=sim.gpus,
        sampler=NvmlSampler(sim.nvml, sim.handles),
        pods=sim.pods,
        resolver=CgroupResolver(str(sim.proc_root)),
        enforcer=Enforcer(kube, dry_run=dry_run),
        ladder=LadderConfig(steps=steps, sm_window_s=5, sm_tolerance=5, escalate_after_s=4),
        limiter=HardLimiter(sim.nvml, sim.handles, cgroup_root="/sys/fs/cgroup"),
        clock=lambda: sim.nvml.now,
    )
    return sim, wd, kube


def run_for(sim: SimNode, wd: Watchdog, seconds: int) -> None:
    for _ in range(seconds):
        wd.cycle()
        sim.nvml.advance(1.0)


def steps_of(kube: RecordingKube, pod_name: str) -> list[str]:
    return [e["message"].rsplit("action: ", 1)[1] for e in kube.events if e["pod"] == f"serving/{pod_name}"]


def test_attribution_sums_per_slice_and_separates_foreign_memory(tmp_path: Path) -> None:
    _sim, wd, _ = make(tmp_path)
    snap = wd.cycle()
    by_pod = {s.slice.id.pod: s for s in snap.slices}
    assert by_pod["mem-hog"].memory_used == 8000 * 2**20 and by_pod["mem-hog"].processes == 1
    assert by_pod["good"].sm_used == 45.0
    gpu0 = snap.gpus[0]
    assert gpu0.unattributed_memory == 512 * 2**20  # the host daemon on GPU 0
    assert gpu0.sharers == 2 and dict(gpu0.roles) == {"decode": 1, "prefill": 1}
    assert snap.gpus[3].sharers == 0


def test_memory_and_sm_violations_escalate_in_order_and_a_burst_does_not(tmp_path: Path) -> None:
    sim, wd, kube = make(tmp_path)
    run_for(sim, wd, 20)
    # memory: immediately at t=3, then every 4 s one step up, then eviction repeated
    assert steps_of(kube, "mem-hog")[:4] == ["event", "annotate", "evict", "evict"]
    # SM: over from t=2, window 5 s -> first action at t=7, later than memory's
    assert steps_of(kube, "sm-hog")[:3] == ["event", "annotate", "evict"]
    assert steps_of(kube, "bursty") == [] and steps_of(kube, "good") == []
    assert kube.evictions[0] == "serving/mem-hog" and "serving/sm-hog" in kube.evictions
    # Each eviction names its pod's own UID (the precondition the webhook's eviction guard requires).
    uids = {s.slice.id.pod: s.slice.pod_uid for s in wd.snapshot().slices}
    assert kube.eviction_uids[0] == uids["mem-hog"] and len(set(uids.values())) == len(uids)
    assert [uids[e.split("/")[1]] for e in kube.evictions] == kube.eviction_uids
    (target, annotations) = kube.annotations[0]
    body = ann.decode_violation(annotations[ann.POD_VIOLATION] or "")
    assert target == "serving/mem-hog" and body.kinds == ("memory",) and body.container == "vllm"
    snap = wd.snapshot()
    kinds = {(sid.pod, kind) for (sid, kind) in snap.violations}
    assert kinds == {("mem-hog", "memory"), ("sm-hog", "sm")}
    assert snap.actions[(next(s.slice.id for s in snap.slices if s.slice.id.pod == "mem-hog"), "event", "done")] == 1


def test_sm_violation_starts_only_after_the_window(tmp_path: Path) -> None:
    sim, wd, kube = make(tmp_path)
    run_for(sim, wd, 7)  # t = 0..6: SM over since t=2, window 5 s not yet full
    assert steps_of(kube, "sm-hog") == []
    run_for(sim, wd, 1)  # t = 7
    assert steps_of(kube, "sm-hog") == ["event"]


def test_dry_run_changes_nothing_but_counts(tmp_path: Path) -> None:
    sim, wd, kube = make(tmp_path, dry_run=True)
    before = {k: v for k, v in sim.pods.pods.items()}
    run_for(sim, wd, 20)
    assert kube.events == [] and kube.annotations == [] and kube.evictions == []
    assert sim.pods.pods == before
    outcomes = {(sid.pod, step, outcome) for (sid, step, outcome) in wd.snapshot().actions}
    assert ("mem-hog", "evict", "dry-run") in outcomes and all(o == "dry-run" for _, _, o in outcomes)


def test_eviction_refused_by_a_pdb_is_reported_and_retried(tmp_path: Path) -> None:
    sim, wd, _kube = make(tmp_path, kube=RecordingKube(pdb_blocks=True))
    run_for(sim, wd, 20)
    blocked = {k: v for k, v in wd.snapshot().actions.items() if k[0].pod == "mem-hog" and k[1] == "evict"}
    assert sum(blocked.values()) >= 2 and all(k[2] == "blocked" for k in blocked)


def test_event_only_ladder_never_evicts(tmp_path: Path) -> None:
    sim, wd, kube = make(tmp_path, steps=(Step.EVENT,))
    run_for(sim, wd, 20)
    assert kube.evictions == [] and kube.annotations == []
    assert set(steps_of(kube, "mem-hog")) == {"event"}


def test_vanished_pod_drops_its_slices(tmp_path: Path) -> None:
    sim, wd, _ = make(tmp_path)
    wd.cycle()
    del sim.pods.pods["serving/good"]
    sim.nvml.advance(11)  # past pods_refresh_s
    snap = wd.cycle()
    assert "good" not in {s.slice.id.pod for s in snap.slices}


@pytest.mark.parametrize(
    ("driver", "support", "want_supported", "reason_part"),
    [
        ("550.54.15", "supported", False, "driver 550.54.15 < r615"),
        ("615.71.09", "unsupported", False, "NOT_SUPPORTED"),
        ("615.71.09", "supported", True, ""),
    ],
)
def test_hard_memory_limits(tmp_path: Path, driver: str, support: str, want_supported: bool, reason_part: str) -> None:
    sim, wd, _ = make(tmp_path, scenario={**SCENARIO, "driver": driver, "memoryLimits": support})
    snap = wd.cycle()
    assert snap.hard_limits_supported is want_supported
    assert reason_part in snap.hard_limits_reason
    capped = {s.slice.id.pod: s.hard_limit for s in snap.slices}
    if want_supported:
        assert capped["mem-hog"] == 10240 * 2**20
        dirs = {ns for (_, ns) in sim.nvml.memory_limits}
        assert len(sim.nvml.memory_limits) == 4 and all(d.startswith("/sys/fs/cgroup/kubepods.slice/") for d in dirs)
        assert set(sim.nvml.memory_limits.values()) >= {(10240 * 2**20, 10240 * 2**20)}
    else:
        assert set(capped.values()) == {None} and sim.nvml.memory_limits == {}


@pytest.mark.parametrize(
    ("sm", "cores", "gpu", "want"), [(15, 30, 80, 50.0), (60, 30, 80, 100.0), (0, 0, 40, 40.0), (5, 50, 0, 10.0)]
)
def test_saturation(sm: float, cores: int, gpu: float, want: float) -> None:
    assert saturation(sm, cores, gpu) == want


def test_nvml_error_on_a_gpu_gives_no_verdict_and_counts(tmp_path: Path) -> None:
    sim, wd, kube = make(tmp_path)
    sim.nvml.inject_error("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", gpu=0)
    run_for(sim, wd, 6)
    snap = wd.snapshot()
    assert steps_of(kube, "mem-hog") == []  # its GPU cannot be read: no verdict
    assert snap.errors["nvml"] >= 6 and snap.gpus[0].healthy is False
