"""Prometheus view of the MPS control daemon: is it up, how often it was started and lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from device_plugin.mps.daemon import MpsStatus


class MpsCollector(Collector):
    def __init__(self, source: Callable[[], MpsStatus], *, node: str) -> None:
        self.source = source
        self.node = node

    def collect(self) -> Iterator[Metric]:
        s = self.source()
        up = GaugeMetricFamily(
            "vgpu_mps_daemon_up",
            "1 while the node's MPS control daemon answers; reason says why not",
            labels=["Hostname", "reason"],
        )
        up.add_metric([self.node, s.reason[:160]], 1.0 if s.up else 0.0)
        restarts = CounterMetricFamily(
            "vgpu_mps_daemon_restarts", "MPS control daemon starts after the first", labels=["Hostname"]
        )
        restarts.add_metric([self.node], s.restarts)
        failures = CounterMetricFamily(
            "vgpu_mps_daemon_failures", "Failed MPS daemon starts and daemons lost", labels=["Hostname"]
        )
        failures.add_metric([self.node], s.failures)
        yield from (up, restarts, failures)
