from __future__ import annotations

from pathlib import Path

import pytest

from device_plugin.config import load


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nnode_name: from-file\nsplit_count: 4\nmps: true\n")
    env = {"VGPU_DP_SPLIT_COUNT": "6", "NODE_NAME": "from-env"}
    c = load(["--config", str(f), "--node-name", "from-flag"], env)
    assert (c.node_name, c.split_count, c.mps) == ("from-flag", 6, True)


@pytest.mark.parametrize(
    ("doc", "err"),
    [("version: v2\n", "version"), ("version: v1\nbogus: 1\n", "unknown"), ("version: v1\n", "node_name")],
)
def test_bad_files_are_rejected(tmp_path: Path, doc: str, err: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(doc)
    with pytest.raises(ValueError, match=err):
        load(["--config", str(f)], {})
