"""Entry point `vgpu-standalone-node`: settings, NVML (real or a fake scenario), the node, run until signalled."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

import yaml

from device_plugin.nvml import real
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.nvml.discovery import DiscoveryError
from device_plugin.standalone import config as cfg
from device_plugin.standalone.endpoints import EndpointsError
from device_plugin.standalone.node import build, default_node_name
from vgpu import logs
from vgpu.settings import SettingsError

PROG = "vgpu-standalone-node"


def _nvml(fake_scenario: str) -> NvmlBackend:
    if fake_scenario:
        from device_plugin.testing.fake_nvml import FakeNvml  # demo/test mode only, chosen explicitly

        return FakeNvml.from_file(fake_scenario, clock=time.monotonic)
    return real.load()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        conf = cfg.load(sys.argv[1:] if argv is None else argv, os.environ)
    except (SettingsError, ValueError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    logs.configure(conf.log_level, conf.log_format)
    try:
        node = build(
            nvml=_nvml(conf.fake_nvml),
            endpoints=conf.endpoints,
            node=conf.node_name or default_node_name(),
            is_nvml_error=real.NVMLError,
            proc_root=conf.proc_root,
            discovery_file=conf.discovery_file,
            interval_s=conf.interval_s,
            refresh_s=conf.refresh_s,
        )
    except (EndpointsError, DiscoveryError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError) as exc:
        print(f"{PROG}: endpoints file {conf.endpoints}: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        node.start(
            host=conf.host,
            epp_port=conf.epp_port,
            metrics_port=conf.metrics_port,
            timeout_s=conf.http_timeout_s,
            max_connections=conf.http_max_connections,
        )
    except OSError as exc:
        print(f"{PROG}: cannot listen on {conf.host}: {exc}", file=sys.stderr)
        node.stop()
        return 2
    print(f"{PROG}: {len(node.source.endpoints)} endpoints, feed on {conf.host}:{conf.epp_port}", flush=True)
    done.wait()
    node.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
