"""The enforcement decision, pure: per slice, observations in, actions out. No clock, no I/O.

A slice is in violation when
- memory: the memory its processes hold exceeds its limit (immediately: memory over the limit is taken from
  a neighbour right now), or
- SM: its SM use stays above its core quota (+ a tolerance) for `sm_window_s` without a break (short bursts
  are normal for time-sliced GPUs and are not violations). Best-effort slices (cores 0) have no SM quota.
While a violation lasts, the ladder climbs one step each `escalate_after_s`: the first configured step at
once, the next after the interval, ... and then repeats the last one each interval (an eviction refused
by a PodDisruptionBudget is retried; an event-only ladder keeps reminding). When every violation has cleared the slice
starts again from the bottom. Steps are ordered event < annotate < evict; every action is reported by the
executor (log + metric + Kubernetes Event), so even eviction is never silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class Step(IntEnum):
    EVENT = 1
    ANNOTATE = 2
    EVICT = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class Kind(StrEnum):
    MEMORY = "memory"
    SM = "sm"


def parse_steps(text: str) -> tuple[Step, ...]:
    """ "event,annotate,evict" -> steps; must be non-empty, known, unique and in ladder order."""
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    try:
        steps = tuple(Step[n.upper()] for n in names)
    except KeyError as exc:
        raise ValueError(f"unknown enforcement step {exc.args[0].lower()!r}; allowed: event, annotate, evict") from None
    if not steps:
        raise ValueError("the enforcement ladder needs at least one step (event)")
    if list(steps) != sorted(set(steps)):
        raise ValueError(f"enforcement steps must be unique and ordered event < annotate < evict, got {text!r}")
    return steps


@dataclass(frozen=True, slots=True)
class LadderConfig:
    steps: tuple[Step, ...] = (Step.EVENT, Step.ANNOTATE)
    sm_window_s: float = 30.0
    sm_tolerance: float = 5.0  # percentage points above the quota that never count
    memory_tolerance_bytes: int = 0
    escalate_after_s: float = 30.0

    def validate(self) -> LadderConfig:
        if not self.steps or list(self.steps) != sorted(set(self.steps)):
            raise ValueError("steps must be non-empty, unique and ordered")
        if self.sm_window_s < 0 or self.escalate_after_s < 0 or self.sm_tolerance < 0:
            raise ValueError("windows and tolerances must be >= 0")
        return self


@dataclass(frozen=True, slots=True)
class Observation:
    """One watchdog cycle's view of a slice. sm_used/cores in percent of the GPU's SMs."""

    at: float
    memory_used: int
    memory_limit: int
    sm_used: float
    cores: int


@dataclass(frozen=True, slots=True)
class Action:
    step: Step
    kinds: tuple[Kind, ...]
    reason: str


@dataclass(slots=True)
class SliceGuard:
    """The state machine of one slice."""

    config: LadderConfig
    sm_over_since: float | None = None
    violating_since: float | None = None
    level: int = 0  # how many ladder steps were emitted in the current violation
    last_step_at: float = 0.0
    active: frozenset[Kind] = field(default_factory=frozenset)

    def violations(self, obs: Observation) -> frozenset[Kind]:
        """Update the SM window and return the kinds violated at this observation."""
        kinds: set[Kind] = set()
        if obs.memory_used > obs.memory_limit + self.config.memory_tolerance_bytes:
            kinds.add(Kind.MEMORY)
        if obs.cores > 0 and obs.sm_used > obs.cores + self.config.sm_tolerance:
            if self.sm_over_since is None:
                self.sm_over_since = obs.at
            if obs.at - self.sm_over_since >= self.config.sm_window_s:
                kinds.add(Kind.SM)
        else:
            self.sm_over_since = None
        return frozenset(kinds)

    def observe(self, obs: Observation) -> list[Action]:
        kinds = self.violations(obs)
        self.active = kinds
        if not kinds:
            self.violating_since = None
            self.level = 0
            return []
        if self.violating_since is None:
            self.violating_since = obs.at
        steps = self.config.steps
        due = self.level == 0 or obs.at - self.last_step_at >= self.config.escalate_after_s
        if not due:
            return []
        step = steps[min(self.level, len(steps) - 1)]
        self.level = min(self.level + 1, len(steps))
        self.last_step_at = obs.at
        return [Action(step=step, kinds=tuple(sorted(kinds)), reason=_reason(kinds, obs))]


def _reason(kinds: frozenset[Kind], obs: Observation) -> str:
    mib = 1024 * 1024
    parts = []
    if Kind.MEMORY in kinds:
        parts.append(f"GPU memory {obs.memory_used // mib} MiB > limit {obs.memory_limit // mib} MiB")
    if Kind.SM in kinds:
        parts.append(f"SM use {obs.sm_used:.0f}% > quota {obs.cores}%")
    return "; ".join(parts)
