"""vgpu.settings: the one loader's rules, on a small model of its own (the services' tables test their models)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from vgpu.settings import Schema, SettingsError


class Inner(BaseModel):
    name: str = Field(default="x", description="inner name")


class Model(BaseModel):
    version: Literal["v1"] = "v1"
    port: int = Field(default=80, ge=1, description="a port")
    flag: bool = Field(default=False, description="a switch")
    mode: Literal["a", "b"] = Field(default="a", description="a mode")
    inner: Inner = Field(default_factory=Inner)


SCHEMA = Schema(model=Model, prog="prog", description="d", env_prefix="P_")
FILES = {"f.yaml": "version: v1\nport: 81\ninner: {name: from-file}\n"}


def read(path: str) -> str:
    if path not in FILES:
        raise FileNotFoundError(2, "No such file or directory", path)
    return FILES[path]


def load(argv: list[str], env: dict[str, str] | None = None) -> Model:
    return SCHEMA.load(argv, env or {}, read)


def test_names_on_every_surface() -> None:
    (inner,) = (s for s in SCHEMA.settings() if s.path == ("inner", "name"))
    assert (inner.flag, inner.env, inner.file_key, inner.default) == (
        "--inner-name",
        "P_INNER__NAME",
        "inner.name",
        "x",
    )
    assert "version" not in {s.name for s in SCHEMA.settings()}


def test_precedence_per_setting() -> None:
    assert load([]) == Model()
    assert load(["--config", "f.yaml"]).port == 81
    assert load([], {"P_CONFIG": "f.yaml", "P_PORT": "82"}).port == 82
    m = load(["--config", "f.yaml", "--port", "83"], {"P_PORT": "82"})
    assert (m.port, m.inner.name) == (83, "from-file")  # a flag overrides only its own setting
    assert load(["--config", "f.yaml"], {"P_INNER__NAME": "env"}).inner.name == "env"


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], False),
        (["--flag"], True),
        (["--flag=false"], False),
        (["--flag", "yes"], True),
        (["--flag", "--port=2"], True),
    ],
)
def test_yes_no_flags_alone_or_with_a_value(argv: list[str], want: bool) -> None:
    assert load(argv).flag is want


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        ([], {"P_PORT": "0"}, "port = '0' from env P_PORT: Input should be greater than or equal to 1"),
        ([], {"P_MODE": "c"}, "allowed: a, b"),
        ([], {"P_FLAG": "maybe"}, "flag = 'maybe' from env P_FLAG"),
        ([], {"P_PROT": "1"}, "unknown environment variables P_PROT; known: "),
        (["--config", "bad.yaml"], {}, "config file bad.yaml: "),
    ],
)
def test_errors_name_the_setting_the_value_and_its_source(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        load(argv, env)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ("port: 1\n", "'version' must be 'v1', got None"),
        ("version: v2\n", "'version' must be 'v1'"),
        ("version: v1\nprot: 1\n", "unknown key prot (known: flag, inner, mode, port)"),
        ("version: v1\ninner: {nam: 1}\n", "unknown key inner.nam (known: name)"),
        ("version: v1\ninner: 3\n", "inner must be a mapping"),
        ("- a\n", "expected a mapping at the top level"),
        ("a: [\n", "config file f.yaml: while parsing"),
    ],
)
def test_file_errors(doc: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        SCHEMA.from_yaml(doc, "f.yaml")
    assert fragment in str(info.value)


def test_checks_after_validation_name_the_source() -> None:
    def check(m: Model) -> list[tuple[str, str]]:
        return [("port", f"port {m.port} is odd")] if m.port % 2 else []

    with pytest.raises(SettingsError, match=r"port 81 is odd \(file f.yaml: port\)"):
        SCHEMA.load(["--config", "f.yaml"], {}, read, check=check)


def test_kubernetes_service_links_are_skipped_but_a_real_port_is_not() -> None:
    env = {"P_SERVICE_HOST": "10.0.0.1", "P_PORT": "tcp://10.0.0.1:80", "P_PORT_80_TCP_ADDR": "10.0.0.1"}
    assert load([], env).port == 80
    assert load([], {**env, "P_PORT": "90"}).port == 90


def test_file_key_overrides_group_a_flat_model_into_sections() -> None:
    grouped = Schema(model=Model, prog="p", description="d", env_prefix="P_", file_keys={"port": "listen.port"})
    layer = grouped.from_yaml("version: v1\nlisten: {port: 7}\n", "g.yaml")
    assert layer == {("port",): (7, "file g.yaml: listen.port")}
