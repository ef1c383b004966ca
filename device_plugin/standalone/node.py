"""The standalone node: the watchdog and the router feed on a host outside Kubernetes (Slurm, Ray, bare metal).

No apiserver, no kubelet: the endpoints come from a local file (device_plugin.standalone.endpoints), re-read
when it changes; GPU processes are attributed to endpoints by PID, cgroup or GPU; enforcement only logs and
counts (there is nothing to evict through); the same EPP feed and node exporter are served on the host
address, and this host's llm-d file-discovery file is kept up to date for `vgpu discovery merge`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from device_plugin.nvml.backend import NvmlBackend
from device_plugin.nvml.discovery import discover
from device_plugin.pods import PodRecord
from device_plugin.standalone.endpoints import Endpoint, EndpointsError, cgroup_of, owner, parse, pod_records
from device_plugin.telemetry.discovery_file import DiscoveryFileWriter
from device_plugin.telemetry.epp import epp_registry
from device_plugin.telemetry.exporter import node_registry
from device_plugin.telemetry.serve import MetricsServer, serve
from device_plugin.watchdog.actions import Enforcer
from device_plugin.watchdog.cgroup import CgroupResolver, ContainerRef
from device_plugin.watchdog.ladder import LadderConfig, Step
from device_plugin.watchdog.sampling import NvmlSampler
from device_plugin.watchdog.watchdog import Watchdog
from vgpu.devices import GpuDevice

log = logging.getLogger(__name__)


@dataclass
class EndpointsFile:
    """The endpoints file as the watchdog's pod source: re-parsed when its mtime or size changes; a bad edit
    is logged and the last good endpoints are kept (a typo must not drop every endpoint from the feed)."""

    path: Path
    node: str
    gpus: tuple[GpuDevice, ...]
    endpoints: tuple[Endpoint, ...] = ()
    stamp: tuple[int, int] | None = None
    changed: threading.Event = field(default_factory=threading.Event)

    def load(self) -> tuple[Endpoint, ...]:
        """Read and check the file now; EndpointsError/OSError on a bad one (used at start: fail loudly)."""
        st = self.path.stat()
        doc = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        try:
            eps = parse(doc, self.gpus)
        except EndpointsError as exc:
            raise EndpointsError(f"{self.path}: {exc}") from None
        if eps != self.endpoints:
            self.changed.set()
        self.endpoints, self.stamp = eps, (st.st_mtime_ns, st.st_size)
        return eps

    def list_node_pods(self, *, node: str) -> list[PodRecord]:
        try:
            st = self.path.stat()
            if (st.st_mtime_ns, st.st_size) != self.stamp:
                self.load()
                log.info("standalone: %s reloaded, %d endpoints", self.path, len(self.endpoints))
        except (OSError, yaml.YAMLError, EndpointsError) as exc:
            log.error("standalone: %s: %s (keeping the last good endpoints)", self.path, exc)
        return pod_records(self.endpoints, node)

    def patch_pod_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        return  # no apiserver: nothing to annotate

    def patch_node_annotations(self, *, node: str, annotations: Mapping[str, str | None]) -> None:
        return


class EndpointResolver(CgroupResolver):
    """PID -> the endpoint that owns it (the watchdog's resolver): by PID, by cgroup under proc_root, else by GPU."""

    def __init__(self, source: EndpointsFile, proc_root: str) -> None:
        super().__init__(proc_root)
        self.source = source

    def resolve(self, pid: int) -> ContainerRef | None:
        try:
            cgroup = cgroup_of((self.proc_root / str(pid) / "cgroup").read_text())
        except OSError:
            cgroup = ""  # exited, or another PID namespace: PID and GPU attribution still work
        return owner(self.source.endpoints, pid, cgroup)


@dataclass
class StandaloneNode:
    watchdog: Watchdog
    source: EndpointsFile
    servers: list[MetricsServer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _refs_reset: threading.Thread | None = None

    def start(self, *, host: str, epp_port: int, metrics_port: int, timeout_s: float, max_connections: int) -> None:
        self.watchdog.start()
        for port, registry in (
            (epp_port, epp_registry(self.watchdog.snapshot)),
            (metrics_port, node_registry(self.watchdog.snapshot)),
        ):
            if port:
                self.servers.append(
                    serve(
                        registry,
                        host=host,
                        port=port,
                        timeout_s=timeout_s,
                        max_connections=max_connections,
                        version=self.watchdog.snapshot,
                    )
                )
        self._refs_reset = threading.Thread(target=self._forget_on_change, name="endpoints-changed", daemon=True)
        self._refs_reset.start()

    def _forget_on_change(self) -> None:
        """A changed file may move a PID to another endpoint: drop the watchdog's PID cache so it re-resolves."""
        while not self._stop.is_set():
            if self.source.changed.wait(0.5):
                self.source.changed.clear()
                self.watchdog.refs.clear()

    def stop(self) -> None:
        self._stop.set()
        for s in self.servers:
            s.close()
        self.watchdog.stop()


def build(
    *,
    nvml: NvmlBackend,
    endpoints: str,
    node: str,
    is_nvml_error: type[Exception],
    proc_root: str = "/proc",
    discovery_file: str = "",
    interval_s: float = 1.0,
    refresh_s: float = 5.0,
) -> StandaloneNode:
    """Everything but the threads; EndpointsError/OSError when the endpoints file is missing or wrong."""
    gpus, handles = discover(nvml, split_count=1, is_nvml_error=lambda e: isinstance(e, is_nvml_error))
    source = EndpointsFile(Path(endpoints), node, gpus)
    source.load()

    def port_of(pod: PodRecord) -> str:  # the model server's port, from the current endpoints
        return next((e.port for e in source.endpoints if (e.namespace, e.name) == (pod.namespace, pod.name)), "")

    watchdog = Watchdog(
        node=node,
        gpus=gpus,
        sampler=NvmlSampler(nvml, handles),
        pods=source,
        resolver=EndpointResolver(source, proc_root),
        enforcer=Enforcer(None, dry_run=True),  # nothing to evict through: violations are logged and counted
        ladder=LadderConfig(steps=(Step.EVENT,)),
        limiter=None,
        interval_s=interval_s,
        pods_refresh_s=refresh_s,
        after_cycle=DiscoveryFileWriter(discovery_file, port=port_of) if discovery_file else None,
    )
    return StandaloneNode(watchdog=watchdog, source=source)


def default_node_name() -> str:
    return os.uname().nodename
