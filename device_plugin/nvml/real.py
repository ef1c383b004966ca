"""The real NVML backend: the only module that imports pynvml (package nvidia-ml-py).

pynvml loads libnvidia-ml lazily in nvmlInit, so importing this module works on machines without a GPU;
a missing driver surfaces as NVMLError_LibraryNotFound / DriverNotLoaded from nvmlInit.
"""

from __future__ import annotations

from typing import cast

import pynvml

from device_plugin.nvml.backend import NvmlBackend

NVMLError: type[Exception] = pynvml.NVMLError
NVML_ERROR_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT


def load() -> NvmlBackend:
    """The pynvml module itself is the backend: its functions match the Protocol by name and signature."""
    return cast(NvmlBackend, pynvml)


def error(code: int) -> Exception:
    """The pynvml exception for an NVML return code (NVMLError.__new__ picks the NVMLError_* subclass)."""
    return cast(Exception, pynvml.NVMLError(code))


def error_code(name: str) -> int:
    """NVML_ERROR_<name> as an int, e.g. error_code("GPU_IS_LOST")."""
    return int(getattr(pynvml, f"NVML_ERROR_{name}"))


def code_of(exc: BaseException) -> int | None:
    """The NVML return code of a pynvml exception, None for anything else."""
    return int(exc.value) if isinstance(exc, pynvml.NVMLError) else None


def memory_limits(namespace: str, soft: int, hard: int) -> object:
    """pynvml's nvmlSetMemoryLimits_v1_t for nvmlDeviceSetMemoryLimits_v1: nameSpace is the full path of the
    container's cgroup v2 directory, limits in bytes. Building the struct needs no driver."""
    return pynvml.c_nvmlSetMemoryLimits_v1_t(nameSpace=namespace.encode(), softLimit=soft, hardLimit=hard)
