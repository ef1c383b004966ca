"""Build a cached tool once, before any test runs, for the conftests that need one (e2e control plane, helm).

A cold build takes minutes: done in `pytest_collection_finish` it is not counted against a test's timeout,
its progress is shown instead of captured, and it only happens when a selected test uses the fixture. The
error is returned, for the fixture to raise again, so that every test that needs the tool errors loudly.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def cache_root() -> Path:
    """Where the hack/ scripts cache their builds (the same rule as theirs)."""
    return Path(os.environ.get("KUBE_VGPU_CACHE") or Path.home() / ".cache" / "kube-vgpu")


def uses_fixture(session: pytest.Session, name: str) -> bool:
    return any(name in getattr(item, "fixturenames", ()) for item in session.items)


def build_before_tests(
    session: pytest.Session, label: str, what: str, build: Callable[[], str]
) -> BaseException | None:
    """Run `build` (it returns where the tool is, to report) with capture off; its error, if any."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"{label}: {what}: taken from the cache {cache_root()} or built now, before any test starts "
            "(a first build takes minutes to tens of minutes on 2 cores; later runs reuse it) ..."
        )
    capman = session.config.pluginmanager.get_plugin("capturemanager")
    started = time.monotonic()
    try:
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            where = build()
    except Exception as e:  # re-raised by the fixture
        return e
    if reporter is not None:
        reporter.write_line(f"{label}: ready in {time.monotonic() - started:.0f} s: {where}")
    return None
