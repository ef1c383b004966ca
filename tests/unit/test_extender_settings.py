"""Extender settings: precedence, errors naming setting, value and source, and every setting reaching its user."""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu_dev.processes import free_port as _free_port
from scheduler_extender import kube, leadership, schema
from scheduler_extender import main as ext_main
from scheduler_extender.settings import PLACEMENT_SETTINGS, SCHEMA, ExtenderSettings, SettingsError, load
from scheduler_extender.sources.kube import KubeSource
from vgpu import logs
from webhook import certs  # tests only: any PEM pair will do


def test_defaults_are_the_documented_ones() -> None:
    s = load(flags={}, env={}, config_file=None)
    assert (s.port, s.source, s.node_policy, s.priority_mapping, s.bind_grace_seconds) == (
        8888,
        "kube",
        "default",
        "rank",
        30.0,
    )
    assert s.resource_names().memory == "nvidia.com/gpumem"


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    cfg = tmp_path / "extender.yaml"
    cfg.write_text("version: v1\nport: 1111\nnode_policy: spread\nresources: {memory: example.com/vmem}\n")
    env = {"VGPU_EXTENDER_PORT": "2222", "VGPU_EXTENDER_RESOURCES__CORES": "example.com/vcores"}
    s = load(flags={"port": None, "node_policy": "binpack"}, env=env, config_file=cfg)
    assert s.port == 2222 and s.node_policy == "binpack"
    assert s.resource_names().memory == "example.com/vmem" and s.resource_names().cores == "example.com/vcores"
    assert load(flags={"port": 3333}, env=env, config_file=cfg).port == 3333


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({"port": 0}, "port"),
        ({"node_policy": "tetris"}, "allowed: "),
        (
            {"node_policy": "fragaware-wg100", "source": "file", "cluster_file": "/c.yaml"},
            "benchmark experiment, not a production policy; allowed: bestfit, binpack, default",
        ),
        ({"source": "file"}, "needs cluster_file"),
        ({"tls_cert_file": "/x.pem"}, "go together"),
        ({"priority_mapping": "log"}, "priority_mapping"),
        ({"nonsense": 1}, "nonsense"),
        ({"apiserver_call_timeout_seconds": 0}, "apiserver_call_timeout_seconds"),
        ({"apiserver_list_timeout_seconds": 601}, "apiserver_list_timeout_seconds"),
        ({"watch_read_slack_seconds": "soon"}, "watch_read_slack_seconds"),
        (
            {"apiserver_call_timeout_seconds": 2, "apiserver_connect_timeout_seconds": 5},
            "apiserver_connect_timeout_seconds must be at most apiserver_call_timeout_seconds, got 5.0 > 2.0 s",
        ),
    ],
)
def test_bad_settings_name_the_problem(flags: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        load(flags=flags, env={}, config_file=None)
    assert fragment in str(info.value)


def test_unreadable_or_bad_file_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="config file"):
        load(flags={}, env={}, config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(SettingsError, match="mapping"):
        load(flags={}, env={}, config_file=bad)


# --------------------------------------------------------------------------------------------------------------
# the loader's surfaces, and every setting reaching the object that uses it


DEMO_CLUSTER = Path(__file__).resolve().parents[2] / "vgpu_cli" / "data" / "demo-cluster.yaml"


def test_every_placement_setting_reaches_the_planner() -> None:
    """placement() hands over every setting named like a PlacementConfig field; these are the ones there are."""
    assert PLACEMENT_SETTINGS & set(ExtenderSettings.model_fields) == {
        "node_policy",
        "gpu_policy",
        "narrow_filter",
        "priority_mapping",
        "topology",
        "topology_weight",
    }
    s = load(
        flags={"priority_mapping": "minmax", "gpu_policy": "spread", "narrow_filter": True}, env={}, config_file=None
    )
    p = s.placement()
    assert (p.priority_mapping, p.gpu_policy, p.narrow_filter, p.node_policy) == ("minmax", "spread", True, "default")


def _priorities(argv: list[str]) -> list[int]:
    """Scores /prioritize gives a 1-GPU half-card pod on the demo cluster, built from the command line."""
    s = SCHEMA.load(["--source", "file", "--cluster-file", str(DEMO_CLUSTER), *argv], {}, lambda p: Path(p).read_text())
    service, _, _ = ext_main.build_service(s)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "0b6c3c47-0a4e-4d0e-9a55-1c1f3b7f8a10"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    nodes = sorted(service.state.nodes)
    ok = service.filter(schema.ExtenderArgs(Pod=pod, NodeNames=nodes))["NodeNames"]
    assert len(ok) == len(nodes) == 4
    return sorted((h["Score"] for h in service.prioritize(schema.ExtenderArgs(Pod=pod, NodeNames=ok))), reverse=True)


def test_priority_mapping_flag_changes_what_prioritize_answers() -> None:
    """--priority-mapping used to be validated and dropped. On the empty demo cluster the half-card pod scores the
    same on every node: rank still orders them (10, 9, 8, 7), minmax gives every one of them the top score."""
    assert _priorities([]) == [10, 9, 8, 7]
    assert _priorities(["--priority-mapping", "minmax"]) == [10, 10, 10, 10]
    assert _priorities(["--priority-mapping=rank"]) == [10, 9, 8, 7]


def test_kubernetes_service_links_are_not_settings() -> None:
    """The kubelet injects VGPU_EXTENDER_PORT=tcp://... etc. for the vgpu-extender Service (enableServiceLinks);
    before the one loader these failed the extender's start (an unknown field) once the Service existed."""
    links = {
        "VGPU_EXTENDER_SERVICE_HOST": "10.96.0.9",
        "VGPU_EXTENDER_SERVICE_PORT": "443",
        "VGPU_EXTENDER_SERVICE_PORT_HTTPS": "443",
        "VGPU_EXTENDER_PORT": "tcp://10.96.0.9:443",
        "VGPU_EXTENDER_PORT_443_TCP": "tcp://10.96.0.9:443",
        "VGPU_EXTENDER_PORT_443_TCP_PROTO": "tcp",
        "VGPU_EXTENDER_PORT_443_TCP_PORT": "443",
        "VGPU_EXTENDER_PORT_443_TCP_ADDR": "10.96.0.9",
    }
    assert load(flags={}, env=links, config_file=None) == load(flags={}, env={}, config_file=None)
    with pytest.raises(SettingsError, match="unknown environment variables VGPU_EXTENDER_PROT"):
        load(flags={}, env={"VGPU_EXTENDER_PROT": "1"}, config_file=None)


@pytest.mark.parametrize(
    ("argv", "env", "doc", "fragment"),
    [
        (["--port", "0"], {}, None, "port = 0 from flag --port: Input should be greater than or equal to 1"),
        ([], {"VGPU_EXTENDER_PORT": "x"}, None, "port = 'x' from env VGPU_EXTENDER_PORT"),
        ([], {"VGPU_EXTENDER_RESOURCES__CORES": ""}, None, ""),
        ([], {}, "priority_mapping: log\n", "from file "),
        ([], {}, "priority_mapping: log\n", "allowed: rank, minmax"),
        ([], {}, "resources: {cpu: x}\n", "unknown key resources.cpu (known: cores, count, memory"),
        ([], {}, "version: v2\n", "'version' must be 'v1'"),
    ],
)
def test_errors_name_setting_value_and_source(
    tmp_path: Path, argv: list[str], env: dict[str, str], doc: str | None, fragment: str
) -> None:
    if doc is not None:
        (tmp_path / "e.yaml").write_text(doc)
        argv = [*argv, "--config", str(tmp_path / "e.yaml")]
    if not fragment:  # an empty resource name is a string like any other for the loader
        SCHEMA.load(argv, env, lambda p: Path(p).read_text())
        return
    with pytest.raises(SettingsError) as info:
        SCHEMA.load(argv, env, lambda p: Path(p).read_text())
    assert fragment in str(info.value)


def test_help_describes_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ext_main.build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for s in SCHEMA.settings():
        assert s.description and "".join(s.description.split()) in "".join(out.split()), s.name
    assert "--priority-mapping {rank,minmax}" in out and "(default: rank; env VGPU_EXTENDER_PRIORITY_MAPPING" in out


class Rig:
    """Runs what vgpu-extender runs: main() up to uvicorn (recorded, not served), or build_service alone."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str]) -> None:
        self.tmp_path, self.mp, self.argv, self.env = tmp_path, monkeypatch, argv, env
        self.served: dict[str, Any] = {}
        self.labels: list[tuple[str, str, bool]] = []
        self.stops: list[Callable[[], None]] = []
        # The kube source's watches would wait for an apiserver; everything else of the kube wiring is real.
        monkeypatch.setattr(KubeSource, "start", lambda self: None)
        monkeypatch.setattr(
            leadership,
            "mark_leader",
            lambda api, *, namespace, name, leading: self.labels.append((namespace, name, leading)),
        )

    def settings(self) -> ExtenderSettings:
        return SCHEMA.load(self.argv, self.env, lambda p: Path(p).read_text())

    def build(self) -> tuple[Any, Any, Any]:
        service, source, election = ext_main.build_service(self.settings())
        if service.requeuer is not None:
            self.stops.append(service.requeuer.stop)
        return service, source, election

    def main(self) -> dict[str, Any]:
        for k, v in self.env.items():
            self.mp.setenv(k, v)

        served = self.served

        class Verbs:
            """Stands in for the verbs' uvicorn.Server: records what it was built with, serves nothing."""

            def __init__(self, app: Any, **kwargs: Any) -> None:
                served.update(kwargs, app=app)
                self.started = False

            def run(self) -> None:
                self.started = True
                if served.get("probe_health"):
                    import time

                    url = f"http://127.0.0.1:{served['probe_health']}/healthz"
                    give_up = time.monotonic() + 30  # the health thread may start late on a loaded machine
                    while time.monotonic() < give_up:
                        try:
                            with urllib.request.urlopen(url, timeout=10) as r:
                                served["health"] = r.status
                                return
                        except OSError:
                            time.sleep(0.02)

        self.mp.setattr(ext_main, "verbs_server", Verbs)
        self.served["rc"] = ext_main.main(self.argv)
        return self.served

    def health(self, port: int) -> object:
        self.served["probe_health"] = port
        return self.main().get("health")

    def logging(self) -> tuple[str, str]:
        self.main()
        root = logging.getLogger()
        fmt = "json" if isinstance(root.handlers[0].formatter, logs.JsonFormatter) else "text"
        return logging.getLevelName(root.level).lower(), fmt


FILE = {"source": "file", "cluster_file": str(DEMO_CLUSTER)}
KUBE = {"source": "kube", "kubeconfig": "{tmp}/kubeconfig", "allow_unauthenticated": "true"}
TLS = {"tls_cert_file": "{tmp}/pki/tls.crt", "tls_key_file": "{tmp}/pki/tls.key"}
ELECT = {**KUBE, "leader_elect": "true"}
Probe = Callable[[Rig], object]
# setting -> (value as text, other settings it needs (flags), probe of the consuming object, what it must see).
CASES: dict[str, tuple[str, dict[str, str], Probe, object]] = {
    "address": ("127.0.0.1", FILE, lambda r: r.main()["host"], "127.0.0.1"),
    "port": ("9123", FILE, lambda r: r.main()["port"], 9123),
    "tls_cert_file": ("{tmp}/pki/tls.crt", {**FILE, **TLS}, lambda r: r.main()["ssl_certfile"], "{tmp}/pki/tls.crt"),
    "tls_key_file": ("{tmp}/pki/tls.key", {**FILE, **TLS}, lambda r: r.main()["ssl_keyfile"], "{tmp}/pki/tls.key"),
    "client_ca_file": ("{tmp}/pki/ca.crt", {**FILE, **TLS}, lambda r: r.main()["ssl_ca_certs"], "{tmp}/pki/ca.crt"),
    "allow_unauthenticated": ("true", {**KUBE}, lambda r: r.main()["rc"], 0),
    "health_port": (
        "{port}",
        {**FILE, "address": "127.0.0.1"},
        lambda r: r.health(int(r.settings().health_port or 0)),
        200,
    ),
    "enable_state": (
        "true",
        FILE,
        lambda r: "/state" in [getattr(x, "path", "") for x in r.main()["app"].routes],
        True,
    ),
    "allocation_metrics": (
        "per-node",
        FILE,
        lambda r: b"vgpu_gpu_" in r.build()[0].metrics.exposition(threading.RLock()),
        False,
    ),
    "source": ("file", {"cluster_file": str(DEMO_CLUSTER)}, lambda r: type(r.build()[0].binder).__name__, "FileBinder"),
    "cluster_file": (str(DEMO_CLUSTER), {"source": "file"}, lambda r: len(r.build()[0].state.nodes), 4),
    "persist": ("true", FILE, lambda r: r.build()[0].binder.persist_to, DEMO_CLUSTER),
    "kubeconfig": (
        "{tmp}/kubeconfig",
        {"allow_unauthenticated": "true"},
        lambda r: r.build()[0].binder.api.api_client.configuration.host,
        "https://127.0.0.1:3",
    ),
    "node_policy": ("spread", FILE, lambda r: r.build()[0].planner.config.node_policy, "spread"),
    "gpu_policy": ("spread", FILE, lambda r: r.build()[0].planner.config.gpu_policy, "spread"),
    "narrow_filter": (
        "true",
        FILE,
        lambda r: (r.build()[0].options.narrow_filter, r.build()[0].planner.config.narrow_filter),
        (True, True),
    ),
    "filter_answers_one": ("true", FILE, lambda r: r.build()[0].options.filter_answers_one, True),
    "priority_mapping": ("minmax", FILE, lambda r: r.build()[0].planner.config.priority_mapping, "minmax"),
    "topology": ("false", FILE, lambda r: r.build()[0].planner.config.topology, False),
    "topology_weight": ("0.5", FILE, lambda r: r.build()[0].planner.config.topology_weight, 0.5),
    "bind_grace_seconds": ("12.5", FILE, lambda r: r.build()[0].options.bind_grace_s, 12.5),
    "bind_timeout_seconds": ("9", FILE, lambda r: r.build()[0]._bind.timeout_s, 9.0),
    "relearn_interval_seconds": ("7", FILE, lambda r: r.build()[0].options.relearn_interval_s, 7.0),
    "requeue_max_pods": ("3", KUBE, lambda r: r.build()[0].requeuer.max_pods, 3),
    "requeue_interval_seconds": ("4.5", KUBE, lambda r: r.build()[0].requeuer.interval_s, 4.5),
    "leader_elect": ("true", KUBE, lambda r: r.build()[2] is not None, True),
    "leader_elect_resource_name": ("my-lease", ELECT, lambda r: r.build()[2].elector.store.name, "my-lease"),
    "leader_elect_resource_namespace": ("gpu-ns", ELECT, lambda r: r.build()[2].elector.store.namespace, "gpu-ns"),
    "leader_elect_lease_duration_seconds": ("20", ELECT, lambda r: r.build()[2].elector.lease_s, 20.0),
    "leader_elect_renew_deadline_seconds": ("12", ELECT, lambda r: r.build()[2].elector.renew_deadline_s, 12.0),
    "leader_elect_retry_period_seconds": ("3", ELECT, lambda r: r.build()[2].elector.retry_s, 3.0),
    "pod_name": (
        "ext-0",
        {**ELECT, "pod_namespace": "ns"},
        lambda r: r.build()[2].elector.identity.split("_")[0],
        "ext-0",
    ),
    "pod_namespace": (
        "gpu-ns",
        {**ELECT, "pod_name": "ext-0"},
        lambda r: _lead(r),
        {("gpu-ns", "ext-0", False), ("gpu-ns", "ext-0", True)},
    ),
    "watch_timeout_seconds": (
        "45",
        KUBE,
        lambda r: (r.build()[1].nodes.watch_timeout_s, r.build()[1].pods.watch_timeout_s),
        (45, 45),
    ),
    "apiserver_call_timeout_seconds": ("7.5", KUBE, lambda r: _timeouts(r).call_s, 7.5),
    "apiserver_connect_timeout_seconds": ("1.5", KUBE, lambda r: _timeouts(r).connect_s, 1.5),
    "apiserver_list_timeout_seconds": ("90", KUBE, lambda r: _timeouts(r).list_s, 90.0),
    "watch_read_slack_seconds": ("12", KUBE, lambda r: _timeouts(r).watch_read_slack_s, 12.0),
    "max_body_bytes": ("70000", FILE, lambda r: r.main()["app"].state.max_body, 70000),
    "max_node_names": ("99", FILE, lambda r: r.build()[0].options.max_node_names, 99),
    "max_json_values": ("5000", FILE, lambda r: r.main()["app"].state.max_values, 5000),
    "request_read_timeout_seconds": ("2.5", FILE, lambda r: r.main()["http"].read_timeout, 2.5),
    "max_connections": ("7", FILE, lambda r: r.main()["limit_concurrency"], 7),
    "log_level": ("warning", FILE, lambda r: r.logging()[0], "warning"),
    "log_format": ("json", FILE, lambda r: r.logging()[1], "json"),
    "resources.count": ("example.com/vgpu", FILE, lambda r: r.build()[0].options.names.count, "example.com/vgpu"),
    "resources.memory": ("example.com/mem", FILE, lambda r: r.build()[0].options.names.memory, "example.com/mem"),
    "resources.memory_percentage": (
        "example.com/pct",
        FILE,
        lambda r: r.build()[0].options.names.memory_percentage,
        "example.com/pct",
    ),
    "resources.cores": ("example.com/sm", FILE, lambda r: r.build()[0].options.names.cores, "example.com/sm"),
    "resources.priority": ("example.com/p", FILE, lambda r: r.build()[0].options.names.priority, "example.com/p"),
}


def _timeouts(r: Rig) -> kube.CallTimeouts:
    """What the apiserver calls use once the kube source is built (restored by `restore_process`)."""
    r.build()
    return kube.call_timeouts()


def _lead(r: Rig) -> set[tuple[str, str, bool]]:
    """A standby unlabels its own pod, taking the lease labels it (namespace from pod_namespace); the apiserver
    calls behind that (clearing other labels, seeding) fail here and are logged."""
    _service, _source, election = r.build()
    election.elector.on_started()
    return set(r.labels)


def test_the_table_covers_every_setting() -> None:
    assert set(CASES) == {s.name for s in SCHEMA.settings()}


@pytest.fixture
def restore_process() -> Iterator[None]:
    import signal

    root = logging.getLogger()
    handlers, level, term = root.handlers[:], root.level, signal.getsignal(signal.SIGTERM)
    timeouts = kube.call_timeouts()
    yield
    root.handlers[:], root.level = handlers, level
    signal.signal(signal.SIGTERM, term)
    kube.configure_timeouts(timeouts)


@pytest.mark.parametrize("source", ["flag", "env", "file"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_setting_reaches_its_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_process: None, name: str, source: str
) -> None:
    raw, needs, probe, expected = CASES[name]
    port = str(_free_port())
    certs.write_dev_certs(tmp_path / "pki")
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:3'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{port}", port)

    by_name = {s.name: s for s in SCHEMA.settings()}
    base = {k: fill(v) for k, v in needs.items() if k != name}
    argv = [f"{by_name[k].flag}={v}" for k, v in base.items()]
    env: dict[str, str] = {}
    value = fill(raw)
    s = by_name[name]
    if source == "flag":
        argv.append(f"{s.flag}={value}")
    elif source == "env":
        env[s.env] = value
    else:
        doc = f"{s.path[0]}: {{{s.path[1]}: '{value}'}}\n" if len(s.path) == 2 else f"{name}: '{value}'\n"
        (tmp_path / "extender.yaml").write_text("version: v1\n" + doc)
        argv.append(f"--config={tmp_path / 'extender.yaml'}")
    rig = Rig(tmp_path, monkeypatch, argv, env)
    try:
        seen = probe(rig)
    finally:
        for stop in rig.stops:
            stop()
    assert seen == (fill(expected) if isinstance(expected, str) else expected)


def test_topology_settings_reach_the_planner_and_are_bounded() -> None:
    p = load(flags={"topology": False, "topology_weight": 0.5}, env={}, config_file=None).placement()
    assert (p.topology, p.topology_weight) == (False, 0.5)
    assert load(flags={}, env={}, config_file=None).placement().topology_weight == 2.0
    with pytest.raises(SettingsError, match="topology_weight"):
        load(flags={"topology_weight": -1}, env={}, config_file=None)
