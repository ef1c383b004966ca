"""The extender's threads carry their Python names for the kernel, so benchmarks/scale.py can split its CPU by thread."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from pathlib import Path

import pytest

from scheduler_extender.threadnames import name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_NAME) is Linux's")


def _comm() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def test_a_thread_takes_its_python_name_cut_to_fifteen_bytes() -> None:
    seen: list[tuple[bool, str]] = []

    def run() -> None:
        seen.append((name_os_thread(), _comm()))

    t = threading.Thread(target=run, name="reflector-pods-and-more")
    t.start()
    t.join()
    assert seen == [(True, "reflector-pods-")]


def test_pool_workers_named_by_the_initializer() -> None:
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="verb", initializer=name_os_thread) as pool:
        names = set(pool.map(lambda _: _comm(), range(8)))
    assert names and all(n.startswith("verb_") for n in names), names
