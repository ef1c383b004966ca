"""The webhook registered with a real kube-apiserver by clientConfig.url + caBundle.

The MutatingWebhookConfiguration is the shipped one (deploy/webhook/), so its selectors and its CEL
matchConditions are compiled and evaluated by the real apiserver; only clientConfig is swapped for our
loopback URL, and the namespaceSelector is narrowed to this test's namespaces so that other tests of
the session never reach (or wait on) this webhook.
"""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from vgpu.annotations import NODE_INVENTORY, POD_USE_GPU_MODELS, decode_inventory
from webhook import cert_job, certs
from webhook.config import WebhookConfig
from webhook.inventory import NodeAnnotationInventory
from webhook.main import build_server
from webhook.runner import TlsServer
from webhook.testing import node_annotation

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PODS = REPO / "tests" / "data" / "pods"
CONFIG = REPO / "deploy" / "webhook" / "mutatingwebhookconfiguration.yaml"


def _pod(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load((PODS / name).read_text())
    pod["metadata"].pop("namespace", None)
    return pod


# This module's card: a model no other e2e module puts in the shared cluster, so pods pinned to it size exactly.
MODEL = "NVIDIA-H100-PCIe"


@pytest.fixture
def webhook(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    cp = control_plane
    api = cp.api_client()
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    tag = uuid.uuid4().hex[:6]
    # A node whose device plugin advertised 2 x 81559 MiB GPUs.
    node = f"wh-{tag}"
    cp.add_node(node, annotations=node_annotation([(MODEL, 81559)] * 2, node))
    opted_out = f"{namespace}-off"
    core.create_namespace({"metadata": {"name": opted_out, "labels": {"vgpu.io/webhook": "disabled"}}})

    pki = certs.write_dev_certs(tmp_path, ("localhost", "127.0.0.1"))
    cfg = WebhookConfig(host="127.0.0.1", port=0, cert_file=str(pki.cert), key_file=str(pki.key))
    inventory = NodeAnnotationInventory(api=client.CoreV1Api(cp.api_client()))
    inventory.start()
    assert inventory.wait_synced(60)
    registry = CollectorRegistry()
    server: TlsServer = build_server(cfg, inventory, registry).start()

    doc = yaml.safe_load(CONFIG.read_text())
    doc["metadata"] = {"name": f"vgpu-webhook-e2e-{tag}"}
    hook = doc["webhooks"][0]
    hook["clientConfig"] = {
        "url": f"https://127.0.0.1:{server.port}/mutate",
        "caBundle": base64.b64encode(pki.ca_cert.read_bytes()).decode(),
    }
    hook["namespaceSelector"]["matchExpressions"].append(
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace, opted_out]}
    )
    admission.create_mutating_webhook_configuration(doc)
    try:
        _wait_until_active(core, namespace)
        yield {"core": core, "ns": namespace, "off": opted_out, "registry": registry, "server": server, "node": node}
    finally:
        admission.delete_mutating_webhook_configuration(doc["metadata"]["name"])
        server.tls.stop()
        server.stop()
        inventory.stop()
        client.CoreV1Api(cp.api_client()).delete_node(node)


def _wait_until_active(core: Any, namespace: str) -> None:
    """The apiserver picks up new webhook configurations asynchronously: probe with a dry-run create."""
    probe = _pod("plain-gpu.yaml")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        created = core.create_namespaced_pod(namespace, probe, dry_run="All")
        if (created.metadata.labels or {}).get("vgpu.io/managed") == "true":
            return
        time.sleep(0.2)
    raise AssertionError("webhook configuration never became active")


def _reviews(registry: CollectorRegistry) -> float:
    return sum(
        registry.get_sample_value("vgpu_webhook_reviews_total", {"endpoint": "mutate", "outcome": o}) or 0.0
        for o in ("skipped", "admitted", "mutated", "denied", "error")
    )


@pytest.mark.parametrize(
    ("file", "role", "source"),
    [
        ("llmd-vllm-prefill-nixl.yaml", "prefill", "label"),
        ("llmd-vllm-decode-sidecar.yaml", "decode", "label"),
        ("sglang-decode-shell.yaml", "decode", "sglang-arg"),
        ("vllm-prefill-kv-producer.yaml", "prefill", "kv-transfer-config"),
        ("decode-sidecar-nolabel.yaml", "decode", "routing-sidecar"),
    ],
)
def test_pods_come_back_mutated(webhook: dict[str, Any], file: str, role: str, source: str) -> None:
    core = webhook["core"]
    created = core.create_namespaced_pod(webhook["ns"], _pod(file))
    stored = core.read_namespaced_pod(created.metadata.name, webhook["ns"])
    labels = stored.metadata.labels
    assert labels["vgpu.io/role"] == role and labels["vgpu.io/role-source"] == source
    assert labels["vgpu.io/managed"] == "true"
    assert stored.spec.scheduler_name == "vgpu-scheduler"


def _on_this_card(file: str) -> dict[str, Any]:
    """The corpus pod pinned to this module's card, so the fractions are exact whatever GPU nodes other e2e
    modules of the session left in the cluster (a MiB request is sized for the largest card it may get)."""
    pod = _pod(file)
    pod["metadata"].setdefault("annotations", {})[POD_USE_GPU_MODELS] = MODEL
    return pod


def test_model_servers_stored_with_their_memory_flag(webhook: dict[str, Any], control_plane: ControlPlane) -> None:
    """The apiserver applies the webhook's args patches: an entry appended to a command-only SGLang pod, a shell
    line rewritten in place for vLLM (pinned to one H100 size: exact fractions, docs/model-servers.md); a
    user's own fraction is kept and kubectl prints why it does not fit."""
    core = webhook["core"]
    sglang = core.create_namespaced_pod(webhook["ns"], _on_this_card("sglang-prefill.yaml"))
    # 60 % of 81559 MiB = 48935, less SGLang's reserve for chunked prefill 8192, tp 2 (14080): / 81559.
    assert sglang.spec.containers[0].args == ["--mem-fraction-static=0.4273"]
    assert sglang.spec.containers[0].command == _pod("sglang-prefill.yaml")["spec"]["containers"][0]["command"]
    vllm = core.create_namespaced_pod(webhook["ns"], _on_this_card("vllm-decode-kv-consumer.yaml"))
    (line,) = vllm.spec.containers[0].args
    # (30000 - 1500 margin) / 81559
    assert line.startswith("vllm serve --gpu-memory-utilization=0.3494 Qwen/Qwen2.5-7B-Instruct --port 8100")
    stored = core.read_namespaced_pod(vllm.metadata.name, webhook["ns"])
    assert stored.spec.containers[0].args == [line]
    own = _on_this_card("vllm-user-fraction.yaml")
    result = control_plane.kubectl("create", "-n", webhook["ns"], "-f", "-", input=yaml.safe_dump(own))
    assert (
        "Warning: container 'vllm': --gpu-memory-utilization=0.9 (kept as set) lets the server take 73404 MiB of a "
        "81559 MiB card, more than its 20000 MiB slice; at most 0.2326 keeps it inside" in result.stderr
    ), result.stderr
    kept = core.read_namespaced_pod("vllm-own-fraction", webhook["ns"])
    assert kept.spec.containers[0].args == own["spec"]["containers"][0]["args"]


def test_generate_name_pod_gets_default_count(webhook: dict[str, Any]) -> None:
    core = webhook["core"]
    created = core.create_namespaced_pod(webhook["ns"], _pod("generate-name.yaml"))
    assert created.metadata.name.startswith("vllm-small-6b7f9d-")
    (vllm,) = created.spec.containers
    assert vllm.resources.limits["nvidia.com/gpu"] == "1"
    assert vllm.resources.requests["nvidia.com/gpu"] == "1"
    assert created.metadata.labels["vgpu.io/gpumem"] == "8000"


@pytest.mark.parametrize(
    ("file", "fragments"),
    [
        ("invalid-percentage-150.yaml", ["container 'vllm'", "nvidia.com/gpumem-percentage", "1..100"]),
        ("invalid-both-memory.yaml", ["container 'vllm'", "only one of"]),
        ("invalid-init-container-gpu.yaml", ["container 'warmup'", "app containers only"]),
        # Cluster-dependent: the bounds come from the node inventory annotations the webhook watches; other
        # tests of the session add nodes too, so the expected bounds are read from the apiserver below.
        ("invalid-memory-too-large.yaml", ["container 'vllm'", "nvidia.com/gpumem", "1..{max_mem} MiB"]),
        ("invalid-too-many-gpus.yaml", ["container 'vllm'", "nvidia.com/gpu", "1..{max_gpus}"]),
    ],
)
def test_invalid_pods_are_refused_with_the_message(webhook: dict[str, Any], file: str, fragments: list[str]) -> None:
    from kubernetes.client.exceptions import ApiException

    inventories = [
        decode_inventory(raw)
        for n in webhook["core"].list_node().items
        if (raw := (n.metadata.annotations or {}).get(NODE_INVENTORY))
    ]
    bounds = {
        "max_mem": max(g.memory_mib for inv in inventories for g in inv),
        "max_gpus": max(len(inv) for inv in inventories),
    }
    fragments = [f.format(**bounds) for f in fragments]
    with pytest.raises(ApiException) as info:
        webhook["core"].create_namespaced_pod(webhook["ns"], _pod(file))
    assert info.value.status == 400
    message = json.loads(info.value.body)["message"]  # the Status the client receives
    assert message.startswith('admission webhook "mutate.vgpu.io" denied the request: ')
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_warnings_reach_kubectl(webhook: dict[str, Any], control_plane: ControlPlane) -> None:
    pod = _pod("plain-gpu.yaml")
    result = control_plane.kubectl("create", "-n", webhook["ns"], "-f", "-", input=yaml.safe_dump(pod))
    assert "Warning: container 'cuda-vectoradd': no nvidia.com/gpumem" in result.stderr, result.stderr


def test_hami_annotations_reach_kubectl_as_warnings_and_bad_ones_are_denied(
    webhook: dict[str, Any], control_plane: ControlPlane
) -> None:
    """A HAMi pod giving kube-vgpu's key too: admitted, kubectl prints which key won; a value HAMi does not define is
    denied naming the annotation (docs/migrating-from-hami.md)."""
    pod = _pod("plain-gpu.yaml")
    pod["metadata"]["name"] = "hami-both"
    pod["metadata"]["annotations"] = {"vgpu.io/gpu-policy": "binpack", "hami.io/gpu-scheduler-policy": "spread"}
    result = control_plane.kubectl("create", "-n", webhook["ns"], "-f", "-", input=yaml.safe_dump(pod))
    assert (
        "Warning: hami.io/gpu-scheduler-policy is ignored: vgpu.io/gpu-policy is set and kube-vgpu's own key wins"
        in result.stderr
    ), result.stderr
    pod["metadata"]["name"] = "hami-bad"
    pod["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": "GPU 0"}
    result = control_plane.kubectl("create", "-n", webhook["ns"], "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert result.returncode != 0
    assert "annotation nvidia.com/use-gpuuuid='GPU 0' is invalid; allowed: comma-separated GPU UUIDs" in result.stderr


def test_opt_outs_and_non_gpu_pods_never_reach_the_webhook(webhook: dict[str, Any]) -> None:
    core, registry = webhook["core"], webhook["registry"]
    before = _reviews(registry)
    # Pod label opt-out: an out-of-range request is not even seen, and nothing is mutated.
    pod = _pod("invalid-percentage-150.yaml")
    pod["metadata"]["labels"] = {"vgpu.io/webhook": "disabled"}
    created = core.create_namespaced_pod(webhook["ns"], pod)
    assert "vgpu.io/managed" not in (created.metadata.labels or {})
    assert created.spec.scheduler_name == "default-scheduler"
    # Namespace opt-out.
    created = core.create_namespaced_pod(webhook["off"], _pod("plain-gpu.yaml"))
    assert not created.metadata.labels and created.spec.scheduler_name == "default-scheduler"
    # matchConditions: a pod without vGPU resources is never sent.
    created = core.create_namespaced_pod(webhook["ns"], _pod("plain-no-gpu.yaml"))
    assert created.spec.scheduler_name == "default-scheduler"
    assert _reviews(registry) == before


def test_cert_job_sets_secret_and_ca_bundle(control_plane: ControlPlane, namespace: str) -> None:
    from kubernetes import client

    api = control_plane.api_client()
    core, admission = client.CoreV1Api(api), client.AdmissionregistrationV1Api(api)
    doc = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    name = f"vgpu-webhook-certjob-{uuid.uuid4().hex[:6]}"
    doc["metadata"] = {"name": name}
    # Never called: it selects no namespace at all.
    doc["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"kube-vgpu.e2e/never": name}}
    admission.create_mutating_webhook_configuration(doc)
    try:
        hosts = ("vgpu-webhook", "vgpu-webhook.kube-system.svc")
        kw = {"core": core, "admission": admission, "namespace": namespace, "secret": "tls", "hosts": hosts}
        assert cert_job.install(**kw, mutating=[name]) is True
        assert cert_job.install(**kw, mutating=[name]) is False  # still valid: kept
        secret = core.read_namespaced_secret("tls", namespace)
        bundle = admission.read_mutating_webhook_configuration(name).webhooks[0].client_config.ca_bundle
        assert bundle == secret.data["ca.crt"]
    finally:
        admission.delete_mutating_webhook_configuration(name)
