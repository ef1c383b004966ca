"""Turn what NVML reports into the GpuDevice inventory the extender schedules against."""

from __future__ import annotations

import logging
from collections.abc import Callable

from device_plugin.nvml.backend import NVML_FEATURE_ENABLED, NVML_NVLINK_MAX_LINKS, NvmlBackend
from vgpu.devices import GpuDevice

log = logging.getLogger(__name__)
MIB = 1024 * 1024


class DiscoveryError(RuntimeError):
    """NVML could not be initialised or enumerated (no driver, no library): the node advertises nothing."""


def _links(nvml: NvmlBackend, handle: object) -> list[str]:
    """Remote PCI bus ids of the GPU's active NVLinks; stops at the first link NVML rejects."""
    remotes: list[str] = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != NVML_FEATURE_ENABLED:
                continue
            remotes.append(_norm_bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except Exception:  # NVMLError_NotSupported / InvalidArgument past the last link
            break
    return remotes


def _norm_bus(bus: str | bytes) -> str:
    text = bus.decode() if isinstance(bus, bytes) else bus
    return text.upper()


def discover(
    nvml: NvmlBackend, *, split_count: int, cores: int = 100, is_nvml_error: Callable[[BaseException], bool]
) -> tuple[tuple[GpuDevice, ...], dict[str, object]]:
    """Enumerate GPUs: (devices, uuid -> NVML handle). A GPU whose identity cannot be read is skipped
    (logged); one whose details fail is advertised unhealthy so the extender stops placing on it."""
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        if is_nvml_error(exc):
            raise DiscoveryError(f"NVML unavailable: {exc}") from exc
        raise
    found: list[tuple[GpuDevice, str, list[str]]] = []
    handles: dict[str, object] = {}
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except Exception as exc:
            if not is_nvml_error(exc):
                raise
            log.warning("GPU %d skipped: cannot read its identity: %s", index, exc)
            continue
        handles[uuid] = handle
        try:
            model = nvml.nvmlDeviceGetName(handle)
            memory_mib = nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB
            bus = _norm_bus(nvml.nvmlDeviceGetPciInfo(handle).busId)
            healthy = True
        except Exception as exc:
            if not is_nvml_error(exc):
                raise
            log.warning("GPU %d (%s) advertised unhealthy: %s", index, uuid, exc)
            model, memory_mib, bus, healthy = "unknown", 1, "", False
        numa: int | None
        try:
            numa = nvml.nvmlDeviceGetNumaNodeId(handle)
            numa = numa if numa >= 0 else None
        except Exception:
            numa = None
        links = _links(nvml, handle) if healthy else []
        gpu = GpuDevice(
            uuid=uuid,
            index=index,
            model=model,
            memory_mib=max(int(memory_mib), 1),
            cores=cores,
            split_count=split_count,
            numa=numa,
            healthy=healthy,
        )
        found.append((gpu, bus, links))
    by_bus = {bus: gpu.uuid for gpu, bus, _ in found if bus}
    switched = {gpu.uuid for gpu, _, links in found if any(r not in by_bus for r in links)}
    devices: list[GpuDevice] = []
    for gpu, _, links in found:
        peers = {by_bus[r] for r in links if r in by_bus and by_bus[r] != gpu.uuid}
        if gpu.uuid in switched:  # NVSwitch fabric: every switched GPU reaches every other one
            peers |= switched - {gpu.uuid}
        devices.append(_with_peers(gpu, tuple(sorted(peers))))
    return tuple(devices), handles


def _with_peers(gpu: GpuDevice, peers: tuple[str, ...]) -> GpuDevice:
    return GpuDevice(
        uuid=gpu.uuid,
        index=gpu.index,
        model=gpu.model,
        memory_mib=gpu.memory_mib,
        cores=gpu.cores,
        split_count=gpu.split_count,
        numa=gpu.numa,
        healthy=gpu.healthy,
        nvlink_peers=peers,
    )
