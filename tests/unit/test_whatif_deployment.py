"""`vgpu validate --deployment`: the user's own pods placed by the planner on a cluster file, then simulated
per model pool; bad files are named with the field and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vgpu.whatif.userdeploy import match_gpu, match_model
from vgpu_cli.main import main

EXAMPLE = str(Path(__file__).parents[2] / "deploy" / "examples" / "llm-d-pd-pods.yaml")


def _pod(name: str, role: str, model: str, mem: int = 40000, cores: int = 40) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"llm-d.ai/role": role, "llm-d.ai/model": model}},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": str(mem),
                            "nvidia.com/gpucores": str(cores),
                        }
                    },
                }
            ]
        },
    }


def _cluster(tmp_path: Path, nodes: int = 2, model: str = "H200-141GB", allocations: list[object] | None = None) -> str:
    doc = {
        "version": "v1",
        "nodes": [
            {"name": f"h{k}", "gpuTemplate": {"count": 2, "model": model, "memoryMiB": 143771, "nvlink": "all"}}
            for k in range(nodes)
        ],
        "allocations": allocations or [],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _pods(tmp_path: Path, pods: list[dict[str, object]]) -> str:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(pods))
    return str(path)


def test_models_and_gpus_are_matched_by_name_parts() -> None:
    assert match_model(["llama-3.1-8b-instruct"]).name == "llama-8b"  # type: ignore[union-attr]
    assert match_model(["", "Qwen/Qwen2.5-32B-Instruct"]).name == "qwen-32b"  # type: ignore[union-attr]
    assert match_model(["meta-llama/Llama-3.3-70B-Instruct-FP8"]).name == "llama-70b-fp8"  # type: ignore[union-attr]
    assert match_model(["mistral-7b"]) is None
    assert match_gpu("H100-80GB").name == "H100"  # type: ignore[union-attr]
    assert match_gpu("NVIDIA-H200-141GB").name == "H200"  # type: ignore[union-attr]
    assert match_gpu("L4") is None


def test_the_shipped_example_on_the_bundled_cluster_gives_one_row_per_pool(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", "--deployment", EXAMPLE, "--duration", "30", "--json"])
    data = json.loads(capsys.readouterr().out)
    rows = {r["pool"]: r for r in data["pools"]}
    assert list(rows) == ["default/llama-3.1-8b-instruct", "default/qwen2.5-32b-instruct"]
    llama = rows["default/llama-3.1-8b-instruct"]
    assert (llama["model"], llama["gpu"], llama["prefill"], llama["decode"]) == ("llama-8b", "H100-80GB", 1, 2)
    assert llama["report"]["requests"] > 0 and llama["layer"] in (
        "none",
        "allocation",
        "queuing",
        "cache",
        "communication",
    )
    # the prefill asked 60 % of the SMs and the planner gave it a GPU of its own or a partitioned one
    prefill = next(s for s in llama["slices"] if s["role"] == "prefill")
    assert prefill["smShare"] == pytest.approx(0.6) and prefill["node"].startswith("gpu-")
    qwen = rows["default/qwen2.5-32b-instruct"]
    assert "report" not in qwen and "no prefill instance" in qwen["notSimulated"]
    assert "default/too-big" in data["unplaced"] and data["notInPool"] == ["default/too-big"]
    assert code == (0 if llama["report"]["slo_met"] else 1)
    # under HAMi's defaults the planner puts the pool elsewhere (the demo's A100s, which have no spec): said so
    main(["validate", "--deployment", EXAMPLE, "--duration", "30", "--config", "hami", "--json"])
    hami = json.loads(capsys.readouterr().out)["pools"][0]
    assert hami["gpu"] != "H100-80GB" and "performance spec" in hami["notSimulated"]
    main(["validate", "--deployment", EXAMPLE, "--duration", "30"])
    text = capsys.readouterr().out
    assert "default/llama-3.1-8b-instruct  llama-8b  H100-80GB  1/2" in text and "unplaced default/too-big" in text


def test_pods_go_where_the_planner_puts_them_after_the_clusters_allocations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = [_pod(f"p{k}", "prefill", "llama-3.1-8b-instruct") for k in range(4)]
    pods += [_pod(f"d{k}", "decode", "llama-3.1-8b-instruct") for k in range(2)]
    cluster = _cluster(tmp_path)
    assert (
        main(["validate", "--deployment", _pods(tmp_path, pods), "--cluster", cluster, "--duration", "30", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    (row,) = data["pools"]
    assert (row["gpu"], row["prefill"], row["decode"], data["unplaced"]) == ("H200-141GB", 4, 2, {})
    assert {s["node"] for s in row["slices"]} <= {"h0", "h1"} and row["report"]["slo_met"]
    # one node left: the same pods no longer all fit and the report says which were not placed
    small = _cluster(tmp_path, nodes=1)
    pods += [_pod(f"x{k}", "decode", "llama-3.1-8b-instruct", mem=140000, cores=100) for k in range(2)]
    main(["validate", "--deployment", _pods(tmp_path, pods), "--cluster", small, "--duration", "30", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["unplaced"] and data["pools"][0]["prefill"] + data["pools"][0]["decode"] < 8


def test_bad_files_are_named_with_the_field_and_what_is_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = _pods(tmp_path, [_pod("p0", "prefill", "mistral-7b")])
    assert main(["validate", "--deployment", unknown]) == 2
    err = capsys.readouterr().err
    assert f"{unknown}: pod p0: metadata.labels llm-d.ai/model='mistral-7b'" in err and "llama-8b" in err
    no_pool = tmp_path / "nopool.yaml"
    no_pool.write_text(yaml.safe_dump({"kind": "Pod", "metadata": {"name": "a"}, "spec": {"containers": []}}))
    assert main(["validate", "--deployment", str(no_pool)]) == 2
    assert "no pod carries a model pool label (llm-d.ai/model" in capsys.readouterr().err
    bad_cluster = tmp_path / "bad.yaml"
    bad_cluster.write_text("version: v1\nnodes: [{name: a, gpuTemplate: {count: 2, model: H100, memoryMiB: lots}}]\n")
    assert main(["validate", "--deployment", EXAMPLE, "--cluster", str(bad_cluster)]) == 2
    assert f"{bad_cluster}: invalid cluster file: nodes.0.gpuTemplate.memoryMiB" in capsys.readouterr().err
    assert main(["validate", "--deployment", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read" in capsys.readouterr().err
    assert main(["validate", "--cluster", _cluster(tmp_path)]) == 2
    assert "--cluster needs --deployment" in capsys.readouterr().err
    assert main(["validate", "--deployment", EXAMPLE, "--config", "nope"]) == 2
    assert "--config 'nope' is unknown; choose one of: hami" in capsys.readouterr().err
    assert main(["validate", "nope", "--deployment", EXAMPLE]) == 2
    assert "bundled: healthy" in capsys.readouterr().err
