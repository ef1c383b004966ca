"""The runtime priority over real gRPC with a test kubelet: a high- (online class) and a low-priority (batch
class) pod get CUDA_TASK_PRIORITY 0 / 1 when HAMi-core is provided, CUDA_MPS_CLIENT_PRIORITY 0 / 1 under MPS, and
neither in plain mode; a batch pod whose container says nvidia.com/priority 0 is high."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from device_plugin.envs import HAMI_TASK_PRIORITY_ENV, MPS_CLIENT_PRIORITY_ENV
from device_plugin.pods import PodRecord
from device_plugin.testing.workload import placed_pods
from tests.integration.test_device_plugin_mps_grpc import NODE, Rig, _rig
from tests.mps_fake import cleanup, fake_paths

ONLINE, BATCH = 100000, 100  # PriorityClass values; the plugin's default online_priority_min is 1000


def _pod(r: Rig, i: int, priority: int, hami: str | None = None) -> PodRecord:
    """Placed pod i with spec.priority (as the apiserver resolves priorityClassName) and, optionally, the
    container's own nvidia.com/priority."""
    placed = placed_pods(r.plugin.gpus, 6, 7, node=NODE, max_containers=1, max_count=1)[i]
    containers: list[dict[str, Any]] = placed.containers()
    if hami is not None:
        containers[0]["resources"]["limits"]["nvidia.com/priority"] = hami
    record = dataclasses.replace(
        placed.record(namespace="llm", node=NODE, bind_time=f"2026-01-01T00:00:{i:02d}Z"),
        spec={"spec": {"priority": priority, "containers": containers}},
    )
    r.pods.add(record)
    return record


@pytest.fixture(params=["hami-core", "mps", "plain"])
def rig(request: pytest.FixtureRequest) -> Iterator[tuple[str, Rig]]:
    mode = str(request.param)
    root = Path(tempfile.mkdtemp(prefix="rp"))  # short: Unix socket paths are limited to 108 bytes
    r = _rig(root, mps=mode == "mps", hami=mode == "hami-core")
    try:
        assert r.kubelet.wait(lambda: len(r.kubelet.state.devices) == 20 and r.healthy() == {"Healthy"}, timeout=60)
        yield mode, r
    finally:
        r.plugin.stop()
        r.kubelet.stop()
        cleanup(fake_paths(root))
        shutil.rmtree(root, ignore_errors=True)


def test_online_and_batch_pods_get_the_priority_env_of_the_mode(rig: tuple[str, Rig]) -> None:
    mode, r = rig
    online = r.admit(_pod(r, 0, ONLINE)).envs
    batch = r.admit(_pod(r, 1, BATCH)).envs
    batch_says_high = r.admit(_pod(r, 2, BATCH, hami="0")).envs
    online_says_low = r.admit(_pod(r, 3, ONLINE, hami="1")).envs
    got = [(e.get(HAMI_TASK_PRIORITY_ENV), e.get(MPS_CLIENT_PRIORITY_ENV)) for e in (online, batch)]
    said = [(e.get(HAMI_TASK_PRIORITY_ENV), e.get(MPS_CLIENT_PRIORITY_ENV)) for e in (online_says_low, batch_says_high)]
    expected = {
        "hami-core": [("0", None), ("1", None)],
        "mps": [(None, "0"), (None, "1")],
        "plain": [(None, None), (None, None)],
    }[mode]
    assert got == expected, (mode, got)
    # The container's own word lowers an online pod; a batch pod saying "high" stays low (tenant-written).
    assert said == [expected[1], expected[1]], (mode, said)
    assert all("CUDA_DEVICE_MEMORY_LIMIT_0" in e for e in (online, batch))  # the rest of the slice is unchanged
