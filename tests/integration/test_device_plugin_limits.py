"""Limits on the plugin's sockets: a refusal too long for a gRPC trailer arrives trimmed (not
RESOURCE_EXHAUSTED), the gRPC server refuses oversized requests, and the HTTP exporters close idle, trickling
and surplus connections while still answering scrapes."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, Counter

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from device_plugin.health import HealthBoard
from device_plugin.manager import DeviceManager
from device_plugin.pods import PodRecord
from device_plugin.server import GrpcLimits, PluginServer, SocketPaths
from device_plugin.status_text import MAX_STATUS_BYTES, encoded_len
from device_plugin.telemetry.serve import serve
from device_plugin.testing.pods import MemoryPods
from device_plugin.testing.workload import pod_uid
from vgpu import annotations as ann
from vgpu.devices import GpuDevice

NODE = "n1"
GPU = GpuDevice("GPU-00000000-1111-2222-3333-444444444444", 0, "H100", 81920)


@pytest.fixture
def stub() -> Iterator[pb_grpc.DevicePluginStub]:
    d = tempfile.mkdtemp(prefix="dpl")
    pods = MemoryPods()
    for i in range(200):  # 200 pods waiting, none known to a kubelet: "ambiguous" lists them all (~15 KB)
        a = ann.Assignment(NODE, (ann.ContainerAssignment("main", (ann.DeviceSlice(GPU.uuid, 0, 1024, 0),)),))
        pods.add(
            PodRecord("team", f"pod-{i:03d}", pod_uid(3, i), NODE, bind_phase=ann.BindPhase.ALLOCATING, assignment=a)
        )
    board = HealthBoard([GPU.uuid])
    manager = DeviceManager(
        node=NODE, resource="nvidia.com/gpu", gpus=(GPU,), board=board, pods=pods, kubelet=None, retry_s=0.0
    )
    server = PluginServer(
        manager, board, SocketPaths(d), resource="nvidia.com/gpu", limits=GrpcLimits(max_message_bytes=64 << 10)
    )
    server.serve()
    with grpc.insecure_channel(f"unix://{server.paths.plugin}") as channel:
        yield pb_grpc.DevicePluginStub(channel)
    server.stop_serving()
    shutil.rmtree(d, ignore_errors=True)


def test_a_refusal_over_the_trailer_limit_arrives_trimmed(stub: pb_grpc.DevicePluginStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"{GPU.uuid}::0"])]),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # not RESOURCE_EXHAUSTED
    details = str(info.value.details())
    assert details.startswith("vGPU Allocate refused: ambiguous: 200 pods may be in admission: team/pod-")
    assert encoded_len(details) <= MAX_STATUS_BYTES and details.endswith(" more bytes)")


def test_an_oversized_request_is_refused_before_parsing(stub: pb_grpc.DevicePluginStub) -> None:
    ids = [f"{GPU.uuid}::{i}" for i in range(2000)]  # ~100 KB > the 64 KiB limit set above
    with pytest.raises(grpc.RpcError) as info:
        stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids)]
            ),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.GetDevicePluginOptions(pb.Empty(), timeout=5).get_preferred_allocation_available


def _registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("vgpu_probe", "a metric to scrape", registry=r).inc()
    return r


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `s` (recv -> b"" or reset), None if still open after `seconds`."""
    t0 = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - t0


def _wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll `predicate` until it holds or `timeout` passes (generous: a loaded CI machine is slow, not wrong)."""
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


EXPORTER_DEADLINE_S = 3.0


def test_exporter_closes_idle_trickling_and_surplus_connections() -> None:
    """Every connection has EXPORTER_DEADLINE_S in all. Idle ones are closed at it, and so is one trickling a
    byte every 0.1 s - which a per-read timeout would keep open for as long as it trickles (22 s here); a fifth
    connection over the cap of 4 is refused; a scrape is answered after. The test waits on the server's
    counters and the sockets, never on a sleep being long enough."""
    srv = serve(_registry(), host="127.0.0.1", port=0, timeout_s=EXPORTER_DEADLINE_S, max_connections=4)
    server: Any = srv.server
    try:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
        trickle = socket.create_connection(("127.0.0.1", srv.port))
        assert _wait_for(lambda: server.active == 4), f"{server.active} of 4 connections taken"
        # refused unless the exporter took 3 s to accept it (then one of the four had expired and freed a slot)
        surplus = socket.create_connection(("127.0.0.1", srv.port))
        assert _closed_within(surplus, 30) is not None
        assert server.refused == 1, "a fifth connection was accepted over the cap of 4"
        request = b"GET /metrics HTTP/1.1\r\nX-Trickle: " + b"a" * 200  # never ends its headers
        closed_by_server = False
        for ch in request:
            try:
                trickle.send(bytes([ch]))
            except OSError:
                closed_by_server = True
                break
            if _closed_within(trickle, 0.1) is not None:  # the 0.1 s between bytes, watching for the close
                closed_by_server = True
                break
        assert closed_by_server, "a connection trickling a byte every 0.1 s outlived the deadline"
        for s in idle:
            assert _closed_within(s, 30) is not None
            s.close()
        # each counted before its socket closed: an expiry for the 3 idle and the trickling one, once each
        assert server.expired == 4 and server.refused == 1
        # a slot is freed a moment after the client sees the close (the handler thread ends then)
        assert _wait_for(lambda: server.active == 0), f"{server.active} connections still held"
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=30) as resp:
            assert b"vgpu_probe_total 1.0" in resp.read()
    finally:
        srv.close()


def test_exporter_answers_scrapes_while_slow_clients_hold_connections() -> None:
    """40 clients that connect and say nothing: scrapes are answered without waiting for them to expire (30 s
    here; the 10 s bound leaves room for a loaded 2-CPU CI machine and is still a third of it)."""
    srv = serve(_registry(), host="127.0.0.1", port=0, timeout_s=30.0, max_connections=64)
    slow = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(40)]
    try:
        with futures.ThreadPoolExecutor(4) as pool:
            took = list(pool.map(lambda _: _scrape(srv.port), range(20)))
        assert max(took) < 10.0, took
    finally:
        for s in slow:
            s.close()
        srv.close()


def _scrape(port: int) -> float:
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        resp.read()
    return time.monotonic() - t0
