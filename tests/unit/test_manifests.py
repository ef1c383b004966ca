"""deploy/ manifests: valid Kubernetes objects (offline schemas), and consistent with each other and the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu import annotations as ann

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "manifests").glob("*.yaml"))
SCHEDULER_CONFIG = ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
K8S_VERSION = "1.33.1"
# Kinds with no OpenAPI schema in the apiserver (component config, not a served resource).
NO_SCHEMA = {"KubeSchedulerConfiguration"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _extender_docs() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in _docs(ROOT / "deploy" / "manifests" / "extender.yaml")}


@pytest.mark.parametrize("path", [*MANIFESTS, SCHEDULER_CONFIG], ids=lambda p: str(p.relative_to(ROOT)))
def test_manifests_validate_against_the_kubernetes_schemas(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _docs(path)
    assert docs, f"{path} holds no objects"
    for doc in docs:
        if doc["kind"] in NO_SCHEMA:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_scheduler_config_calls_the_extender_as_documented() -> None:
    (cfg,) = _docs(SCHEDULER_CONFIG)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["vgpu-scheduler"]
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is True and ext["ignorable"] is False
    assert ext["httpTimeout"] == "5s" and ext["weight"] == 1
    ignored = {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]}
    # Nodes advertise nvidia.com/gpu (device-plugin replicas), so kube-scheduler keeps counting it.
    assert ignored == {
        "nvidia.com/gpu": False,
        "nvidia.com/gpumem": True,
        "nvidia.com/gpumem-percentage": True,
        "nvidia.com/gpucores": True,
    }


def test_configmap_holds_the_same_scheduler_config() -> None:
    cm = _extender_docs()[("ConfigMap", "vgpu-scheduler-config")]
    (embedded,) = cm["data"].values()
    assert yaml.safe_load(embedded) == _docs(SCHEDULER_CONFIG)[0]
    scheduler = _extender_docs()[("Deployment", "vgpu-scheduler")]["spec"]["template"]["spec"]
    mount = scheduler["containers"][0]["volumeMounts"][0]["mountPath"]
    (key,) = cm["data"]
    assert f"--config={mount}/{key}" in scheduler["containers"][0]["command"]


def test_extender_deployment_matches_the_service_the_scheduler_calls() -> None:
    from urllib.parse import urlsplit

    from scheduler_extender.main import build_parser

    docs = _extender_docs()
    url = urlsplit(_docs(SCHEDULER_CONFIG)[0]["extenders"][0]["urlPrefix"])
    svc_name, svc_ns = url.hostname.split(".")[:2] if url.hostname else ("", "")
    svc = docs[("Service", svc_name)]
    assert svc["metadata"]["namespace"] == svc_ns
    assert [p["port"] for p in svc["spec"]["ports"]] == [url.port, 8080]  # the verbs (mTLS); metrics (plain)
    template = docs[("Deployment", "vgpu-extender")]["spec"]["template"]
    # The Service selects the pods' labels plus the one the leader sets on its own pod (leader election).
    selector = dict(svc["spec"]["selector"])
    assert selector.pop(ann.EXTENDER_LEADER_LABEL) == "true"
    assert selector.items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    args = build_parser().parse_args(container["args"])  # every flag must exist in vgpu-extender
    assert args.source == "kube" and args.port == url.port and args.leader_elect
    own_pod = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert own_pod == {"VGPU_EXTENDER_POD_NAME": "metadata.name", "VGPU_EXTENDER_POD_NAMESPACE": "metadata.namespace"}
    port, health = container["ports"]
    assert port["containerPort"] == url.port and svc["spec"]["ports"][0]["targetPort"] == port["name"]
    tls_mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tls")
    assert str(args.tls_cert_file).startswith(tls_mount) and str(args.tls_key_file).startswith(tls_mount)
    # mTLS on the verbs; kubelet probes (no client certificate) on the plain health port
    assert str(args.client_ca_file).startswith(tls_mount)
    assert health["containerPort"] == args.health_port != url.port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == health["name"] and container[probe]["httpGet"]["scheme"] == "HTTP"


def test_only_kube_scheduler_reaches_the_extenders_verbs() -> None:
    """The scheduler presents the client certificate its Secret holds; the NetworkPolicy admits only its pods to the
    verbs' port and leaves just the health port open."""
    docs = _extender_docs()
    (ext,) = _docs(SCHEDULER_CONFIG)[0]["extenders"]
    sched = docs[("Deployment", "vgpu-scheduler")]["spec"]["template"]["spec"]
    mount = next(m["mountPath"] for m in sched["containers"][0]["volumeMounts"] if m["name"] == "extender-client")
    # It trusts the extender's CA from the same Secret (ca.crt): no placeholder to fill in.
    assert ext["tlsConfig"] == {
        "caFile": f"{mount}/ca.crt",
        "certFile": f"{mount}/tls.crt",
        "keyFile": f"{mount}/tls.key",
    }
    assert next(v for v in sched["volumes"] if v["name"] == "extender-client")["secret"]["secretName"]
    policy = docs[("NetworkPolicy", "vgpu-extender")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vgpu-extender"}
    verbs, health = policy["ingress"]
    assert verbs["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vgpu-scheduler"}}}]
    assert [p["port"] for p in verbs["ports"]] == [8443] and [p["port"] for p in health["ports"]] == [8080]
    assert "from" not in health


@pytest.mark.parametrize(
    ("resource", "verb"),
    [
        ("nodes", "watch"),
        ("nodes", "list"),
        ("pods", "watch"),
        ("pods", "patch"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods/binding", "create"),
    ],
)
def test_extender_rbac_allows_what_it_does(resource: str, verb: str) -> None:
    rules = _extender_docs()[("ClusterRole", "vgpu-extender")]["rules"]
    assert any(resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_extender_rbac_allows_nothing_more() -> None:
    """Least privilege: scheduler_extender/kube.py records no events and reads no single node; the preempt verb lists
    PodDisruptionBudgets."""
    rules = _extender_docs()[("ClusterRole", "vgpu-extender")]["rules"]
    granted = {(res, verb) for r in rules for res in r["resources"] for verb in r["verbs"]}
    assert granted == {
        ("nodes", "list"),
        ("nodes", "watch"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "patch"),
        ("pods/binding", "create"),
        ("poddisruptionbudgets", "list"),
    }


WORKLOAD_FILES = (
    "deploy/manifests/extender.yaml",
    "deploy/webhook/deployment.yaml",
    "deploy/webhook/cert-job.yaml",
    "deploy/device-plugin/daemonset.yaml",
)


def _workloads() -> list[tuple[str, dict[str, Any]]]:
    kinds = {"Deployment", "DaemonSet", "Job"}
    return [(d["metadata"]["name"], d) for f in WORKLOAD_FILES for d in _docs(ROOT / f) if d["kind"] in kinds]


@pytest.mark.parametrize(("name", "doc"), _workloads(), ids=[n for n, _ in _workloads()])
def test_pod_security_of_every_shipped_workload(name: str, doc: dict[str, Any]) -> None:
    """docs/security.md, 'Pod security': non-root, read-only root, no capabilities, RuntimeDefault seccomp; the device
    plugin alone is privileged, and then root explicitly (the image's USER 10001 would leave it no capabilities)."""
    spec = doc["spec"]["template"]["spec"]
    for c in spec["containers"]:
        sc = c["securityContext"]
        if name == "vgpu-device-plugin":
            assert sc["privileged"] is True and sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
            continue
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0, name
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, name
        assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged"), name


@pytest.mark.parametrize(("name", "doc"), _workloads(), ids=[n for n, _ in _workloads()])
def test_no_service_links_in_any_shipped_workload(name: str, doc: dict[str, Any]) -> None:
    """The kubelet's <SERVICE>_PORT variables of vgpu-extender and vgpu-webhook share our env prefixes; the
    settings loader ignores them, and the pods do not get them in the first place."""
    assert doc["spec"]["template"]["spec"]["enableServiceLinks"] is False, name


def test_device_plugin_checks_assignments_against_the_extenders_resource_names(tmp_path: Path) -> None:
    """One set of names: the plugin's config carries the extender's defaults (the names the extender and the
    webhook use when the manifests set none)."""
    from device_plugin.config import load
    from scheduler_extender.settings import ExtenderSettings

    (cm,) = [d for d in _docs(ROOT / "deploy" / "device-plugin" / "daemonset.yaml") if d["kind"] == "ConfigMap"]
    path = tmp_path / "device-plugin.yaml"
    path.write_text(cm["data"]["device-plugin.yaml"])
    plugin = load(["--config", str(path), "--node-name", "gpu-1"], {})
    text = yaml.safe_load(cm["data"]["device-plugin.yaml"])
    assert {"resource_memory", "resource_memory_percentage", "resource_cores", "resource_priority"} <= set(text)
    extender_env = _extender_docs()[("Deployment", "vgpu-extender")]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not [e for e in extender_env if e["name"].startswith("VGPU_EXTENDER_RESOURCES__")]
    assert plugin.resource_names() == ExtenderSettings().resource_names()
