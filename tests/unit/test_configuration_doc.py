"""docs/configuration.md lists every setting of the three programs as their models define them today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_tables_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-configuration-doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_every_flag_of_every_program_is_documented() -> None:
    from device_plugin.config import SCHEMA as DEVICE_PLUGIN
    from scheduler_extender.settings import SCHEMA as EXTENDER
    from webhook.config_load import SCHEMA as WEBHOOK

    doc = (ROOT / "docs" / "configuration.md").read_text()
    for schema in (EXTENDER, WEBHOOK, DEVICE_PLUGIN):
        section = doc.split(f"## {schema.prog}\n", 1)[1].split("\n## ", 1)[0]
        for s in schema.settings():
            assert f"| `{s.flag}` | `{s.env}` | `{s.file_key}` |" in section, (schema.prog, s.name)
