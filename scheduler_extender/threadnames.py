"""The calling thread's Python name given to the kernel too, so `/proc/<pid>/task/<tid>/comm` says which thread it is.

CPython before 3.14 leaves every thread with the process's name, so splitting the extender's CPU by thread
(benchmarks/scale.py reads `/proc/<pid>/task/*/stat`) needed py-spy to tell the threads apart. The kernel keeps at
most 15 bytes (prctl(2), PR_SET_NAME); a platform without prctl keeps the process's name, which only the report reads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

_PR_SET_NAME = 15  # linux/prctl.h
_COMM_BYTES = 15  # TASK_COMM_LEN 16, less the terminating NUL


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def name_os_thread(name: str | None = None) -> bool:
    """Name the calling thread (its Python name by default) for the kernel; False where that is not possible."""
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is None:
        return False
    raw = (name or threading.current_thread().name).encode("ascii", "replace")[:_COMM_BYTES]
    return int(prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)) == 0
