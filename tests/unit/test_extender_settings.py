"""Extender settings: defaults, flags > env > file precedence, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_extender.settings import SettingsError, load


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
