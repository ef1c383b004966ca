"""The deadline of the request being served, carried to the apiserver calls it makes (as Go's context.Context).

/bind sets one (`within`), derived from kube-scheduler's extender httpTimeout and, with leader election, from how
long the lease is still ours; `scheduler_extender.kube` turns what is left into each call's `_request_timeout`, so
no call outlives the request that made it. Outside a deadline, calls get their own default timeout.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_until: ContextVar[float | None] = ContextVar("vgpu_deadline", default=None)

# The shortest timeout handed to a call: below this the call cannot finish, so it is not started.
MIN_CALL_S = 0.05


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed before (or while) an apiserver call could be made."""


@contextlib.contextmanager
def within(until: float) -> Iterator[None]:
    """Run the block under an absolute deadline (on time.monotonic); an enclosing, earlier deadline still wins."""
    outer = _until.get()
    token = _until.set(until if outer is None else min(outer, until))
    try:
        yield
    finally:
        _until.reset(token)


def remaining(default_s: float, *, clock: Callable[[], float] = time.monotonic) -> float:
    """The timeout for the next call: what is left of the deadline (at most `default_s`), or `default_s` without
    one. Raises DeadlineExceeded when too little is left to make a call at all."""
    until = _until.get()
    if until is None:
        return default_s
    left = until - clock()
    if left < MIN_CALL_S:
        raise DeadlineExceeded(f"deadline passed {max(0.0, -left):.3f} s ago; the call was not made")
    return min(default_s, left)


def current() -> float | None:
    """The absolute deadline in force, if any."""
    return _until.get()
