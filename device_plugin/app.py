"""Assembles the plugin from its parts (NVML backend, pod source, kubelet view are handed in)."""

from __future__ import annotations

import logging
import threading

from device_plugin.config import PluginConfig
from device_plugin.envs import EnvSettings
from device_plugin.health import HealthBoard, HealthMonitor
from device_plugin.inventory import InventoryPublisher
from device_plugin.manager import DeviceManager
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.nvml.discovery import DiscoveryError, discover
from device_plugin.pods import KubeletPods, PodSource
from device_plugin.server import PluginServer, SocketPaths
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
        self.manager = DeviceManager(
            node=config.node_name,
            resource=config.resource_name,
            gpus=gpus,
            board=self.board,
            pods=pods,
            kubelet=kubelet,
            settings=EnvSettings(mps=config.mps, cache_dir_on_host=config.cache_dir_on_host),
            retry_s=config.allocate_retry_s,
        )
        self.publisher = InventoryPublisher(
            node=config.node_name, gpus=gpus, board=self.board, pods=pods, refresh_s=config.inventory_refresh_s
        )
        self.server = PluginServer(
            self.manager,
            self.board,
            SocketPaths(config.plugin_dir, config.socket_name),
            resource=config.resource_name,
        )
        self._stop = threading.Event()
        self._reconciler: threading.Thread | None = None

    def _reconcile_loop(self) -> None:
        while True:
            try:
                self.manager.reconcile()
            except Exception as exc:
                log.warning("reconcile: %s", exc)
            if self._stop.wait(self.config.reconcile_s):
                return

    def start(self) -> None:
        self.monitor.start()
        self.manager.start()
        self.publisher.start()
        self.server.start()
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        self._reconciler.start()

    def stop(self) -> None:
        self._stop.set()
        self.server.stop()
        self.publisher.stop()
        self.monitor.stop()
        self.manager.stop()
        if self._reconciler is not None:
            self._reconciler.join(timeout=5)
