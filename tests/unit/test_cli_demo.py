"""`vgpu demo`: the bundled replay runs in-process, places what fits, never over-commits, explains failures."""

from __future__ import annotations

import json
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import make_container, make_pod
from vgpu.placement import registry
from vgpu_cli.main import main


def _bundled(name: str) -> Any:
    return list(yaml.safe_load_all(resources.files("vgpu_cli").joinpath("data", name).read_text()))


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["demo", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _limit(pod: dict[str, Any], resource: str) -> int:
    return max(int(c["resources"].get("limits", {}).get(resource, 0)) for c in pod["spec"]["containers"])


def _unfittable() -> set[str]:
    """Pods asking for more MiB per vGPU than the largest card of the bundled cluster has."""
    cluster = _bundled("demo-cluster.yaml")[0]
    largest = max(g["memoryMiB"] for n in cluster["nodes"] for g in n["gpus"])
    pods = _bundled("demo-workload.yaml")
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in pods
        if _limit(p, "nvidia.com/gpumem") > largest
    }


@pytest.fixture(scope="module")
def workload_keys() -> list[str]:
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in _bundled("demo-workload.yaml")]


@pytest.mark.parametrize("policy", registry.names())
@pytest.mark.parametrize("gpu_policy", [None, *registry.GPU_POLICIES])
def test_every_pod_that_fits_is_placed_and_no_gpu_goes_over_capacity(
    capsys: pytest.CaptureFixture[str], workload_keys: list[str], policy: str, gpu_policy: str | None
) -> None:
    argv = ["--policy", policy] + (["--gpu-policy", gpu_policy] if gpu_policy else [])
    report = _run_json(capsys, *argv)
    unfittable = _unfittable()
    assert unfittable, "the bundled workload must keep one pod that cannot fit"
    assert {p["pod"] for p in report["placed"]} == set(workload_keys) - unfittable
    assert {f["pod"] for f in report["failed"]} == unfittable
    for node in report["nodes"]:
        for g in node["gpus"]:
            assert g["memoryUsedMiB"] <= g["memoryMiB"]
            assert g["coresUsed"] <= g["cores"]
            assert g["sharers"] <= g["split"]
            assert g["memoryUsedMiB"] == sum(h["memoryMiB"] for h in g["holders"])
            assert g["coresUsed"] == sum(h["cores"] for h in g["holders"])
            if any(h["role"] == "prefill" for h in g["holders"]):
                assert g["coresUsed"] <= 100 and all(h["cores"] > 0 for h in g["holders"])
    t = report["totals"]
    assert t["podsPlaced"] == len(workload_keys) - len(unfittable)
    assert t["memoryUsedMiB"] == sum(g["memoryUsedMiB"] for n in report["nodes"] for g in n["gpus"])


def test_unfittable_pod_is_reported_with_a_reason_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    report = _run_json(capsys)
    node_names = {n["name"] for n in report["nodes"]}
    for failed in report["failed"]:
        assert set(failed["nodes"]) == node_names
        for reason in failed["nodes"].values():
            assert "card too small" in reason
        assert failed["reason"]


def test_prefill_and_decode_of_a_model_share_gpus_and_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    report = _run_json(capsys)
    roles_on_gpu: dict[str, set[tuple[str, str]]] = defaultdict(set)
    nodes_of_model: dict[str, set[str]] = defaultdict(set)
    for node in report["nodes"]:
        for g in node["gpus"]:
            for h in g["holders"]:
                if h["model"] is not None and h["role"] in ("prefill", "decode"):
                    roles_on_gpu[g["uuid"]].add((h["role"], h["model"]))
                    nodes_of_model[h["model"]].add(node["name"])
    disaggregated = {m for roles in roles_on_gpu.values() for r, m in roles if r == "prefill"} & {
        m for roles in roles_on_gpu.values() for r, m in roles if r == "decode"
    }
    assert len(disaggregated) >= 2, "the demo should hold several P/D models"
    for model in disaggregated:
        assert any({("prefill", model), ("decode", model)} <= roles for roles in roles_on_gpu.values()), model
        assert len(nodes_of_model[model]) == 1, f"{model} split over {nodes_of_model[model]}"


def test_every_role_signal_is_exercised(capsys: pytest.CaptureFixture[str]) -> None:
    report = _run_json(capsys)
    sources = {p["roleSource"] for p in report["placed"]}
    assert {"label", "sglang-arg", "routing-sidecar", "kv-transfer-config", "default"} <= sources


def test_table_lists_nodes_totals_and_failures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    cluster = _bundled("demo-cluster.yaml")[0]
    for node in cluster["nodes"]:
        assert f"NODE {node['name']}" in out
    assert "TOTALS" in out and "FAILED" in out
    for pod in _unfittable():
        assert pod in out


def test_custom_files_decode_joins_its_prefill_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = {
        "version": "v1",
        "nodes": [
            {"name": name, "gpuTemplate": {"count": 2, "model": "H100-80GB", "memoryMiB": 81559}} for name in ("a", "b")
        ],
    }
    labels = {"llm-d.ai/model": "m"}
    pods = [
        make_pod(
            "p", [make_container(gpu=1, gpumem=30000, gpucores=60)], labels={**labels, "llm-d.ai/role": "prefill"}
        ),
        make_pod("d", [make_container(gpu=1, gpumem=30000, gpucores=40)], labels={**labels, "llm-d.ai/role": "decode"}),
    ]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp_path / "w.yaml").write_text(yaml.safe_dump_all(pods))
    report = _run_json(capsys, "--cluster", str(tmp_path / "c.yaml"), "--workload", str(tmp_path / "w.yaml"))
    holders = [{h["pod"] for h in g["holders"]} for n in report["nodes"] for g in n["gpus"] if g["holders"]]
    assert holders == [{"default/p", "default/d"}]


def test_json_logs_go_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "info", "--log-format", "json", "demo", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout is exactly one JSON document
    lines = [json.loads(line) for line in captured.err.splitlines()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert any(line.get("pod") for line in lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--policy", "no-such-policy"], "invalid choice"),
        (["demo", "--gpu-policy", "random"], "invalid choice"),
        (["--log-format", "xml", "demo"], "invalid choice"),
    ],
)
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: Pod\nmetadata: {namespace: x}\n", "metadata.name is required"),
        ("- not\n- a pod\n", "expected a Kubernetes object"),
        ("kind: List\nitems: 3\n", "'items' must be a list"),
        ("a: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_workload_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(content)
    assert main(["demo", "--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "show" in out and "--log-format" in out
