"""Device plugin settings: precedence, errors naming the source, and every setting reaching the object that uses it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from device_plugin import main as dp_main
from device_plugin.app import Plugin
from device_plugin.config import SCHEMA, PluginConfig, load
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.pods import MemoryPods
from kube_vgpu_dev.processes import free_port as _free_port
from vgpu import kubelet_topology as kt
from vgpu import logs
from vgpu.settings import SettingsError

SCENARIO = Path(__file__).resolve().parents[1] / "data" / "nvml" / "h100x8.yaml"


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nnode_name: from-file\nsplit_count: 4\nmps: true\n")
    env = {"VGPU_DP_SPLIT_COUNT": "6", "NODE_NAME": "from-env"}
    c = load(["--config", str(f), "--node-name", "from-flag"], env)
    assert (c.node_name, c.split_count, c.mps) == ("from-flag", 6, True)
    assert load(["--config", str(f)], env).node_name == "from-env"  # NODE_NAME (downward API) over the file
    assert load(["--config", str(f)], {**env, "VGPU_DP_NODE_NAME": "prefixed"}).node_name == "prefixed"
    assert load([], {"VGPU_DP_CONFIG": str(f)}).split_count == 4


@pytest.mark.parametrize(
    ("doc", "err"),
    [
        ("version: v2\n", "version"),
        ("version: v1\nbogus: 1\n", "unknown key bogus"),
        ("version: v1\n", "node_name is required"),
        ("version: v1\nnode_name: n\nsplit_count: many\n", "split_count = 'many' from file "),
        ("version: v1\nnode_name: n\nmps: maybe\n", "mps = 'maybe' from file "),
        ("version: v1\nnode_name: n\nlog_level: loud\n", "allowed: debug, info, warning, error"),
    ],
)
def test_bad_files_are_rejected(tmp_path: Path, doc: str, err: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(doc)
    with pytest.raises(ValueError) as info:
        load(["--config", str(f)], {})
    assert err in str(info.value)


@pytest.mark.parametrize(
    ("argv", "env", "err"),
    [
        (["--split-count", "0"], {}, "split_count must be 1..100, got 0 (flag --split-count)"),
        ([], {"VGPU_DP_SPLIT_COUNT": "200"}, "split_count must be 1..100, got 200 (env VGPU_DP_SPLIT_COUNT)"),
        ([], {"VGPU_DP_MPS": "maybe"}, "mps = 'maybe' from env VGPU_DP_MPS"),
        ([], {"VGPU_DP_SPLITCOUNT": "2"}, "unknown environment variables VGPU_DP_SPLITCOUNT"),
        (["--enforcement-steps", "evict,event"], {}, "(flag --enforcement-steps)"),
        (["--epp-port", "9400"], {}, "dcgm-exporter's 9400"),
        (["--grpc-workers", "1"], {}, "grpc_workers must be 2..256, got 1 (flag --grpc-workers)"),
        ([], {"VGPU_DP_HTTP_TIMEOUT_S": "0"}, "http_timeout_s must be 0.5..300, got 0.0 (env VGPU_DP_HTTP_TIMEOUT_S)"),
        (["--hami-core-library", "libvgpu.so"], {}, "hami_core_library must be an absolute path without '..'"),
        (
            ["--mps-pipe-dir", "/run/../etc"],
            {},
            "mps_pipe_dir must be an absolute path without '..', got '/run/../etc'",
        ),
        (["--mps-control-binary", "a b"], {}, "mps_control_binary must be a path or name of nvidia-cuda-mps-control"),
        (["--mps-default-active-thread-percentage", "101"], {}, "must be 0..100, got 101"),
        (["--mps-probe-s", "0"], {}, "mps_probe_s must be 0.1..300"),
    ],
)
def test_bad_values_name_setting_value_and_source(argv: list[str], env: dict[str, str], err: str) -> None:
    with pytest.raises(SettingsError) as info:
        load(["--node-name", "n", *argv], env)
    assert err in str(info.value)


def test_help_describes_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load(["--help"], {})
    out = " ".join(capsys.readouterr().out.split())
    for s in SCHEMA.settings():
        assert s.description and "".join(s.description.split()) in "".join(out.split()), s.name
    assert "(default: 10; env VGPU_DP_SPLIT_COUNT; file split_count)" in out


# --------------------------------------------------------------------------------------------------------------
# every setting, given as a flag, an env variable or a file key, reaches the object that uses it


class Rig:
    def __init__(self, tmp_path: Path, argv: list[str], env: dict[str, str]) -> None:
        self.tmp_path, self.argv, self.env = tmp_path, argv, env
        self.plugins: list[Plugin] = []

    def plugin(self, c: PluginConfig) -> Plugin:
        # actions: any object stands in for the apiserver, so dry-run comes from the setting alone
        p = Plugin(
            c,
            nvml=FakeNvml.from_file(SCENARIO),
            pods=MemoryPods(),
            kubelet=None,
            is_nvml_error=real.NVMLError,
            actions=cast(Any, object()),
        )
        self.plugins.append(p)
        return p

    def watchdog(self, c: PluginConfig) -> Any:
        return self.plugin(c).watchdog

    def telemetry(self, c: PluginConfig) -> list[tuple[str, int]]:
        p = self.plugin(c)
        assert p.watchdog is not None
        p._start_telemetry(p.watchdog)
        return [(str(s.server.server_address[0]), s.port) for s in p.metrics_servers]

    def exporter(self, c: PluginConfig) -> Any:
        """The metrics exporter's HTTP server, started on a free port."""
        p = self.plugin(c.model_copy(update={"metrics_port": _free_port()}))
        assert p.watchdog is not None
        p._start_telemetry(p.watchdog)
        return p.metrics_servers[0].server

    def logging_after_main(self, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
        """main() configures logging right after loading; with no device-plugins folder it then exits 2."""
        for k, v in self.env.items():
            monkeypatch.setenv(k, v)
        assert dp_main.main([*self.argv, "--plugin-dir", str(self.tmp_path / "absent")]) == 2
        root = logging.getLogger()
        return logging.getLevelName(root.level).lower(), (
            "json" if isinstance(root.handlers[0].formatter, logs.JsonFormatter) else "text"
        )

    def stop(self) -> None:
        for p in self.plugins:
            for srv in p.metrics_servers:
                srv.close()


def _kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:2'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )


Probe = Callable[[Rig, PluginConfig, pytest.MonkeyPatch], object]
# setting -> (value as text, other settings it needs (flags), probe of the consuming object, what it must see).
CASES: dict[str, tuple[str, dict[str, str], Probe, object]] = {
    "node_name": ("gpu-7", {}, lambda r, c, m: (r.plugin(c).manager.node, r.plugin(c).publisher.node), ("gpu-7",) * 2),
    "resource_name": ("example.com/vgpu", {}, lambda r, c, m: r.plugin(c).server.resource, "example.com/vgpu"),
    "resource_memory": ("example.com/mem", {}, lambda r, c, m: r.plugin(c).manager.names.memory, "example.com/mem"),
    "resource_memory_percentage": (
        "example.com/pct",
        {},
        lambda r, c, m: r.plugin(c).manager.names.memory_percentage,
        "example.com/pct",
    ),
    "resource_cores": ("example.com/sm", {}, lambda r, c, m: r.plugin(c).manager.names.cores, "example.com/sm"),
    "resource_priority": ("example.com/p", {}, lambda r, c, m: r.plugin(c).manager.names.priority, "example.com/p"),
    "split_count": ("4", {}, lambda r, c, m: {g.split_count for g in r.plugin(c).gpus}, {4}),
    "plugin_dir": ("/run/dp", {}, lambda r, c, m: r.plugin(c).server.paths.plugin_dir, "/run/dp"),
    "socket_name": ("x.sock", {}, lambda r, c, m: r.plugin(c).server.paths.socket_name, "x.sock"),
    "pod_resources_socket": (
        "/run/pr.sock",
        {},
        lambda r, c, m: PodResourcesClient(c.pod_resources_socket).socket_path,
        "/run/pr.sock",
    ),
    "topology_manager_policy": (
        "single-numa-node",
        {"kubelet_config": "/nonexistent"},
        lambda r, c, m: r.plugin(c).publisher.kubelet,
        kt.NodePolicy("single-numa-node", numa_advertised=True, numa_nodes=(0, 1)),
    ),
    "topology_manager_scope": ("pod", {}, lambda r, c, m: r.plugin(c).topology.scope, "pod"),
    "kubelet_config": (
        "{tmp}/kubelet.yaml",
        {},
        lambda r, c, m: (
            Path(c.kubelet_config).write_text("topologyManagerPolicy: restricted\n"),
            r.plugin(c).topology.policy,
        )[1],
        "restricted",
    ),
    "numa_topology": (
        "never",
        {"topology_manager_policy": "single-numa-node"},
        lambda r, c, m: (r.plugin(c).server.advertise_numa, r.plugins[-1].publisher.kubelet),
        (False, kt.NodePolicy("single-numa-node", numa_advertised=False, numa_nodes=(0, 1))),
    ),
    "mps": ("true", {}, lambda r, c, m: r.plugin(c).manager.settings.mps, True),
    "mps_control_binary": (
        "/host/usr/bin/nvidia-cuda-mps-control",
        {"mps": "true"},
        lambda r, c, m: r.plugin(c).mps.control.paths.binary,
        "/host/usr/bin/nvidia-cuda-mps-control",
    ),
    "mps_pipe_dir": (
        "/run/m/p",
        {"mps": "true"},
        lambda r, c, m: (r.plugin(c).mps.control.paths.pipe_dir, r.plugin(c).manager.settings.mps_pipe_dir),
        ("/run/m/p",) * 2,
    ),
    "mps_log_dir": (
        "/run/m/l",
        {"mps": "true"},
        lambda r, c, m: (r.plugin(c).mps.control.paths.log_dir, r.plugin(c).manager.settings.mps_log_dir),
        ("/run/m/l",) * 2,
    ),
    "mps_shm_dir": (
        "/run/m/s",
        {"mps": "true"},
        lambda r, c, m: (r.plugin(c).mps.control.paths.shm_dir, r.plugin(c).manager.settings.mps_shm_dir),
        ("/run/m/s",) * 2,
    ),
    "mps_probe_s": ("2.5", {"mps": "true"}, lambda r, c, m: r.plugin(c).mps.settings.probe_interval_s, 2.5),
    "mps_backoff_max_s": ("30", {"mps": "true"}, lambda r, c, m: r.plugin(c).mps.settings.backoff_max_s, 30.0),
    "mps_default_active_thread_percentage": (
        "25",
        {"mps": "true"},
        lambda r, c, m: r.plugin(c).mps.settings.default_active_thread_percentage,
        25,
    ),
    "mps_default_pinned_mem_limit_mib": (
        "8192",
        {"mps": "true"},
        lambda r, c, m: r.plugin(c).mps.settings.default_pinned_mem_limit_mib,
        8192,
    ),
    "hami_core_library": (
        "/opt/hami/libvgpu.so",
        {},
        lambda r, c, m: r.plugin(c).manager.settings.hami_core_library,
        "/opt/hami/libvgpu.so",
    ),
    "hami_core_dir": (
        "/run/hc",
        {},
        lambda r, c, m: (
            r.plugin(c).manager.settings.hami_core_preload_file,
            r.plugin(c).manager.settings.hami_core_lock_dir,
        ),
        ("/run/hc/ld.so.preload", "/run/hc/vgpulock"),
    ),
    "online_priority_min": (
        "5000",
        {},
        lambda r, c, m: r.plugin(c).manager.settings.online_priority_min,
        5000,
    ),
    "cache_dir_on_host": (
        "/var/cache/v",
        {},
        lambda r, c, m: r.plugin(c).manager.settings.cache_dir_on_host,
        "/var/cache/v",
    ),
    "inventory_refresh_s": ("7.5", {}, lambda r, c, m: r.plugin(c).publisher.refresh_s, 7.5),
    "health_probe_s": ("2.5", {}, lambda r, c, m: r.plugin(c).monitor.probe_interval_s, 2.5),
    "xid_recovery_s": ("33", {}, lambda r, c, m: r.plugin(c).monitor.recovery_s, 33.0),
    "allocate_retry_s": ("4.5", {}, lambda r, c, m: r.plugin(c).manager.retry_s, 4.5),
    "reconcile_s": ("12", {}, lambda r, c, m: r.plugin(c).config.reconcile_s, 12.0),
    "grpc_workers": ("5", {}, lambda r, c, m: r.plugin(c).server.limits.workers, 5),
    "grpc_keepalive_s": ("30", {}, lambda r, c, m: r.plugin(c).server.limits.keepalive_s, 30.0),
    "grpc_max_idle_s": ("600", {}, lambda r, c, m: r.plugin(c).server.limits.max_idle_s, 600.0),
    "grpc_max_message_bytes": ("2097152", {}, lambda r, c, m: r.plugin(c).server.limits.max_message_bytes, 2 << 20),
    "http_timeout_s": ("3.5", {}, lambda r, c, m: r.exporter(c).timeout_s, 3.5),
    "http_max_connections": ("7", {}, lambda r, c, m: r.exporter(c).max_connections, 7),
    "watchdog": ("false", {}, lambda r, c, m: r.watchdog(c), None),
    "watchdog_interval_s": ("0.5", {}, lambda r, c, m: r.watchdog(c).interval_s, 0.5),
    "enforcement_steps": (
        "event,evict",
        {},
        lambda r, c, m: [s.name.lower() for s in r.watchdog(c).ladder.steps],
        ["event", "evict"],
    ),
    "enforcement_dry_run": ("true", {}, lambda r, c, m: r.watchdog(c).enforcer.dry_run, True),
    "sm_window_s": ("12", {}, lambda r, c, m: r.watchdog(c).ladder.sm_window_s, 12.0),
    "sm_tolerance": ("7", {}, lambda r, c, m: r.watchdog(c).ladder.sm_tolerance, 7.0),
    "escalate_after_s": ("9", {}, lambda r, c, m: r.watchdog(c).ladder.escalate_after_s, 9.0),
    "hard_memory_limits": ("false", {}, lambda r, c, m: r.watchdog(c).limiter.reason, "disabled"),
    "proc_root": ("/host/proc", {}, lambda r, c, m: str(r.watchdog(c).resolver.proc_root), "/host/proc"),
    "cgroup_root": ("/host/cg", {}, lambda r, c, m: r.watchdog(c).limiter.cgroup_root, "/host/cg"),
    "pods_refresh_s": ("3", {}, lambda r, c, m: r.watchdog(c).pods_refresh_s, 3.0),
    "metrics_port": (
        "{port}",
        {"epp_port": "0", "metrics_host": "127.0.0.1"},
        lambda r, c, m: r.telemetry(c),
        [("127.0.0.1", "{port}")],
    ),
    "epp_port": (
        "{port}",
        {"metrics_port": "0", "metrics_host": "127.0.0.1"},
        lambda r, c, m: r.telemetry(c),
        [("127.0.0.1", "{port}")],
    ),
    "metrics_host": ("127.0.0.1", {"metrics_port": "0", "epp_port": "0"}, lambda r, c, m: c.metrics_host, "127.0.0.1"),
    "discovery_file": ("/run/eps.yaml", {}, lambda r, c, m: str(r.watchdog(c).after_cycle.path), "/run/eps.yaml"),
    "discovery_port": (
        "8080",
        {"discovery_file": "/run/eps.yaml"},
        lambda r, c, m: r.watchdog(c).after_cycle.port,
        "8080",
    ),
    "fake_nvml": (str(SCENARIO), {}, lambda r, c, m: type(dp_main._nvml(c.fake_nvml)).__name__, "FakeNvml"),
    "kubeconfig": (
        "{tmp}/kubeconfig",
        {},
        lambda r, c, m: dp_main._api(c.kubeconfig).api_client.configuration.host,
        "https://127.0.0.1:2",
    ),
    "log_level": ("warning", {}, lambda r, c, m: r.logging_after_main(m)[0], "warning"),
    "log_format": ("json", {}, lambda r, c, m: r.logging_after_main(m)[1], "json"),
}


def test_the_table_covers_every_setting() -> None:
    assert set(CASES) == {s.name for s in SCHEMA.settings()}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("source", ["flag", "env", "file"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_setting_reaches_its_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_logging: None, name: str, source: str
) -> None:
    raw, needs, probe, expected = CASES[name]
    port = _free_port()
    _kubeconfig(tmp_path)
    by_name = {s.name: s for s in SCHEMA.settings()}
    base = {"node_name": "node-a", "metrics_port": "0", "epp_port": "0", **needs}
    base.pop(name, None)
    argv = [a for k, v in base.items() for a in (by_name[k].flag, v)]
    env: dict[str, str] = {}
    value = raw.replace("{tmp}", str(tmp_path)).replace("{port}", str(port))
    s = by_name[name]
    if source == "flag":
        argv += [s.flag, value]
    elif source == "env":
        env[s.env] = value
    else:
        (tmp_path / "dp.yaml").write_text(f"version: v1\n{s.file_key}: '{value}'\n")
        argv += ["--config", str(tmp_path / "dp.yaml")]
    rig = Rig(tmp_path, argv, env)
    try:
        seen = probe(rig, load(argv, env), monkeypatch)
    finally:
        rig.stop()
    if expected == [("127.0.0.1", "{port}")]:
        expected = [("127.0.0.1", port)]
    assert seen == expected


@pytest.mark.parametrize(
    ("argv", "err"),
    [
        (["--cache-dir-on-host", "relative/dir"], "absolute path"),
        (["--cache-dir-on-host", "/var/run/../../etc"], "without '..'"),
        (["--resource-memory", "nvidia.com/gpu"], "distinct"),
        (["--resource-cores", ""], "non-empty"),
    ],
)
def test_unsafe_cache_dir_and_clashing_request_names_are_rejected(argv: list[str], err: str) -> None:
    with pytest.raises(ValueError, match=err):
        load(["--node-name", "n", *argv], {})


def test_request_names_follow_the_extenders_settings() -> None:
    c = load(["--node-name", "n", "--resource-name", "example.com/vgpu", "--resource-memory", "example.com/mem"], {})
    names = c.resource_names()
    assert (names.count, names.memory, names.cores) == ("example.com/vgpu", "example.com/mem", "nvidia.com/gpucores")
