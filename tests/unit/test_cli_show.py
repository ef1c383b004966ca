"""`vgpu show`: prints a cluster file's holdings; a malformed file exits 2 naming the bad field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu_cli.main import main


def _cluster() -> dict[str, Any]:
    return {
        "version": "v1",
        "nodes": [{"name": "n1", "gpuTemplate": {"count": 2, "model": "L4", "memoryMiB": 23034}}],
        "allocations": [
            {
                "pod": "default/p",
                "assignment": {
                    "node": "n1",
                    "role": "decode",
                    "model": "default/m",
                    "containers": [
                        {"name": "c", "devices": [{"uuid": "GPU-n1-1", "index": 1, "memoryMiB": 8000, "cores": 30}]}
                    ],
                },
            }
        ],
    }


def _write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def test_show_prints_each_allocation_on_its_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _cluster())
    assert main(["show", "--cluster", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    gpus = {g["uuid"]: g for g in report["nodes"][0]["gpus"]}
    assert gpus["GPU-n1-1"]["memoryUsedMiB"] == 8000 and gpus["GPU-n1-1"]["coresUsed"] == 30
    assert gpus["GPU-n1-1"]["holders"] == [
        {"pod": "default/p", "container": "c", "role": "decode", "model": "default/m", "memoryMiB": 8000, "cores": 30}
    ]
    assert gpus["GPU-n1-0"]["holders"] == []
    assert report["totals"]["podsPlaced"] == 1 and report["failed"] == []
    assert main(["show", "--cluster", path]) == 0
    assert "default/p" in capsys.readouterr().out


def _set(path: str, value: object) -> Any:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(last) if last.isdigit() else last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (_set("nodes.0.gpuTemplate.memoryMiB", -5), "nodes.0.gpuTemplate.memoryMiB"),
        (_set("nodes.0.gpuTemplate.colour", "red"), "nodes.0.gpuTemplate.colour"),
        (_set("version", "v2"), "version"),
        (_set("allocations.0.pod", "no-namespace"), "allocations.0.pod"),
        (_set("allocations.0.assignment.role", "chef"), "allocations.0.assignment: unknown role 'chef'"),
        (_set("allocations.0.assignment.node", "n9"), "allocations.0.assignment.node"),
        (
            _set("allocations.0.assignment.containers.0.devices.0.cores", 101),
            "allocations.0.assignment: containers[0].devices[0]: field 'cores'",
        ),
        (_set("allocations.0.assignment.containers.0.devices.0.memoryMiB", 99999), "allocations.0"),
        (_set("allocations.0.assignment.containers.0.devices.0.uuid", "GPU-x"), "allocations.0"),
    ],
)
def test_show_rejects_a_malformed_file_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Any, field: str
) -> None:
    doc = _cluster()
    mutate(doc)
    path = _write(tmp_path, doc)
    assert main(["show", "--cluster", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert field in captured.err and path in captured.err


@pytest.mark.parametrize(
    ("content", "message"),
    [("[1, 2]", "<root>"), ("nodes: [", "not valid YAML"), ("{}", "nodes")],
)
def test_show_rejects_unparseable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    assert main(["show", "--cluster", _write(tmp_path, content)]) == 2
    assert message in capsys.readouterr().err


def test_show_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "--cluster", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_show_reproduces_what_the_demo_placed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A snapshot of the demo's final state (dump_cluster) shows the very same GPU usage."""
    from vgpu.clusterfile import dump_cluster
    from vgpu.planner import Planner
    from vgpu.simulate import build_state, replay
    from vgpu_cli import files

    nodes, allocations = files.load_cluster(None)
    state = build_state(nodes, allocations)
    replay(Planner(state), files.load_workload(None), track_host_resources=True)
    path = _write(tmp_path, dump_cluster(nodes, list(state.assignments.items())))
    assert main(["show", "--cluster", path, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["demo", "--json"]) == 0
    demo = json.loads(capsys.readouterr().out)
    assert shown["nodes"] == demo["nodes"]


def test_show_marks_cordoned_gpus_and_refuses_a_cordon_of_no_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _cluster()
    doc["nodes"][0]["cordonedGpus"] = ["GPU-n1-1"]
    path = _write(tmp_path, doc)
    assert main(["show", "--cluster", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nodes"][0]["cordonedGpus"] == ["GPU-n1-1"]
    assert [g["cordoned"] for g in report["nodes"][0]["gpus"]] == [False, True]
    assert main(["show", "--cluster", path]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "8000/23034" in line)
    assert row.endswith("CORDONED")  # the slice on it stays, shown under it
    doc["nodes"][0]["cordonedGpus"] = ["GPU-n1-1", "GPU-n9-0", "gpu 3"]
    assert main(["show", "--cluster", _write(tmp_path, doc)]) == 2
    err = capsys.readouterr().err
    assert "nodes.0.cordonedGpus: not GPU UUIDs: gpu 3" in err
    doc["nodes"][0]["cordonedGpus"] = ["GPU-n9-0"]
    assert main(["show", "--cluster", _write(tmp_path, doc)]) == 2
    assert "nodes.0.cordonedGpus: not GPUs of this node: GPU-n9-0" in capsys.readouterr().err
