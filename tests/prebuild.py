"""Build a cached tool once, before any test runs, for the conftests that need one (e2e control plane, helm).

A cold build takes minutes: done in `pytest_collection_finish` it is not counted against a test's timeout,
its progress is shown instead of captured, and it only happens when a selected test uses the fixture. The
error is returned, for the fixture to raise again, so that every test that needs the tool errors loudly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest


def uses_fixture(session: pytest.Session, name: str) -> bool:
    return any(name in getattr(item, "fixturenames", ()) for item in session.items)


def build_before_tests(
    session: pytest.Session, label: str, what: str, build: Callable[[], str]
) -> BaseException | None:
    """Run `build` (it returns where the tool is, to report) with capture off; its error, if any."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{label}: building/locating {what} (cached) ...")
    capman = session.config.pluginmanager.get_plugin("capturemanager")
    try:
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            where = build()
    except Exception as e:  # re-raised by the fixture
        return e
    if reporter is not None:
        reporter.write_line(f"{label}: {where}")
    return None
