"""Entry point `vgpu-device-plugin`: load config, pick the NVML backend, wire the plugin, run until signalled."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from device_plugin import config as cfg
from device_plugin import hami_core
from device_plugin.app import Plugin
from device_plugin.kube import KubePodSource
from device_plugin.nvml import real
from device_plugin.nvml.backend import NvmlBackend
from device_plugin.podresources import PodResourcesClient
from vgpu import logs
from vgpu.prerequisites import missing_path, no_kube_api

PROG = "vgpu-device-plugin"


def _api(kubeconfig: str) -> k8s.CoreV1Api:
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig)
    else:
        k8s_config.load_incluster_config()
    return k8s.CoreV1Api()


def _nvml(fake_scenario: str) -> NvmlBackend:
    if fake_scenario:
        from device_plugin.testing.fake_nvml import FakeNvml  # demo/test mode only, chosen explicitly

        # Wall time from start: the scenario's XIDs, errors and process timelines play out by themselves.
        return FakeNvml.from_file(fake_scenario, clock=time.monotonic)
    return real.load()


def _missing_prerequisite(conf: cfg.PluginConfig) -> str | None:
    """One line naming what this node lacks for the plugin to start, or None."""
    if conf.fake_nvml and not os.path.isfile(conf.fake_nvml):
        return missing_path(
            PROG, what="fake-NVML scenario", path=conf.fake_nvml, flag="--fake-nvml", env="VGPU_DP_FAKE_NVML"
        )
    if conf.hami_core_library and not os.path.isfile(conf.hami_core_library):
        return missing_path(
            PROG,
            what="HAMi-core library",
            path=conf.hami_core_library,
            flag="--hami-core-library",
            env="VGPU_DP_HAMI_CORE_LIBRARY",
            hint="it is a host path; the DaemonSet mounts it at the same path (chart: devicePlugin.hamiCore.library)",
        )
    if not os.path.isdir(conf.plugin_dir):
        return missing_path(
            PROG,
            what="kubelet device-plugins folder",
            path=conf.plugin_dir,
            flag="--plugin-dir",
            env="VGPU_DP_PLUGIN_DIR",
            hint="on a node the kubelet creates it; mount it into the plugin's pod",
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        conf = cfg.load(sys.argv[1:] if argv is None else argv, os.environ)
    except (ValueError, OSError) as exc:
        print(f"vgpu-device-plugin: {exc}", file=sys.stderr)
        return 2
    logs.configure(conf.log_level, conf.log_format)
    missing = _missing_prerequisite(conf)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    try:  # before anything serves: an Allocate would mount a preload file that is not there
        hami_core.install(conf.env_settings())
    except OSError as exc:
        print(
            f"{PROG}: cannot write HAMi-core's ld.so.preload under hami_core_dir {conf.hami_core_dir}: {exc}; "
            "pass a writable host folder with --hami-core-dir (env VGPU_DP_HAMI_CORE_DIR)",
            file=sys.stderr,
        )
        return 2
    try:
        api = _api(conf.kubeconfig)
    except k8s_config.ConfigException as exc:
        print(
            no_kube_api(
                PROG, kubeconfig=conf.kubeconfig, reason=str(exc), flag="--kubeconfig", env="VGPU_DP_KUBECONFIG"
            ),
            file=sys.stderr,
        )
        return 2
    pods = KubePodSource(api)
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
