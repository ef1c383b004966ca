"""gRPC side: a thin DevicePlugin servicer over DeviceManager, and the socket/registration lifecycle.

The kubelet deletes every socket in its device-plugins folder when it restarts and recreates kubelet.sock
(k8s.io/kubernetes v1.34.4 pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go: server.Start calls
CleanupPluginDirectory, ../manager.go, which removes every socket but keeps the checkpoint, then listens on
kubelet.sock); PluginServer.watch() notices either (polling every 0.5 s) and re-serves + re-registers.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import NoReturn

import grpc

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from device_plugin.envs import ContainerSlice
from device_plugin.health import HealthBoard
from device_plugin.manager import AllocationError, DeviceManager, Replica
from device_plugin.status_text import trimmed

log = logging.getLogger(__name__)
VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# The kubelet follows one ListAndWatch stream (two briefly around a re-registration); each stream holds a
# worker thread for its life, so more are refused rather than let them starve Allocate of workers.
MAX_WATCHERS = 4


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """Connection and message limits of the plugin's gRPC server (docs/device-plugin.md, "Limits").

    Channel-argument names and meanings: grpc/grpc include/grpc/impl/channel_arg_names.h (grpc 1.85). The
    kubelet (grpc-go) answers server pings whatever its own keepalive settings; its connection is never idle
    because it always has ListAndWatch open, so max idle only closes other, forgotten connections.
    """

    workers: int = 16
    keepalive_s: float = 60.0  # ping a connection silent this long ...
    keepalive_timeout_s: float = 20.0  # ... and close it if the ping is not answered within this
    max_idle_s: float = 300.0  # GOAWAY to a connection without an RPC for this long
    max_message_bytes: int = 1 << 20  # larger requests are refused (RESOURCE_EXHAUSTED) before parsing

    def options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", int(self.max_idle_s * 1000)),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            # a client pinging more often than every 10 s without data gets GOAWAY (ping flood)
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ]

    @property
    def max_concurrent_rpcs(self) -> int:
        """RPCs beyond this are answered RESOURCE_EXHAUSTED at once instead of queueing without bound."""
        return self.workers * 4


def device_pb(r: Replica, *, numa: bool = True) -> pb.Device:
    """`numa`: send the replica's NUMA node (TopologyInfo); without it the kubelet's device manager has no
    topology preference and offers every free replica (docs/device-plugin.md, "Topology Manager agreement")."""
    topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=r.numa)]) if numa and r.numa is not None else None
    return pb.Device(ID=r.id, health=HEALTHY if r.healthy else UNHEALTHY, topology=topo)


def response_pb(s: ContainerSlice) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=s.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in s.mounts
        ],
        annotations=s.annotations,
    )


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """Abort with `message` cut to what the status trailer carries (the whole of it is logged)."""
    short = trimmed(message)
    if short != message:
        log.warning("full text of a trimmed %s status (%d chars): %s", code.name, len(message), message)
    context.abort(code, short)
    raise AssertionError("context.abort returned")  # it raises; for the type checker


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """Maps the manager's answers to gRPC; an unexpected exception is logged and answered INTERNAL with a
    trimmed message (the fuzz tests assert it never happens)."""

    def __init__(
        self,
        manager: DeviceManager,
        board: HealthBoard,
        stop: threading.Event,
        *,
        max_watchers: int = MAX_WATCHERS,
        advertise_numa: bool = True,
    ) -> None:
        self.manager = manager
        self.advertise_numa = advertise_numa
        self.board = board
        self.stop = stop
        self.max_watchers = max_watchers
        self.watching = 0  # ListAndWatch streams open now
        self._count = threading.Lock()

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        """Send the device list now and again on every health change, until the stream or server ends."""
        with self._count:
            full = self.watching >= self.max_watchers
            if not full:
                self.watching += 1
        if full:
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"at most {self.max_watchers} ListAndWatch streams")
        context.add_callback(self.board.poke)  # a cancelled stream wakes its wait at once and ends
        try:
            last: list[pb.Device] | None = None
            seen = self.board.version
            while not self.stop.is_set() and context.is_active():
                devices = [device_pb(r, numa=self.advertise_numa) for r in self.manager.devices()]
                if devices != last:
                    last = devices
                    yield pb.ListAndWatchResponse(devices=devices)
                seen = self.board.wait_change(seen, timeout=1.0)
        finally:
            with self._count:
                self.watching -= 1

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        try:
            return pb.PreferredAllocationResponse(
                container_responses=[
                    pb.ContainerPreferredAllocationResponse(
                        deviceIDs=self.manager.preferred(
                            list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
                        )
                    )
                    for r in request.container_requests
                ]
            )
        except Exception as exc:
            log.exception("GetPreferredAllocation")
            _abort(context, grpc.StatusCode.INTERNAL, f"vGPU GetPreferredAllocation failed: {exc!r}")

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        try:
            slices = self.manager.allocate([list(r.devices_ids) for r in request.container_requests])
        except AllocationError as exc:
            log.warning("%s", trimmed(str(exc)))
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:
            log.exception("Allocate")
            _abort(context, grpc.StatusCode.INTERNAL, f"vGPU Allocate failed: {exc!r}")
        return pb.AllocateResponse(container_responses=[response_pb(s) for s in slices])

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


@dataclass(frozen=True, slots=True)
class SocketPaths:
    plugin_dir: str
    socket_name: str = "vgpu.sock"
    kubelet_socket_name: str = "kubelet.sock"

    @property
    def plugin(self) -> str:
        return os.path.join(self.plugin_dir, self.socket_name)

    @property
    def kubelet(self) -> str:
        return os.path.join(self.plugin_dir, self.kubelet_socket_name)


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class PluginServer:
    """Serves DevicePlugin on its socket, then registers with the kubelet; restarts both on kubelet restart."""

    def __init__(
        self,
        manager: DeviceManager,
        board: HealthBoard,
        paths: SocketPaths,
        *,
        resource: str,
        limits: GrpcLimits = GrpcLimits(),
        advertise_numa: bool = True,
    ) -> None:
        self.manager = manager
        self.advertise_numa = advertise_numa
        self.board = board
        self.paths = paths
        self.resource = resource
        self.limits = limits
        self._server: grpc.Server | None = None
        self.servicer: DevicePluginServicer | None = None
        self._serving_stop = threading.Event()
        self._kubelet_inode: int | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.registrations = 0

    def serve(self) -> None:
        if os.path.exists(self.paths.plugin):
            os.unlink(self.paths.plugin)
        self._serving_stop = threading.Event()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.limits.workers, thread_name_prefix="dp-grpc"),
            options=self.limits.options(),
            maximum_concurrent_rpcs=self.limits.max_concurrent_rpcs,
        )
        self.servicer = DevicePluginServicer(
            self.manager, self.board, self._serving_stop, advertise_numa=self.advertise_numa
        )
        pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix://{self.paths.plugin}")
        server.start()
        self._server = server
        log.info("serving %s on %s", self.resource, self.paths.plugin)

    def register(self, timeout_s: float = 5.0) -> None:
        """Register with the kubelet (which then dials our socket); raises grpc.RpcError on failure."""
        self._kubelet_inode = _inode(self.paths.kubelet)
        with grpc.insecure_channel(f"unix://{self.paths.kubelet}") as channel:
            pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=VERSION,
                    endpoint=self.paths.socket_name,
                    resource_name=self.resource,
                    options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
                ),
                timeout=timeout_s,
            )
        self.registrations += 1
        log.info("registered %s with the kubelet at %s", self.resource, self.paths.kubelet)

    def stop_serving(self) -> None:
        self._serving_stop.set()
        self.board.poke()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(2.0)
            self._server = None

    def restart(self) -> None:
        self.stop_serving()
        self.serve()
        try:
            self.register()
        except grpc.RpcError as exc:
            log.warning("register failed (%s); retrying", exc.code() if hasattr(exc, "code") else exc)
            self._kubelet_inode = None

    def needs_restart(self) -> bool:
        """Our socket gone (kubelet cleaned the folder) or kubelet.sock replaced / newly present."""
        kubelet = _inode(self.paths.kubelet)
        if kubelet is None:
            return False  # kubelet down: wait for it to come back
        return not os.path.exists(self.paths.plugin) or kubelet != self._kubelet_inode

    def watch(self, interval_s: float = 0.5) -> None:
        while not self._stop.wait(interval_s):
            try:
                if self.needs_restart():
                    log.warning("kubelet restart detected: re-serving and re-registering")
                    self.restart()
            except Exception:
                log.exception("socket watch")

    def start(self) -> None:
        """Serve, try to register (the watcher retries until the kubelet is there), start watching."""
        self.serve()
        try:
            self.register()
        except grpc.RpcError:
            log.warning("kubelet not reachable at %s yet; will register when it appears", self.paths.kubelet)
            self._kubelet_inode = None
        self._watcher = threading.Thread(target=self.watch, name="kubelet-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self.stop_serving()
        if os.path.exists(self.paths.plugin):
            os.unlink(self.paths.plugin)
