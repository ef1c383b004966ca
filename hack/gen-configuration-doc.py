#!/usr/bin/env python3
"""Regenerate the settings tables of docs/configuration.md from the services' settings models.

Usage: hack/gen-configuration-doc.py [--check]   (--check: exit 1 when the file is out of date)
tests/unit/test_configuration_doc.py runs the check, so a new or changed setting fails until this is rerun.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "configuration.md"
_BLOCK = re.compile(r"(<!-- BEGIN GENERATED: (?P<prog>[\w-]+) -->\n).*?(<!-- END GENERATED -->)", re.S)


def tables() -> dict[str, str]:
    from device_plugin.config import SCHEMA as DEVICE_PLUGIN
    from device_plugin.standalone.config import SCHEMA as STANDALONE
    from scheduler_extender.settings import SCHEMA as EXTENDER
    from webhook.config_load import SCHEMA as WEBHOOK

    return {s.prog: s.markdown_table() for s in (EXTENDER, WEBHOOK, DEVICE_PLUGIN, STANDALONE)}


def render(text: str) -> str:
    generated = tables()
    return _BLOCK.sub(lambda m: m.group(1) + generated[m.group("prog")] + "\n" + m.group(3), text)


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    fresh = render(text)
    if "--check" in argv:
        if fresh != text:
            print(f"{DOC.relative_to(ROOT)} is out of date: run hack/gen-configuration-doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
