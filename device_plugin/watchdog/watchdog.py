"""The watchdog loop: every interval read NVML, attribute processes to slices, run each slice's ladder,
execute the actions, and publish a Snapshot that the Prometheus exporters and the EPP feed read."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from device_plugin.health import HealthBoard
from device_plugin.pods import PodRecord, PodSource
from device_plugin.watchdog.actions import Enforcer
from device_plugin.watchdog.cgroup import CgroupResolver, ContainerRef, host_cgroup_dir
from device_plugin.watchdog.hardlimit import HardLimiter
from device_plugin.watchdog.ladder import Kind, LadderConfig, Observation, SliceGuard
from device_plugin.watchdog.sampling import GpuReading, NvmlSampler
from device_plugin.watchdog.slices import Slice, SliceId, SliceIndex, node_slices
from vgpu.devices import GpuDevice

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SliceStatus:
    slice: Slice
    memory_used: int
    sm_used: float  # percent of the GPU
    processes: int
    saturation: float  # 0-100: SM use over the core quota (best effort: the GPU's utilisation)
    violations: frozenset[Kind]
    hard_limit: int | None


@dataclass(frozen=True, slots=True)
class GpuStatus:
    device: GpuDevice
    memory_total: int
    memory_used: int
    utilization: float  # percent
    healthy: bool
    sharers: int
    roles: tuple[tuple[str, int], ...]
    unattributed_memory: int  # bytes held by processes that belong to no slice of ours
    error: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    node: str
    gpus: tuple[GpuStatus, ...] = ()
    slices: tuple[SliceStatus, ...] = ()
    held: tuple[Slice, ...] = ()  # every slice of this node's pods, observed this cycle or not (the EPP feed)
    violations: dict[tuple[SliceId, str], int] = field(default_factory=dict)  # counters, per slice and kind
    actions: dict[tuple[SliceId, str, str], int] = field(default_factory=dict)  # per slice, step, outcome
    cycles: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    last_cycle_seconds: float = 0.0
    hard_limits_supported: bool = False
    hard_limits_reason: str = ""
    dry_run: bool = False


def saturation(sm_used: float, cores: int, gpu_utilization: float) -> float:
    """How full a slice is, 0-100: its SM use relative to its quota; a best-effort slice (no quota) is as full
    as its GPU. This is what the EPP feed publishes as DCGM_FI_DEV_GPU_UTIL."""
    if cores <= 0:
        return max(0.0, min(100.0, gpu_utilization))
    return max(0.0, min(100.0, 100.0 * sm_used / cores))


class Watchdog:
    def __init__(
        self,
        *,
        node: str,
        gpus: tuple[GpuDevice, ...],
        sampler: NvmlSampler,
        pods: PodSource,
        resolver: CgroupResolver,
        enforcer: Enforcer,
        ladder: LadderConfig,
        limiter: HardLimiter | None = None,
        board: HealthBoard | None = None,
        interval_s: float = 1.0,
        pods_refresh_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        after_cycle: Callable[[Sequence[PodRecord], Sequence[Slice]], None] | None = None,
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.sampler = sampler
        self.pods = pods
        self.resolver = resolver
        self.enforcer = enforcer
        self.ladder = ladder.validate()
        self.limiter = limiter
        self.board = board
        self.interval_s = interval_s
        self.pods_refresh_s = pods_refresh_s
        self.clock = clock
        self.after_cycle = after_cycle  # e.g. the file-discovery writer; its errors are logged, never raised
        self.guards: dict[SliceId, SliceGuard] = {}
        self.refs: dict[int, ContainerRef | None] = {}  # pid -> container (cached while the pid is on a GPU)
        self._pods: list[PodRecord] = []
        self._index = SliceIndex([], [])
        self._pods_at: float | None = None
        self._violations: dict[tuple[SliceId, str], int] = {}
        self._actions: dict[tuple[SliceId, str, str], int] = {}
        self._errors: dict[str, int] = {}
        self._cycles = 0
        self._lock = threading.Lock()
        self._snapshot = Snapshot(node=node, dry_run=enforcer.dry_run)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- reading ---------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def _count_error(self, kind: str) -> None:
        self._errors[kind] = self._errors.get(kind, 0) + 1

    def _refresh_pods(self, now: float, *, unknown_uid: bool) -> None:
        stale = self._pods_at is None or now - self._pods_at >= self.pods_refresh_s
        if not stale and not (unknown_uid and now - (self._pods_at or 0.0) >= min(2.0, self.pods_refresh_s)):
            return
        try:
            self._pods = self.pods.list_node_pods(node=self.node)
        except Exception as exc:
            self._count_error("pods")
            log.warning("watchdog: cannot list pods of %s: %s (keeping the last list)", self.node, exc)
        self._pods_at = now
        self._index = SliceIndex(node_slices(self._pods, self.node), self._pods)

    def _resolve(self, readings: list[GpuReading]) -> None:
        live = {p.pid for r in readings for p in r.processes}
        for pid in [p for p in self.refs if p not in live]:
            del self.refs[pid]
        for pid in live - self.refs.keys():
            self.refs[pid] = self.resolver.resolve(pid)

    # --- the cycle -------------------------------------------------------------------------------

    def cycle(self) -> Snapshot:
        """One watchdog pass; returns (and publishes) the new snapshot."""
        started = time.perf_counter()
        now = self.clock()
        readings = self.sampler.read()
        self._resolve(readings)
        unknown = any(r is not None and r.pod_uid not in self._index.pod_uids for r in self.refs.values())
        self._refresh_pods(now, unknown_uid=unknown)
        index = self._index
        mem: dict[SliceId, int] = dict.fromkeys(index.slices, 0)
        sm: dict[SliceId, float] = dict.fromkeys(index.slices, 0.0)
        nproc: dict[SliceId, int] = dict.fromkeys(index.slices, 0)
        caps: dict[SliceId, int] = {}
        unattributed: dict[str, int] = {}
        live_caps: set[tuple[str, str]] = set()
        for r in readings:
            if r.error:
                self._count_error("nvml")
            for p in r.processes:
                ref = self.refs.get(p.pid)
                s = index.attribute(ref, r.uuid)
                if s is None:
                    unattributed[r.uuid] = unattributed.get(r.uuid, 0) + p.memory_bytes
                    continue
                mem[s.id] += p.memory_bytes
                sm[s.id] += p.sm
                nproc[s.id] += 1
                if self.limiter is not None and ref is not None:
                    live_caps.add((host_cgroup_dir(ref, self.limiter.cgroup_root), s.id.uuid))
                    cap = self.limiter.apply(s, ref)
                    if cap is not None:
                        caps[s.id] = cap
        if self.limiter is not None:
            self.limiter.forget(live_caps)
        by_uuid = {r.uuid: r for r in readings}
        statuses = self._judge(index, by_uuid, mem, sm, nproc, caps, now)
        gpus = self._gpu_statuses(index, by_uuid, unattributed)
        self._cycles += 1
        snap = Snapshot(
            node=self.node,
            gpus=gpus,
            slices=statuses,
            held=tuple(sorted(index.slices.values(), key=lambda s: s.id)),
            violations={k: v for k, v in self._violations.items() if k[0] in index.slices},
            actions={k: v for k, v in self._actions.items() if k[0] in index.slices},
            cycles=self._cycles,
            errors=dict(self._errors),
            last_cycle_seconds=time.perf_counter() - started,
            hard_limits_supported=self.limiter is not None and self.limiter.supported,
            hard_limits_reason="disabled" if self.limiter is None else self.limiter.reason,
            dry_run=self.enforcer.dry_run,
        )
        with self._lock:
            self._snapshot = snap
        if self.after_cycle is not None:
            try:
                self.after_cycle(self._pods, list(index.slices.values()))
            except Exception as exc:
                self._count_error("after_cycle")
                log.warning("watchdog: post-cycle hook failed: %s", exc)
        return snap

    def _judge(
        self,
        index: SliceIndex,
        by_uuid: dict[str, GpuReading],
        mem: dict[SliceId, int],
        sm: dict[SliceId, float],
        nproc: dict[SliceId, int],
        caps: dict[SliceId, int],
        now: float,
    ) -> tuple[SliceStatus, ...]:
        for gone in [sid for sid in self.guards if sid not in index.slices]:
            del self.guards[gone]
        self.enforcer.new_cycle()
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        out: list[SliceStatus] = []
        for sid, s in sorted(index.slices.items()):
            reading = by_uuid.get(sid.uuid)
            if reading is None or reading.error:
                continue  # nothing observed this cycle: no verdict either way
            guard = self.guards.setdefault(sid, SliceGuard(self.ladder))
            before = guard.active
            actions = guard.observe(Observation(now, mem[sid], s.memory_limit, sm[sid], s.cores))
            for kind in guard.active - before:
                self._violations[(sid, kind.value)] = self._violations.get((sid, kind.value), 0) + 1
            for action in actions:
                outcome = self.enforcer.execute(s, action, now_iso=stamp)
                key = (sid, action.step.label, outcome)
                self._actions[key] = self._actions.get(key, 0) + 1
            out.append(
                SliceStatus(
                    slice=s,
                    memory_used=mem[sid],
                    sm_used=sm[sid],
                    processes=nproc[sid],
                    saturation=saturation(sm[sid], s.cores, reading.utilization),
                    violations=guard.active,
                    hard_limit=caps.get(sid),
                )
            )
        return tuple(out)

    def _gpu_statuses(
        self, index: SliceIndex, by_uuid: dict[str, GpuReading], unattributed: dict[str, int]
    ) -> tuple[GpuStatus, ...]:
        out: list[GpuStatus] = []
        for d in self.gpus:
            r = by_uuid.get(d.uuid, GpuReading(uuid=d.uuid, error="not read"))
            on_gpu = [s for s in index.slices.values() if s.id.uuid == d.uuid]
            roles: dict[str, int] = {}
            for s in on_gpu:
                roles[s.role] = roles.get(s.role, 0) + 1
            healthy = d.healthy and (self.board is None or self.board.get(d.uuid).healthy) and not r.error
            out.append(
                GpuStatus(
                    device=d,
                    memory_total=r.memory_total or d.memory_mib * 1024 * 1024,
                    memory_used=r.memory_used,
                    utilization=r.utilization,
                    healthy=healthy,
                    sharers=len(on_gpu),
                    roles=tuple(sorted(roles.items())),
                    unattributed_memory=unattributed.get(d.uuid, 0),
                    error=r.error,
                )
            )
        return tuple(out)

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except Exception as exc:  # the watchdog must outlive any single bad cycle
                self._count_error("cycle")
                log.exception("watchdog cycle failed: %s", exc)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
