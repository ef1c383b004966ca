from __future__ import annotations

from pathlib import Path

import pytest

from webhook.config import ConfigError, WebhookConfig, problems
from webhook.config_load import from_document, load


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
        (["--port", "0"], {}, None, "port"),
        (["--port", "x"], {}, None, "flag --port"),
        ([], {"VGPU_WEBHOOK_OVERRIDE_DEFAULT_SCHEDULER": "maybe"}, None, "expected true or false"),
        ([], {"VGPU_WEBHOOK_PROT": "1"}, None, "unknown environment variables: VGPU_WEBHOOK_PROT"),
        ([], {}, "version: v2\n", "'version' must be 'v1'"),
        ([], {}, "version: v1\nlisten: {prot: 1}\n", "unknown key listen.prot"),
        ([], {}, "version: v1\nextras: {}\n", "unknown section"),
        (["--inventory-source", "static"], {}, None, "needs max_gpu_memory_mib"),
        (["--default-cores", "150"], {}, None, "default_cores"),
        (["--scheduler-name", "Not_A_Name"], {}, None, "DNS subdomain"),
        (["--resource-memory", "nvidia.com/gpu"], {}, None, "distinct"),
    ],
)
def test_invalid_settings_are_refused_with_a_reason(
    tmp_path: Path, argv: list[str], env: dict[str, str], doc: str | None, message: str
) -> None:
    if doc is not None:
        argv = [*argv, "--config", _file(tmp_path, doc)]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load(argv=argv, environ=env)


def test_request_defaults_and_names_flow_into_the_core() -> None:
    cfg = load(argv=["--default-cores", "30", "--resource-count", "example.com/vgpu"], environ={})
    assert cfg.request_defaults().cores == 30
    assert cfg.resource_names().count == "example.com/vgpu"
    assert from_document({"version": "v1", "defaults": {"cores": 0}})["default_cores"] == "0"
