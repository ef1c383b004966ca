"""Assembles the plugin from its parts (NVML backend, pod source, kubelet view are handed in)."""

from __future__ import annotations

import logging
import threading

from device_plugin import hami_core
from device_plugin.config import PluginConfig
from device_plugin.health import HealthBoard, HealthMonitor
from device_plugin.inventory import InventoryPublisher
from device_plugin.kubelet_config import node_policy
from device_plugin.manager import DeviceManager
from device_plugin.mps.control import MpsControl, MpsPaths
from device_plugin.mps.daemon import MpsDaemon, MpsDaemonSettings
from device_plugin.mps.metrics import MpsCollector
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.nvml.discovery import DiscoveryError, discover
from device_plugin.pods import KubeletPods, PodSource
from device_plugin.server import GrpcLimits, PluginServer, SocketPaths
from device_plugin.telemetry.discovery_file import DiscoveryFileWriter
from device_plugin.telemetry.epp import epp_registry
from device_plugin.telemetry.exporter import node_registry
from device_plugin.telemetry.serve import MetricsServer, serve
from device_plugin.watchdog.actions import Enforcer, KubeActions
from device_plugin.watchdog.cgroup import CgroupResolver
from device_plugin.watchdog.hardlimit import HardLimiter
from device_plugin.watchdog.ladder import LadderConfig, parse_steps
from device_plugin.watchdog.sampling import NvmlSampler
from device_plugin.watchdog.watchdog import Watchdog
from vgpu.devices import GpuDevice

log = logging.getLogger(__name__)


class Plugin:
    def __init__(
        self,
        config: PluginConfig,
        *,
        nvml: NvmlBackend,
        pods: PodSource,
        kubelet: KubeletPods | None,
        is_nvml_error: type[Exception],
        actions: KubeActions | None = None,
    ) -> None:
        self.config = config
        self.nvml = nvml
        handles: dict[str, object] = {}
        gpus: tuple[GpuDevice, ...] = ()
        try:
            gpus, handles = discover(
                nvml, split_count=config.split_count, is_nvml_error=lambda e: isinstance(e, is_nvml_error)
            )
        except DiscoveryError as exc:
            log.error("%s: advertising no GPUs", exc)
        self.gpus = gpus
        self.board = HealthBoard(g.uuid for g in gpus)
        self.monitor = HealthMonitor(
            nvml,
            self.board,
            handles,
            probe_interval_s=config.health_probe_s,
            recovery_s=config.xid_recovery_s,
        )
        # MPS first: its node condition is on the board before anything can serve an Allocate.
        self.mps = self._mps(handles) if config.mps else None
        self.manager = DeviceManager(
            node=config.node_name,
            resource=config.resource_name,
            gpus=gpus,
            board=self.board,
            pods=pods,
            kubelet=kubelet,
            settings=config.env_settings(),
            names=config.resource_names(),
            retry_s=config.allocate_retry_s,
        )
        self.topology = node_policy(
            policy=config.topology_manager_policy,
            scope=config.topology_manager_scope,
            kubelet_config=config.kubelet_config,
            numa=config.numa_topology,
            gpu_numa=(g.numa for g in gpus),
        )
        self.publisher = InventoryPublisher(
            node=config.node_name,
            gpus=gpus,
            board=self.board,
            pods=pods,
            refresh_s=config.inventory_refresh_s,
            kubelet=self.topology,
        )
        self.server = PluginServer(
            self.manager,
            self.board,
            SocketPaths(config.plugin_dir, config.socket_name),
            resource=config.resource_name,
            advertise_numa=self.topology.numa_advertised,
            limits=GrpcLimits(
                workers=config.grpc_workers,
                keepalive_s=config.grpc_keepalive_s,
                max_idle_s=config.grpc_max_idle_s,
                max_message_bytes=config.grpc_max_message_bytes,
            ),
        )
        self._stop = threading.Event()
        self._reconciler: threading.Thread | None = None
        self.watchdog = self._watchdog(handles, pods, actions) if config.watchdog else None
        self.metrics_servers: list[MetricsServer] = []

    def _mps(self, handles: dict[str, object]) -> MpsDaemon:
        c = self.config
        paths = MpsPaths(
            binary=c.mps_control_binary, pipe_dir=c.mps_pipe_dir, log_dir=c.mps_log_dir, shm_dir=c.mps_shm_dir
        )
        return MpsDaemon(
            MpsControl(paths),
            self.nvml,
            handles,
            self.board,
            MpsDaemonSettings(
                probe_interval_s=c.mps_probe_s,
                backoff_max_s=c.mps_backoff_max_s,
                default_active_thread_percentage=c.mps_default_active_thread_percentage,
                default_pinned_mem_limit_mib=c.mps_default_pinned_mem_limit_mib,
            ),
        )

    def _watchdog(self, handles: dict[str, object], pods: PodSource, actions: KubeActions | None) -> Watchdog:
        c = self.config
        if actions is None and not c.enforcement_dry_run:
            log.warning("watchdog: no apiserver actions available, enforcement runs in dry-run")
        ladder = LadderConfig(
            steps=parse_steps(c.enforcement_steps),
            sm_window_s=c.sm_window_s,
            sm_tolerance=c.sm_tolerance,
            escalate_after_s=c.escalate_after_s,
        )
        return Watchdog(
            node=c.node_name,
            gpus=self.gpus,
            sampler=NvmlSampler(self.nvml, handles),
            pods=pods,
            resolver=CgroupResolver(c.proc_root),
            enforcer=Enforcer(actions, dry_run=c.enforcement_dry_run),
            ladder=ladder,
            limiter=HardLimiter(self.nvml, handles, cgroup_root=c.cgroup_root, enabled=c.hard_memory_limits),
            board=self.board,
            interval_s=c.watchdog_interval_s,
            pods_refresh_s=c.pods_refresh_s,
            after_cycle=DiscoveryFileWriter(c.discovery_file, port=c.discovery_port) if c.discovery_file else None,
        )

    def _start_telemetry(self, watchdog: Watchdog) -> None:
        """Exporter and EPP feed on their own ports; a port that cannot be bound is logged, not fatal."""
        node = node_registry(watchdog.snapshot)
        if self.mps is not None:
            node.register(MpsCollector(self.mps.status, node=self.config.node_name))
        for port, registry in (
            (self.config.metrics_port, node),
            (self.config.epp_port, epp_registry(watchdog.snapshot)),
        ):
            if not port:
                continue
            try:
                self.metrics_servers.append(
                    serve(
                        registry,
                        host=self.config.metrics_host,
                        port=port,
                        timeout_s=self.config.http_timeout_s,
                        max_connections=self.config.http_max_connections,
                        version=watchdog.snapshot,  # rendered once per watchdog cycle, not per scrape
                    )
                )
            except OSError as exc:
                log.error("cannot serve metrics on %s:%d: %s", self.config.metrics_host, port, exc)

    def _reconcile_loop(self) -> None:
        while True:
            try:
                self.manager.reconcile()
            except Exception as exc:
                log.warning("reconcile: %s", exc)
            if self._stop.wait(self.config.reconcile_s):
                return

    def start(self) -> None:
        """OSError if the HAMi-core preload file cannot be written (an Allocate would mount a missing file)."""
        hami_core.install(self.manager.settings)
        if self.mps is not None:
            self.mps.start()
        self.monitor.start()
        self.manager.start()
        self.publisher.start()
        self.server.start()
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        self._reconciler.start()
        if self.watchdog is not None:
            self.watchdog.start()
            self._start_telemetry(self.watchdog)

    def stop(self) -> None:
        self._stop.set()
        for srv in self.metrics_servers:
            srv.close()
        self.metrics_servers.clear()
        if self.watchdog is not None:
            self.watchdog.stop()
        self.server.stop()
        self.publisher.stop()
        self.monitor.stop()
        self.manager.stop()
        if self.mps is not None:
            self.mps.stop()
        if self._reconciler is not None:
            self._reconciler.join(timeout=5)
