"""`vgpu discovery merge` and vgpu.endpoints: per-host file-discovery files into the router's one file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vgpu.endpoints import EndpointFileError, merge_endpoints, parse_endpoints
from vgpu_cli.main import main

HOST_A = {"endpoints": [{"name": "a-0", "address": "127.0.0.2", "port": 8000, "labels": {"llm-d.ai/role": "decode"}}]}
HOST_B = {
    "endpoints": [
        {"name": "b-0", "namespace": "slurm", "address": "127.0.0.3", "port": "8001"},
        {"name": "b-1", "namespace": "slurm", "address": "127.0.0.3", "port": "8002", "labels": {}},
    ]
}


def test_merge_sorts_defaults_the_namespace_and_makes_ports_strings() -> None:
    merged = merge_endpoints([("a.yaml", HOST_A), ("b.yaml", HOST_B), ("empty.yaml", None)])
    assert [(e["namespace"], e["name"], e["port"]) for e in merged] == [
        ("default", "a-0", "8000"),
        ("slurm", "b-0", "8001"),
        ("slurm", "b-1", "8002"),
    ]
    assert merged[0]["labels"] == {"llm-d.ai/role": "decode"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "address": "gpu-host-1", "port": "80"}, "x'.address: 'gpu-host-1' is not an IP address"),
        ({"name": "x", "address": "10.0.0.1", "port": "0"}, "x'.port: 0 is outside 1-65535"),
        ({"name": "x", "address": "10.0.0.1", "port": "http"}, "x'.port: 'http' is not a port number"),
        ({"name": "x", "address": "10.0.0.1", "port": "80", "labels": {"gpus": 2}}, "x'.labels: must map strings"),
        ({"address": "10.0.0.1", "port": "80"}, "endpoints[0].name: required"),
        ({"name": "x", "address": "10.0.0.1", "port": "80", "weight": 1}, "unknown field 'weight'"),
    ],
)
def test_a_bad_entry_is_named_with_its_file_and_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(EndpointFileError, match=r"^h\.yaml: ") as err:
        parse_endpoints("h.yaml", {"endpoints": [entry]})
    assert message in str(err.value)


def test_the_same_endpoint_on_two_hosts_names_both_files() -> None:
    with pytest.raises(EndpointFileError, match=r"default/a-0 is in both a\.yaml and c\.yaml"):
        merge_endpoints([("a.yaml", HOST_A), ("c.yaml", HOST_A)])


def test_cli_merges_a_folder_atomically_and_only_rewrites_on_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "a.yaml").write_text(json.dumps(HOST_A))
    (hosts / "b.json").write_text(json.dumps(HOST_B))
    (hosts / "notes.txt").write_text("not an endpoints file")
    out = tmp_path / "router" / "endpoints.yaml"
    assert main(["discovery", "merge", str(hosts), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: 3 endpoints"
    doc = json.loads(out.read_text())
    assert [e["name"] for e in doc["endpoints"]] == ["a-0", "b-0", "b-1"]
    inode = os.stat(out).st_ino
    assert main(["discovery", "merge", str(hosts), "--out", str(out)]) == 0
    assert "(unchanged)" in capsys.readouterr().out and os.stat(out).st_ino == inode
    (hosts / "b.json").write_text(json.dumps({"endpoints": HOST_B["endpoints"][:1]}))
    assert main(["discovery", "merge", str(hosts), "--out", str(out)]) == 0
    assert os.stat(out).st_ino != inode  # replaced by rename, never written in place
    assert os.listdir(out.parent) == ["endpoints.yaml"]


def test_cli_refuses_a_bad_input_and_leaves_the_output_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad, out = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "out.yaml"
    good.write_text(json.dumps(HOST_A))
    assert main(["discovery", "merge", str(good), "--out", str(out)]) == 0
    before = out.read_bytes()
    bad.write_text("endpoints:\n- {name: b, address: 10.0.0.1, port: 99999}\n")
    assert main(["discovery", "merge", str(good), str(bad), "--out", str(out)]) == 2
    assert "b.yaml: endpoint 'b'.port: 99999 is outside 1-65535" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["discovery", "merge", str(tmp_path / "gone.yaml"), "--out", str(out)]) == 2
    assert "gone.yaml: no such file or folder" in capsys.readouterr().err


def test_every_mode_picks_up_a_new_host_file(tmp_path: Path) -> None:
    hosts, out = tmp_path / "hosts", tmp_path / "endpoints.yaml"
    hosts.mkdir()
    (hosts / "a.yaml").write_text(json.dumps(HOST_A))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu_cli.main", "discovery", "merge", str(hosts), "--out", str(out), "--every", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        names = _wait_for(out, 1)
        assert names == ["a-0"]
        (hosts / "b.yaml").write_text(json.dumps(HOST_B))
        assert _wait_for(out, 3) == ["a-0", "b-0", "b-1"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_for(out: Path, count: int) -> list[str]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if out.exists():
            names = [e["name"] for e in json.loads(out.read_text())["endpoints"]]
            if len(names) == count:
                return names
        time.sleep(0.05)
    raise AssertionError(f"{out} never had {count} endpoints")
