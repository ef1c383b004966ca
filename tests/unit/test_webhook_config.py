"""Webhook settings: precedence, errors that name the source, and every setting reaching the object that uses it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kube_vgpu_dev.processes import free_port as _free_port
from vgpu import logs
from webhook import certs
from webhook.admission import Settings, decide
from webhook.config import ConfigError, WebhookConfig, problems
from webhook.config_load import SCHEMA, from_document, load
from webhook.inventory import NodeAnnotationInventory, NoInventory
from webhook.main import build_server, make_inventory, serve
from webhook.review import AdmissionRequest
from webhook.testing import make_review


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "webhook.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_are_valid() -> None:
    assert problems(WebhookConfig()) == []
    assert load(argv=[], environ={}) == WebhookConfig()


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "version: v1\nlisten: {port: 9000}\nscheduler: {name: from-file, overrideDefaultScheduler: false}\n"
        "logging: {format: json}\n",
    )
    env = {"VGPU_WEBHOOK_CONFIG": path, "VGPU_WEBHOOK_SCHEDULER_NAME": "from-env", "VGPU_WEBHOOK_PORT": "9001"}
    cfg = load(argv=["--port", "9002"], environ=env)
    assert cfg.port == 9002  # flag
    assert cfg.scheduler_name == "from-env"  # env over file
    assert cfg.override_default_scheduler is False and cfg.log_format == "json"  # file over defaults
    assert cfg.cert_file == WebhookConfig().cert_file  # default


@pytest.mark.parametrize(
    ("argv", "env", "doc", "message"),
    [
        (["--port", "0"], {}, None, "port: 0 is outside 1..65535 (flag --port)"),
        (
            [],
            {"VGPU_WEBHOOK_PORT": "x"},
            None,
            "port = 'x' from env VGPU_WEBHOOK_PORT: Input should be a valid integer",
        ),
        (
            [],
            {"VGPU_WEBHOOK_OVERRIDE_DEFAULT_SCHEDULER": "maybe"},
            None,
            "from env VGPU_WEBHOOK_OVERRIDE_DEFAULT_SCHED",
        ),
        ([], {"VGPU_WEBHOOK_PROT": "1"}, None, "unknown environment variables VGPU_WEBHOOK_PROT; known: "),
        ([], {}, "version: v2\n", "'version' must be 'v1'"),
        ([], {}, "version: v1\nlisten: {prot: 1}\n", "unknown key listen.prot (known: host, port)"),
        ([], {}, "version: v1\nextras: {}\n", "unknown key extras (known: "),
        ([], {}, "version: v1\nlisten: {port: high}\n", "port = 'high' from file "),
        ([], {}, "version: v1\nlogging: {format: xml}\n", "allowed: text, json"),
        (["--inventory-source", "static"], {}, None, "needs max_gpu_memory_mib"),
        (["--default-cores", "150"], {}, None, "default_cores: '150' must be 'proportional' or an integer 0..100"),
        (["--scheduler-name", "Not_A_Name"], {}, None, "DNS subdomain (flag --scheduler-name)"),
        (["--resource-memory", "nvidia.com/gpu"], {}, None, "distinct"),
    ],
)
def test_invalid_settings_are_refused_with_a_reason(
    tmp_path: Path, argv: list[str], env: dict[str, str], doc: str | None, message: str
) -> None:
    if doc is not None:
        argv = [*argv, "--config", _file(tmp_path, doc)]
    with pytest.raises(ConfigError) as info:
        load(argv=argv, environ=env)
    assert message in str(info.value)


def test_a_bad_flag_value_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load(argv=["--port", "x"])
    assert info.value.code == 2 and "argument --port: invalid int value: 'x'" in capsys.readouterr().err


def test_kubernetes_service_links_are_not_settings() -> None:
    """The kubelet injects VGPU_WEBHOOK_PORT=tcp://... etc. for the vgpu-webhook Service (enableServiceLinks)."""
    links = {
        "VGPU_WEBHOOK_SERVICE_HOST": "10.96.0.12",
        "VGPU_WEBHOOK_SERVICE_PORT": "443",
        "VGPU_WEBHOOK_SERVICE_PORT_HTTPS": "443",
        "VGPU_WEBHOOK_PORT": "tcp://10.96.0.12:443",
        "VGPU_WEBHOOK_PORT_443_TCP": "tcp://10.96.0.12:443",
        "VGPU_WEBHOOK_PORT_443_TCP_PROTO": "tcp",
        "VGPU_WEBHOOK_PORT_443_TCP_PORT": "443",
        "VGPU_WEBHOOK_PORT_443_TCP_ADDR": "10.96.0.12",
    }
    assert load(argv=[], environ=links) == WebhookConfig()
    assert load(argv=[], environ={**links, "VGPU_WEBHOOK_PORT": "9443"}).port == 9443


def test_help_describes_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.main import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for s in SCHEMA.settings():
        assert s.description and "".join(s.description.split()) in "".join(out.split()), s.name
        assert s.flag in out
    assert "(default: 8443; env VGPU_WEBHOOK_PORT; file listen.port)" in out
    assert "Precedence: flags > environment > file > defaults" in out


def test_request_defaults_and_names_flow_into_the_core() -> None:
    cfg = load(argv=["--default-cores", "30", "--resource-count", "example.com/vgpu"], environ={})
    assert cfg.request_defaults().cores == 30
    assert cfg.resource_names().count == "example.com/vgpu"
    assert from_document({"version": "v1", "defaults": {"cores": 0}})["default_cores"] == 0
    assert load(argv=[], environ={"VGPU_WEBHOOK_DEFAULT_CORES": "0"}).default_cores == "0"


# --------------------------------------------------------------------------------------------------------------
# every setting, given as a flag, an env variable or a file key, reaches the object that uses it


class Rig:
    """Builds what `vgpu-webhook serve` builds from a config, and stops it again."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.pki = certs.write_dev_certs(tmp_path / "pki")
        self.stops: list[Callable[[], None]] = []

    def server(self, cfg: WebhookConfig) -> Any:
        srv = build_server(cfg, NoInventory(), CollectorRegistry())
        self.stops += [srv.tls.stop, srv.sock.close]
        return srv

    def inventory(self, cfg: WebhookConfig) -> Any:
        inv = make_inventory(cfg)
        if isinstance(inv, NodeAnnotationInventory):
            self.stops.append(inv.stop)
        return inv

    def reloads_within(self, cfg: WebhookConfig, seconds: float) -> bool:
        srv = self.server(cfg)
        time.sleep(0.05)
        certs.write_dev_certs(self.tmp_path / "pki")  # a renewed certificate, new mtimes
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if srv.tls.reloads:
                return True
            time.sleep(0.02)
        return False

    def logging_after_serve(self, cfg: WebhookConfig) -> tuple[str, str]:
        """serve() configures logging first; with no certificate it then stops (exit 2) before serving."""
        assert serve(cfg.model_copy(update={"cert_file": str(self.tmp_path / "absent.crt")})) == 2
        root = logging.getLogger()
        fmt = "json" if isinstance(root.handlers[0].formatter, logs.JsonFormatter) else "text"
        return logging.getLevelName(root.level).lower(), fmt


def _vllm_flag(settings: Settings) -> object:
    """The memory flag `decide` adds to a vLLM pod on a 20000 MiB slice (no inventory: only `slice` can size it)."""
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": [],
                    "resources": {"limits": {"nvidia.com/gpumem": "20000"}},
                }
            ]
        },
    }
    request = AdmissionRequest.model_validate(make_review(pod)["request"])
    ops = decide(request, settings, None).ops
    return next((op["value"] for op in ops if op["path"].endswith("/args/-")), None)


def _kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return str(path)


# setting -> (value as text, other settings it needs, probe of the consuming object, what the probe must see).
# A value "{tmp}/..." is a path in the test's folder; "{port}" a free TCP port.
Probe = Callable[[Rig, WebhookConfig], object]
CASES: dict[str, tuple[str, dict[str, str], Probe, object]] = {
    "host": ("127.0.0.1", {}, lambda r, c: r.server(c).sock.getsockname()[0], "127.0.0.1"),
    "port": ("{port}", {}, lambda r, c: r.server(c).sock.getsockname()[1], "{port}"),
    "cert_file": ("{tmp}/pki/tls.crt", {}, lambda r, c: str(r.server(c).tls.cert_file), "{tmp}/pki/tls.crt"),
    "key_file": ("{tmp}/pki/tls.key", {}, lambda r, c: str(r.server(c).tls.key_file), "{tmp}/pki/tls.key"),
    "cert_reload_interval": ("0.1", {}, lambda r, c: r.reloads_within(c, 30.0), True),
    "scheduler_name": ("gpu-sched", {}, lambda r, c: Settings.from_config(c).scheduler_name, "gpu-sched"),
    "override_default_scheduler": (
        "false",
        {},
        lambda r, c: Settings.from_config(c).override_default_scheduler,
        False,
    ),
    "apply_default_count": ("false", {}, lambda r, c: Settings.from_config(c).apply_default_count, False),
    "strip_stale_annotations": ("false", {}, lambda r, c: Settings.from_config(c).strip_stale_annotations, False),
    "model_server_sizing": (
        "slice",
        {},
        lambda r, c: _vllm_flag(Settings.from_config(c)),
        "--gpu-memory-utilization=0.9488",
    ),
    "resource_count": ("example.com/vgpu", {}, lambda r, c: Settings.from_config(c).names.count, "example.com/vgpu"),
    "resource_memory": ("example.com/vmem", {}, lambda r, c: Settings.from_config(c).names.memory, "example.com/vmem"),
    "resource_memory_percentage": (
        "example.com/vmem-pct",
        {},
        lambda r, c: Settings.from_config(c).names.memory_percentage,
        "example.com/vmem-pct",
    ),
    "resource_cores": (
        "example.com/vcores",
        {},
        lambda r, c: Settings.from_config(c).names.cores,
        "example.com/vcores",
    ),
    "resource_priority": (
        "example.com/prio",
        {},
        lambda r, c: Settings.from_config(c).names.priority,
        "example.com/prio",
    ),
    "default_count": ("3", {}, lambda r, c: Settings.from_config(c).defaults.count, 3),
    "max_body_bytes": ("70000", {}, lambda r, c: r.server(c).server.config.app.state.max_body, 70000),
    "request_read_timeout_seconds": ("2.5", {}, lambda r, c: r.server(c).server.config.http.read_timeout, 2.5),
    "max_connections": ("7", {}, lambda r, c: r.server(c).server.config.limit_concurrency, 7),
    "max_json_values": ("5000", {}, lambda r, c: r.server(c).server.config.app.state.max_values, 5000),
    "default_memory_percentage": ("40", {}, lambda r, c: Settings.from_config(c).defaults.memory_percentage, 40),
    "default_cores": ("25", {}, lambda r, c: Settings.from_config(c).defaults.cores, 25),
    "default_priority": ("0", {}, lambda r, c: Settings.from_config(c).defaults.priority, 0),
    "inventory_source": ("none", {}, lambda r, c: type(r.inventory(c)).__name__, "NoInventory"),
    "max_gpu_memory_mib": (
        "81920",
        {"inventory_source": "static", "max_gpus_per_node": "8"},
        lambda r, c: r.inventory(c).summary().max_gpu_memory_mib,
        81920,
    ),
    "max_gpus_per_node": (
        "4",
        {"inventory_source": "static", "max_gpu_memory_mib": "1024"},
        lambda r, c: r.inventory(c).summary().max_gpus_per_node,
        4,
    ),
    "kubeconfig": (
        "{tmp}/kubeconfig",
        {"inventory_source": "nodes"},
        lambda r, c: r.inventory(c)._api.api_client.configuration.host,
        "https://127.0.0.1:1",
    ),
    "log_format": ("json", {}, lambda r, c: r.logging_after_serve(c)[1], "json"),
    "log_level": ("warning", {}, lambda r, c: r.logging_after_serve(c)[0], "warning"),
}


def test_the_table_covers_every_setting() -> None:
    assert set(CASES) == {s.name for s in SCHEMA.settings()}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    r = Rig(tmp_path)
    yield r
    for stop in r.stops:
        stop()
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("source", ["flag", "env", "file"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_setting_reaches_its_user(rig: Rig, tmp_path: Path, name: str, source: str) -> None:
    raw, needs, probe, expected = CASES[name]
    port = str(_free_port())

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{port}", port)

    by_name = {s.name: s for s in SCHEMA.settings()}
    # the rest of the config (certificates, other settings the case needs) always comes as flags
    base = {
        "cert_file": str(rig.pki.cert),
        "key_file": str(rig.pki.key),
        "host": "127.0.0.1",
        "port": str(_free_port()),
        **needs,
    }
    base.pop(name, None)
    _kubeconfig(tmp_path)
    argv = [a for k, v in base.items() for a in (by_name[k].flag, v)]
    env: dict[str, str] = {}
    value = fill(raw)
    s = by_name[name]
    if source == "flag":
        argv += [s.flag, value]
    elif source == "env":
        env[s.env] = value
    else:
        section, key = s.file_key.split(".")
        argv += ["--config", _file(tmp_path, f"version: v1\n{section}:\n  {key}: {value}\n")]
    cfg = load(argv=argv, environ=env)
    want = int(port) if expected == "{port}" else fill(expected) if isinstance(expected, str) else expected
    assert probe(rig, cfg) == want
