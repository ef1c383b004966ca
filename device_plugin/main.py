"""Entry point `vgpu-device-plugin`: load config, pick the NVML backend, wire the plugin, run until signalled."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from device_plugin import config as cfg
from device_plugin.app import Plugin
from device_plugin.kube import KubePodSource
from device_plugin.nvml import real
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.podresources import PodResourcesClient
from vgpu import logs


def _api(kubeconfig: str) -> k8s.CoreV1Api:
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig)
    else:
        k8s_config.load_incluster_config()
    return k8s.CoreV1Api()


def _nvml(fake_scenario: str) -> NvmlBackend:
    if fake_scenario:
        from device_plugin.testing.fake_nvml import FakeNvml  # demo/test mode only, chosen explicitly

        return FakeNvml.from_file(fake_scenario)
    return real.load()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        conf = cfg.load(sys.argv[1:] if argv is None else argv, os.environ)
    except (ValueError, OSError) as exc:
        print(f"vgpu-device-plugin: {exc}", file=sys.stderr)
        return 2
    logs.configure(conf.log_level, conf.log_format)
    pods = KubePodSource(_api(conf.kubeconfig))
    plugin = Plugin(
        conf,
        nvml=_nvml(conf.fake_nvml),
        pods=pods,
        actions=pods,
        kubelet=PodResourcesClient(conf.pod_resources_socket),
        is_nvml_error=real.NVMLError,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    plugin.start()
    done.wait()
    plugin.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
