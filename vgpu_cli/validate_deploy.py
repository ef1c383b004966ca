"""`vgpu validate --deployment PODS.yaml [--cluster CLUSTER.yaml]`: the what-if on the user's own deployment.

The pods (Kubernetes Pod YAML, e.g. deploy/examples/llm-d-pd-pods.yaml) go through the same placement the
extender and `vgpu simulate` use (vgpu.whatif.placed.place_pods) on the cluster file, after its existing
allocations; every model pool with placed prefill and decode slices is then simulated with the named
scenario's workload (or `--trace`), routing and SLOs, one report row per pool (docs/validate.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vgpu.config import RequestDefaults, ResourceNames
from vgpu.devices import NodeInventory
from vgpu.errors import RequestError
from vgpu.perf.bench import configs
from vgpu.perf.params import GPUS, MODELS, PerfParams
from vgpu.pod import PodInfo, pod_info
from vgpu.roles import MODEL_LABELS, flag_in_text
from vgpu.whatif.deployment import Instance, Pool
from vgpu.whatif.placed import place_pods
from vgpu.whatif.userdeploy import match_gpu, match_model
from vgpu.whatif.verdict import diagnose
from vgpu.whatif.workload import Request
from vgpu_cli import files
from vgpu_cli.common import EXIT_FAILED, EXIT_OK, CliError

CONFIGS = {c.name: c for c in configs()}


def _model_texts(manifest: dict[str, Any], identity: str) -> list[str]:
    """The pool label's value and every container's --model argument (vLLM's flag)."""
    texts = [identity.split("/", 1)[1]]
    for c in (manifest.get("spec") or {}).get("containers") or []:
        if isinstance(c, dict):
            words = [str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])]]
            texts.append(flag_in_text(" ".join(words), "--model") or "")
    return texts


def _parse(
    name: str, manifests: list[dict[str, Any]], defaults: RequestDefaults
) -> tuple[list[PodInfo], dict[str, Any]]:
    """PodInfos in file order (with the configuration's request defaults, as pd-bench parses them) and each
    pool's model spec; CliError naming the file, pod and field."""
    infos: list[PodInfo] = []
    models: dict[str, Any] = {}
    for m in manifests:
        pod_name = m["metadata"]["name"]
        try:
            info = pod_info(m, ResourceNames(), defaults)
        except RequestError as exc:
            raise CliError(f"{name}: pod {pod_name}: {exc}") from None
        infos.append(info)
        if info.model is not None and info.model not in models:
            spec = match_model(_model_texts(m, info.model))
            if spec is None:
                raise CliError(
                    f"{name}: pod {pod_name}: metadata.labels {MODEL_LABELS[0]}={info.model.split('/', 1)[1]!r} "
                    f"(or the container's --model) names no model the what-if knows; it must contain one of: "
                    f"{', '.join(MODELS)} (every dash-separated part, e.g. llama-3.1-8b-instruct for llama-8b)"
                )
            models[info.model] = spec
    if not models:
        raise CliError(
            f"{name}: no pod carries a model pool label ({', '.join(MODEL_LABELS)}): the what-if simulates model pools"
        )
    return infos, models


def _gpu_model(nodes: list[NodeInventory], uuid: str) -> str:
    return next((g.model for n in nodes for g in n.gpus if g.uuid == uuid), "")


def _pool_row(
    identity: str, spec: Any, instances: list[Instance], nodes: list[NodeInventory]
) -> tuple[dict[str, Any], Pool | None]:
    n_p = sum(i.role == "prefill" for i in instances)
    row: dict[str, Any] = {"pool": identity, "model": spec.name, "prefill": n_p, "decode": len(instances) - n_p}
    row["slices"] = [
        {"name": i.name, "role": i.role, "gpu": i.gpu, "node": i.node, "smShare": round(i.sm_share, 3),
         "memoryGB": round(i.memory_gb, 1), "tp": i.tp, "slowdown": round(i.slowdown, 3)}
        for i in instances
    ]  # fmt: skip
    if not instances:
        row["notSimulated"] = "no prefill or decode pod of this pool was placed"
        return row, None
    gpu_models = sorted({_gpu_model(nodes, i.gpu) for i in instances})
    gpu_model = gpu_models[0]
    row["gpu"] = "+".join(gpu_models)
    if len(gpu_models) > 1:
        row["notSimulated"] = f"slices on different GPU models {gpu_models}: the simulation takes one GPU spec per pool"
        return row, None
    gpu = match_gpu(gpu_model)
    if gpu is None:
        row["notSimulated"] = f"GPU model {gpu_model!r} has no performance spec (known: {', '.join(GPUS)})"
        return row, None
    pool = Pool(spec, gpu, tuple(instances))
    try:
        pool.check()
    except ValueError as exc:
        row["notSimulated"] = str(exc)
        return row, None
    return row, pool


def run(args: argparse.Namespace, scenario: Any, requests: list[Request]) -> int:
    if args.config not in CONFIGS:
        raise CliError(f"--config {args.config!r} is unknown; choose one of: {', '.join(CONFIGS)}")
    nodes, allocations = files.load_cluster(args.cluster)
    manifests = files.load_workload(args.deployment)
    infos, models = _parse(args.deployment, manifests, CONFIGS[args.config].defaults)
    params = PerfParams(layerwise_kv=args.layerwise_kv)
    placed = place_pods(infos, nodes, allocations, CONFIGS[args.config].placement, params)
    rows: list[dict[str, Any]] = []
    missed = False
    for identity, instances in placed.pools.items():
        row, pool = _pool_row(identity, models[identity], instances, nodes)
        if pool is not None:
            rep, verdict = diagnose(pool, requests, scenario.policy, scenario.slos, params)
            row |= {"report": rep.as_dict(), "layer": verdict.layer, "verdict": verdict.text(rep)}
            if verdict.fix is not None:
                row["whatIf"] = {"change": verdict.fix.change, "report": verdict.fix.report.as_dict()}
            missed = missed or not rep.slo_met
        rows.append(row)
    not_in_pool = [i.key for i in infos if i.model is None]
    doc = {
        "cluster": args.cluster or f"<bundled {files.DEMO_CLUSTER}>",
        "deployment": args.deployment,
        "config": args.config,
        "workload": scenario.name if not args.trace else args.trace,
        "routing": scenario.policy,
        "slos": {"ttftSeconds": scenario.slos.ttft_s, "tpotSeconds": scenario.slos.tpot_s},
        "pools": rows,
        "unplaced": placed.unplaced,
        "notInPool": not_in_pool,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(render(doc, len(requests)))
    simulated = any("report" in r for r in rows)
    return EXIT_FAILED if missed or not simulated else EXIT_OK


def render(doc: dict[str, Any], n_requests: int) -> str:
    head = ["POOL", "MODEL", "GPU", "P/D", "SLO", "TTFT p50/p99 ms", "TPOT p99 ms", "VERDICT"]
    table = [head]
    for r in doc["pools"]:
        rep = r.get("report")
        pd = f"{r['prefill']}/{r['decode']}"
        if rep is None:
            table.append([r["pool"], r["model"], r.get("gpu", "-"), pd, "-", "-", "-", "not simulated"])
            continue
        table.append(
            [r["pool"], r["model"], r["gpu"], pd, f"{rep['slo_attainment']:.0%}",
             f"{rep['ttft_p50_s'] * 1000:.0f} / {rep['ttft_p99_s'] * 1000:.0f}", f"{rep['tpot_p99_s'] * 1000:.1f}",
             "SLO met" if rep["slo_met"] else r["layer"]]
        )  # fmt: skip
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip() for t in table]
    notes = [f"{r['pool']}: {r['verdict']}" for r in doc["pools"] if "verdict" in r]
    notes += [f"{r['pool']}: not simulated: {r['notSimulated']}" for r in doc["pools"] if "notSimulated" in r]
    notes += [f"unplaced {k}: {why}" for k, why in doc["unplaced"].items()]
    notes += [f"not in a model pool (no {MODEL_LABELS[0]} label): {k}" for k in doc["notInPool"]]
    title = (
        f"deployment {doc['deployment']} placed by the planner ({doc['config']}) on {doc['cluster']}; "
        f"workload {doc['workload']}: {n_requests} requests, routing {doc['routing']}; "
        f"SLO TTFT {doc['slos']['ttftSeconds'] * 1000:.0f} ms, TPOT {doc['slos']['tpotSeconds'] * 1000:.0f} ms"
    )
    return "\n".join([title, "", *lines, "", *notes]) + "\n"
