"""The Helm chart deploy/helm/kube-vgpu, rendered by the real helm (hack/build-helm.sh).

- `helm lint --strict` passes with the defaults and with every component toggled;
- every rendering is made of valid Kubernetes objects (offline schemas, as tests/unit/test_manifests.py does);
- with the defaults the chart renders exactly the objects of the plain manifests under deploy/ and, object by
  object, the same spec (names, images, args, probes, security contexts, RBAC rules, ports, volumes ...), so the
  two cannot drift apart; the configs it renders load through the programs' own loaders with the same result;
- values reach the objects (resource names, extender flags, TLS modes) and bad values fail with the schema's message;
- the extender's mutual-TLS certificates in each extender.tls.mode: generated ones verify (serving certificate for
  the Service's names, client certificate from the CA the extender trusts), cert-manager's objects, your own Secrets,
  and kube-scheduler's tlsConfig names the files the mounted Secrets hold;
- every env variable and argument the chart gives our containers loads through that service's own settings loader.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helm_chart import CHART, NAMESPACE, ROOT, by_key, run_helm, template, template_error

DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33.1"  # as tests/unit/test_manifests.py
CRD_KINDS = {
    "Issuer": "cert-manager.io/v1",
    "Certificate": "cert-manager.io/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
}
COMPONENTS = ("extender", "scheduler", "webhook", "devicePlugin", "admissionPolicy")
ALL_OFF: dict[str, Any] = {f"{c}.enabled": False for c in COMPONENTS}
EVERYTHING: dict[str, Any] = {
    "monitoring.serviceMonitor.enabled": True,
    "monitoring.grafanaDashboard.enabled": True,
    "webhook.tls.mode": "certManager",
}
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-off": ALL_OFF,
    **{f"only-{c}": {**ALL_OFF, f"{c}.enabled": True} for c in COMPONENTS},
    "everything": EVERYTHING,
    "webhook-own-secret": {"webhook.tls.mode": "secret", "webhook.tls.caBundle": "Q0EgUEVN"},
    "monitoring-without-components": {**ALL_OFF, **EVERYTHING},
    "extender-ha": {"extender.replicas": 3},
    "extender-cert-manager": {"extender.tls.mode": "certManager"},
    "extender-cert-manager-own-issuer": {
        "extender.tls.mode": "certManager",
        "extender.tls.certManager.issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"},
    },
    "extender-own-secrets": {"extender.tls.mode": "secret", "scheduler.extenderCAData": "Q0E="},
    "device-plugin-mps-hami-core": {
        "devicePlugin.config.mps": True,
        "devicePlugin.config.mps_pipe_dir": "/run/nvidia-mps/pipe",
        "devicePlugin.config.hami_core_library": "/usr/local/vgpu/libvgpu.so",
        "devicePlugin.config.hami_core_dir": "/usr/local/vgpu/kube-vgpu",
    },
}
# What the chart adds to the manifests by default: the extender's certificates (extender.tls.mode generate); the
# manifests leave them to the admin (deploy/manifests/extender.yaml's header).
GENERATED = {("Secret", "vgpu-extender-tls"), ("Secret", "vgpu-extender-client")}


def _docs(*paths: str) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all((DEPLOY / p).read_text()) if d]


WEBHOOK_FILES = (
    "webhook/deployment.yaml",
    "webhook/mutatingwebhookconfiguration.yaml",
    "webhook/validatingwebhookconfiguration.yaml",
)


def manifests(component: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The plain manifests' objects of one component (webhook: with the cert Job, the chart's default)."""
    if component in ("extender", "scheduler"):
        prefix = "vgpu-extender" if component == "extender" else "vgpu-scheduler"
        return {k: d for k, d in by_key(_docs("manifests/extender.yaml")).items() if k[1].startswith(prefix)}
    if component == "webhook":
        return by_key(_docs(*WEBHOOK_FILES, "webhook/cert-job.yaml"))
    if component == "devicePlugin":
        return by_key(_docs("device-plugin/daemonset.yaml"))
    if component == "admissionPolicy":
        return by_key(_docs("manifests/admission-policy.yaml"))
    raise KeyError(component)


def all_manifests() -> dict[tuple[str, str], dict[str, Any]]:
    return {k: d for c in COMPONENTS for k, d in manifests(c).items()}


def _pod_spec_normalized(template_: dict[str, Any]) -> None:
    ann = template_.get("metadata", {}).get("annotations", {})
    for key in [k for k in ann if k.startswith("checksum/")]:
        del ann[key]
    if "annotations" in template_.get("metadata", {}) and not ann:
        del template_["metadata"]["annotations"]
    for c in template_["spec"]["containers"]:
        # The manifests' images have fixed tags, for which the API's default pull policy is IfNotPresent.
        c.setdefault("imagePullPolicy", "IfNotPresent")


def normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between the chart and the manifests: everything but metadata other than the name and
    namespace (the chart adds Helm's labels), with embedded config files parsed and CEL whitespace ignored."""
    out = {k: copy.deepcopy(v) for k, v in doc.items() if k != "metadata"}
    out["metadata"] = {k: doc["metadata"][k] for k in ("name", "namespace") if k in doc["metadata"]}
    if doc["kind"] in ("Deployment", "DaemonSet", "Job"):
        _pod_spec_normalized(out["spec"]["template"])
    if doc["kind"] == "ConfigMap":
        out["data"] = {
            k: json.loads(v) if k.endswith(".json") else yaml.safe_load(v) for k, v in out.get("data", {}).items()
        }
    if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for wh in out["webhooks"]:
            for cond in wh.get("matchConditions", []):
                cond["expression"] = "".join(cond["expression"].split())
    return out


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    c: dict[str, Any] = container
    return c


def _extender_settings(doc: dict[str, Any]) -> Any:
    """The ExtenderSettings vgpu-extender builds from the container's args and env (no config file)."""
    from scheduler_extender.main import build_parser
    from scheduler_extender.settings import load

    c = _container(doc)
    args = build_parser().parse_args(c["args"])
    # The downward API's fields stand in as "<fieldPath>", so both sides must take them from the same place.
    env = {e["name"]: e.get("value") or f"<{e['valueFrom']['fieldRef']['fieldPath']}>" for e in c.get("env", [])}
    return load(flags={k: v for k, v in vars(args).items() if k != "config"}, env=env, config_file=None)


def _webhook_config(doc: dict[str, Any], tmp_path: Path) -> Any:
    from webhook.config_load import load

    path = tmp_path / "webhook.yaml"
    path.write_text(doc["data"]["webhook.yaml"])
    return load(argv=["--config", str(path)], environ={})


# --------------------------------------------------------------------------------------------------------------
# lint and schema validity


def _set_args(values: dict[str, Any]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_helm_lint_strict(helm: str, variant: str) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *_set_args(VARIANTS[variant]))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_objects_are_valid_kubernetes_objects(helm: str, variant: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = template(helm, VARIANTS[variant])
    for doc in docs:
        if doc["kind"] in CRD_KINDS:  # custom resources: no schema in the apiserver's OpenAPI
            assert doc["apiVersion"] == CRD_KINDS[doc["kind"]]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        ns = doc["metadata"].get("namespace")
        assert ns in (None, NAMESPACE), (doc["kind"], doc["metadata"]["name"])
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "kube-vgpu" and labels.get("app.kubernetes.io/instance")


def test_all_components_off_renders_nothing(helm: str) -> None:
    assert template(helm, ALL_OFF) == []


# --------------------------------------------------------------------------------------------------------------
# the chart and the manifests: same objects, same specs


def test_defaults_render_exactly_the_manifests_objects(helm: str) -> None:
    assert set(by_key(template(helm))) == set(all_manifests()) | GENERATED


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_switches_its_own_objects(helm: str, component: str) -> None:
    # The generated certificates follow the extender, which trusts them.
    generated = GENERATED if component == "extender" else set()
    only = set(by_key(template(helm, {**ALL_OFF, f"{component}.enabled": True})))
    assert only == set(manifests(component)) | generated
    without = set(by_key(template(helm, {f"{component}.enabled": False})))
    assert without == (set(all_manifests()) | GENERATED) - set(manifests(component)) - generated


def assert_same_object(ours: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The chart's object is the manifest's, up to Helm's labels and two spelled-out defaults."""
    key = (manifest["kind"], manifest["metadata"]["name"])
    # Every label of the manifest (app.kubernetes.io/name, part-of) is on the chart's object.
    assert manifest["metadata"].get("labels", {}).items() <= ours["metadata"]["labels"].items(), key
    a, b = normalized(ours), normalized(manifest)
    if key == ("Deployment", "vgpu-extender"):
        # The chart passes every extender setting explicitly: the program must end up with the same settings.
        assert _extender_settings(ours) == _extender_settings(manifest)
        assert set(_container(manifest)["args"]) <= set(_container(ours)["args"])
        for d in (a, b):
            del _container(d)["args"], _container(d)["env"]
    if key == ("ConfigMap", "vgpu-webhook"):
        from webhook.config import WebhookConfig

        res = a["data"]["webhook.yaml"].pop("resources")  # the chart spells out the resource names
        default = WebhookConfig()
        assert res == {
            "count": default.resource_count,
            "memory": default.resource_memory,
            "memoryPercentage": default.resource_memory_percentage,
            "cores": default.resource_cores,
            "priority": default.resource_priority,
        }
    assert a == b, key


def test_default_objects_equal_the_manifests(helm: str) -> None:
    chart = by_key(template(helm))
    for key, manifest in all_manifests().items():
        assert_same_object(chart[key], manifest)
        if key[0] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            # The manifests carry cert-manager's inject annotation always; the chart only in certManager mode.
            assert "annotations" not in chart[key]["metadata"]


def test_scheduler_configmap_is_the_shipped_kube_scheduler_config(helm: str) -> None:
    cm = by_key(template(helm))[("ConfigMap", "vgpu-scheduler-config")]
    shipped = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    assert yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"]) == shipped


def test_cert_job_is_a_hook_that_runs_on_install_and_upgrade(helm: str) -> None:
    job = by_key(template(helm))[("Job", "vgpu-webhook-certs")]
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation"
    # The Job patches what the chart installs: both webhook configurations, and the Secret the webhook mounts.
    chart = by_key(template(helm))
    args = _container(job)["args"]
    assert "--mutating=vgpu-webhook" in args and "--validating=vgpu-webhook" in args
    secret = chart[("Deployment", "vgpu-webhook")]["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    assert f"--secret={secret}" in args
    no_validating = _container(
        by_key(template(helm, {"webhook.validatingWebhook": False}))[("Job", "vgpu-webhook-certs")]
    )
    assert "--validating=vgpu-webhook" not in no_validating["args"]


def test_cert_manager_mode_renders_certificate_yaml(helm: str) -> None:
    chart = by_key(template(helm, {"webhook.tls.mode": "certManager"}))
    expected = {**by_key(_docs(*WEBHOOK_FILES, "webhook/certificate.yaml"))}
    assert {k for k in chart if k[1].startswith("vgpu-webhook")} == set(expected)
    for key, manifest in expected.items():
        assert_same_object(chart[key], manifest)
        if "annotations" in manifest["metadata"]:  # the CA injector's annotation
            assert chart[key]["metadata"]["annotations"] == manifest["metadata"]["annotations"], key


def test_own_secret_mode_sets_the_ca_bundle(helm: str) -> None:
    chart = by_key(template(helm, {"webhook.tls.mode": "secret", "webhook.tls.caBundle": "Q0EgUEVN"}))
    assert ("Job", "vgpu-webhook-certs") not in chart and ("Certificate", "vgpu-webhook") not in chart
    hooks = [
        wh
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for wh in chart[(kind, "vgpu-webhook")]["webhooks"]
    ]
    assert [wh["name"] for wh in hooks] == ["mutate.vgpu.io", "validate.vgpu.io", "evict.vgpu.io"]
    assert all(wh["clientConfig"]["caBundle"] == "Q0EgUEVN" for wh in hooks)


def test_monitoring_renders_servicemonitor_yaml_and_the_dashboard(helm: str) -> None:
    values = {"monitoring.serviceMonitor.enabled": True, "monitoring.grafanaDashboard.enabled": True}
    chart = by_key(template(helm, {**values, "monitoring.serviceMonitor.labels": {"release": "prometheus"}}))
    for key, manifest in by_key(_docs("prometheus/servicemonitor.yaml")).items():
        assert_same_object(chart[key], manifest)
        assert chart[key]["metadata"]["labels"]["release"] == "prometheus"
    dash = chart[("ConfigMap", "vgpu-grafana-dashboard")]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((DEPLOY / "grafana" / "kube-vgpu-dashboard.json").read_text())
    assert json.loads(dash["data"]["kube-vgpu-dashboard.json"]) == shipped
    # Each monitor follows its component; the dashboard can go elsewhere (where the Grafana sidecar looks).
    keys = set(
        by_key(
            template(helm, {**values, "extender.enabled": False, "monitoring.grafanaDashboard.namespace": "grafana"})
        )
    )
    assert ("PodMonitor", "vgpu-device-plugin") in keys and ("ServiceMonitor", "vgpu-extender") not in keys
    moved = by_key(template(helm, {**values, "monitoring.grafanaDashboard.namespace": "grafana"}))
    assert moved[("ConfigMap", "vgpu-grafana-dashboard")]["metadata"]["namespace"] == "grafana"


# --------------------------------------------------------------------------------------------------------------
# values reach the objects


def test_extender_values_become_its_settings(helm: str) -> None:
    values = {
        "extender.nodePolicy": "spread",
        "extender.gpuPolicy": "binpack",
        "extender.narrowFilter": True,
        "extender.filterAnswersOne": True,
        "extender.priorityMapping": "minmax",
        "extender.allocationMetrics": "per-node",
        "extender.bindGraceSeconds": 45,
        "extender.relearnIntervalSeconds": 120,
        "extender.requeueMaxPods": 7,
        "extender.requeueIntervalSeconds": 0.5,
        "extender.logLevel": "debug",
        "extender.logFormat": "text",
        "extender.port": 9443,
        "extender.tls.secretName": "my-extender-tls",
    }
    chart = by_key(template(helm, values))
    dep = chart[("Deployment", "vgpu-extender")]
    s = _extender_settings(dep)
    assert (s.node_policy, s.gpu_policy, s.narrow_filter, s.priority_mapping) == ("spread", "binpack", True, "minmax")
    assert (s.bind_grace_seconds, s.relearn_interval_seconds, s.log_level, s.log_format) == (45, 120, "debug", "text")
    assert s.port == 9443 and s.source == "kube" and s.requeue_max_pods == 7
    assert s.requeue_interval_seconds == 0.5 and s.filter_answers_one and s.allocation_metrics == "per-node"
    assert dep["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] == "my-extender-tls"
    assert chart[("Service", "vgpu-extender")]["spec"]["ports"][0]["port"] == 9443
    cfg = yaml.safe_load(chart[("ConfigMap", "vgpu-scheduler-config")]["data"]["kube-scheduler-config.yaml"])
    assert cfg["extenders"][0]["urlPrefix"] == f"https://vgpu-extender.{NAMESPACE}.svc:9443"


def test_resource_names_reach_every_component(helm: str, tmp_path: Path) -> None:
    from device_plugin.config import load as load_plugin

    names = {
        "count": "example.com/vgpu",
        "memory": "example.com/vmem",
        "memoryPercentage": "example.com/vmem-pct",
        "cores": "example.com/vcores",
        "priority": "example.com/vprio",
    }
    chart = by_key(template(helm, {f"resourceNames.{k}": v for k, v in names.items()}))
    # kube-scheduler: the managed resources, only the count counted by kube-scheduler itself
    cfg = yaml.safe_load(chart[("ConfigMap", "vgpu-scheduler-config")]["data"]["kube-scheduler-config.yaml"])
    managed = {r["name"]: r["ignoredByScheduler"] for r in cfg["extenders"][0]["managedResources"]}
    assert managed == {
        names["count"]: False,
        names["memory"]: True,
        names["memoryPercentage"]: True,
        names["cores"]: True,
    }
    # the extender
    rn = _extender_settings(chart[("Deployment", "vgpu-extender")]).resource_names()
    assert (rn.count, rn.memory, rn.memory_percentage, rn.cores, rn.priority) == tuple(names.values())
    # the webhook's config and the pods its configurations send it
    wh = _webhook_config(chart[("ConfigMap", "vgpu-webhook")], tmp_path)
    assert (wh.resource_count, wh.resource_memory, wh.resource_cores, wh.resource_priority) == (
        names["count"],
        names["memory"],
        names["cores"],
        names["priority"],
    )
    assert wh.resource_memory_percentage == names["memoryPercentage"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hook = chart[(kind, "vgpu-webhook")]["webhooks"][0]  # the pod checks (the eviction guard names no resource)
        expr = hook["matchConditions"][0]["expression"]
        assert all(f"'{n}'" in expr for n in names.values()) and "nvidia.com" not in expr
    # the device plugin advertises the count resource and checks assignments against the same request names
    path = tmp_path / "device-plugin.yaml"
    path.write_text(chart[("ConfigMap", "vgpu-device-plugin")]["data"]["device-plugin.yaml"])
    plugin = load_plugin(["--config", str(path), "--node-name", "gpu-1"], {}).resource_names()
    assert (plugin.count, plugin.memory, plugin.memory_percentage, plugin.cores, plugin.priority) == tuple(
        names.values()
    )
    assert plugin == rn


def _policy_variables(chart: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in chart[("ValidatingAdmissionPolicy", name)]["spec"]["variables"]}


def test_admission_policy_values_name_its_writers_and_resources(helm: str) -> None:
    values = {
        "admissionPolicy.serviceAccountNamespace": "gpu-system",
        "admissionPolicy.extenderServiceAccount": "my-extender",
        "admissionPolicy.devicePluginServiceAccount": "my-plugin",
        "admissionPolicy.nodeNameUsers": ["system:kube-scheduler"],
        "admissionPolicy.nodeNameGroups": [],
        "resourceNames.count": "example.com/vgpu",
    }
    chart = by_key(template(helm, values))
    pods = _policy_variables(chart, "vgpu-pod-protocol")
    assert pods["extender"] == "'system:serviceaccount:gpu-system:my-extender'"
    assert pods["devicePlugin"] == "'system:serviceaccount:gpu-system:my-plugin'"
    assert pods["nodeNameUsers"] == "['system:kube-scheduler']" and pods["nodeNameGroups"] == "[]"
    assert "'example.com/vgpu'" in pods["vgpuResources"] and "nvidia.com/gpu'" not in pods["vgpuResources"]
    nodes = _policy_variables(chart, "vgpu-node-inventory")
    assert nodes["devicePlugin"] == "'system:serviceaccount:gpu-system:my-plugin'"
    # Without a namespace of their own the ServiceAccounts are the release's.
    text = run_helm(helm, "template", "kube-vgpu", str(CHART), "--namespace", "gpu-ops").stdout
    pods = _policy_variables(by_key([d for d in yaml.safe_load_all(text) if d]), "vgpu-pod-protocol")
    assert pods["extender"] == "'system:serviceaccount:gpu-ops:vgpu-extender'"


def test_rendered_configs_load_like_the_manifests(helm: str, tmp_path: Path) -> None:
    from device_plugin.config import load as load_plugin

    chart = by_key(template(helm))
    manifest = all_manifests()
    (tmp_path / "chart").mkdir()
    (tmp_path / "manifest").mkdir()
    assert _webhook_config(chart[("ConfigMap", "vgpu-webhook")], tmp_path / "chart") == _webhook_config(
        manifest[("ConfigMap", "vgpu-webhook")], tmp_path / "manifest"
    )
    loaded = []
    for name, docs in (("chart", chart), ("manifest", manifest)):
        path = tmp_path / name / "device-plugin.yaml"
        path.write_text(docs[("ConfigMap", "vgpu-device-plugin")]["data"]["device-plugin.yaml"])
        loaded.append(load_plugin(["--config", str(path), "--node-name", "gpu-1"], {}))
    assert loaded[0] == loaded[1]


def test_mps_and_hami_core_options_mount_what_the_plugin_needs(helm: str, tmp_path: Path) -> None:
    from device_plugin.config import load as load_plugin

    ds = by_key(template(helm, VARIANTS["device-plugin-mps-hami-core"]))
    pod = ds[("DaemonSet", "vgpu-device-plugin")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    (c,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]["name"]] == {"path": "/var/run/vgpu/mps/shm", "type": "DirectoryOrCreate"}
    assert volumes[mounts["/run/nvidia-mps/pipe"]["name"]]["path"] == "/run/nvidia-mps/pipe"
    assert "/var/run/vgpu/mps/log" not in mounts  # under the vgpu-run mount already
    lib = mounts["/usr/local/vgpu/libvgpu.so"]
    assert lib["readOnly"] and volumes[lib["name"]] == {"path": "/usr/local/vgpu/libvgpu.so", "type": "File"}
    assert volumes[mounts["/usr/local/vgpu/kube-vgpu"]["name"]]["path"] == "/usr/local/vgpu/kube-vgpu"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    path = tmp_path / "device-plugin.yaml"
    path.write_text(ds[("ConfigMap", "vgpu-device-plugin")]["data"]["device-plugin.yaml"])
    conf = load_plugin(["--config", str(path), "--node-name", "gpu-1"], {})
    assert conf.mps and conf.mps_pipe_dir == "/run/nvidia-mps/pipe"
    assert conf.env_settings().hami_core_preload_file == "/usr/local/vgpu/kube-vgpu/ld.so.preload"
    plain = by_key(template(helm))[("DaemonSet", "vgpu-device-plugin")]["spec"]["template"]["spec"]
    assert {v["name"] for v in plain["volumes"]} == {v["name"] for v in pod["volumes"]} - {
        lib["name"],
        mounts["/run/nvidia-mps/pipe"]["name"],
        mounts["/usr/local/vgpu/kube-vgpu"]["name"],
    }


def test_scheduler_name_reaches_the_profile_the_lease_and_the_webhook(helm: str, tmp_path: Path) -> None:
    chart = by_key(template(helm, {"scheduler.name": "gpu-scheduler", "scheduler.extenderCAData": "Q0E="}))
    cfg = yaml.safe_load(chart[("ConfigMap", "vgpu-scheduler-config")]["data"]["kube-scheduler-config.yaml"])
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gpu-scheduler"]
    assert cfg["leaderElection"]["resourceName"] == "gpu-scheduler"
    assert cfg["extenders"][0]["tlsConfig"]["caData"] == "Q0E="
    lease_rule = chart[("Role", "vgpu-scheduler-leader-election")]["rules"][1]
    assert lease_rule["resourceNames"] == ["gpu-scheduler"]
    assert _webhook_config(chart[("ConfigMap", "vgpu-webhook")], tmp_path).scheduler_name == "gpu-scheduler"


def test_config_changes_roll_the_pods(helm: str) -> None:
    def checksums(values: dict[str, Any]) -> dict[str, str]:
        chart = by_key(template(helm, values))
        return {
            name: chart[(kind, name)]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for kind, name in (
                ("Deployment", "vgpu-scheduler"),
                ("Deployment", "vgpu-webhook"),
                ("DaemonSet", "vgpu-device-plugin"),
            )
        }

    base = checksums({})
    changed = checksums(
        {"scheduler.extenderCAData": "Q0E=", "webhook.defaults.priority": 0, "devicePlugin.config.split_count": 4}
    )
    assert all(base[k] != changed[k] for k in base)


# --------------------------------------------------------------------------------------------------------------
# bad values


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"extender.replicas": 0}, "at '/extender/replicas': minimum: got 0, want 1"),
        ({"extender.replicas": 6}, "at '/extender/replicas': maximum: got 6, want 5"),
        ({"extender.leaderElection.retryPeriodSeconds": 0}, "at '/extender/leaderElection/retryPeriodSeconds'"),
        ({"scheduler.replicas": 0}, "at '/scheduler/replicas': minimum: got 0, want 1"),
        ({"extender.nodePolicy": "tetris"}, "at '/extender/nodePolicy': value must be one of 'bestfit', 'binpack'"),
        ({"extender.nodePolicy": "fragaware-wg100"}, "at '/extender/nodePolicy': value must be one of"),
        ({"extender.gpuPolicy": "random"}, "at '/extender/gpuPolicy': value must be one of '', 'binpack', 'spread'"),
        ({"extender.bindGraceSeconds": 0}, "at '/extender/bindGraceSeconds': exclusiveMinimum"),
        ({"extender.requeueMaxPods": -1}, "at '/extender/requeueMaxPods': minimum"),
        ({"extender.requeueIntervalSeconds": 0}, "at '/extender/requeueIntervalSeconds': exclusiveMinimum"),
        ({"extender.typo": 1}, "at '/extender': additional properties 'typo' not allowed"),
        ({"scheduler.name": "Vgpu_Scheduler"}, "at '/scheduler/name': 'Vgpu_Scheduler' does not match pattern"),
        ({"scheduler.extenderHTTPTimeout": "5 seconds"}, "at '/scheduler/extenderHTTPTimeout'"),
        (
            {"webhook.tls.mode": "manual"},
            "at '/webhook/tls/mode': value must be one of 'certJob', 'certManager', 'secret'",
        ),
        ({"webhook.tls.mode": "secret"}, "at '/webhook/tls/caBundle': minLength: got 0, want 1"),
        (
            {"webhook.defaults.memoryPercentage": 150},
            "at '/webhook/defaults/memoryPercentage': maximum: got 150, want 100",
        ),
        ({"webhook.timeoutSeconds": 31}, "at '/webhook/timeoutSeconds': maximum: got 31, want 30"),
        ({"devicePlugin.config.split_count": 0}, "at '/devicePlugin/config/split_count': minimum: got 0, want 1"),
        ({"devicePlugin.config.enforcement_steps": "kill"}, "at '/devicePlugin/config/enforcement_steps'"),
        ({"devicePlugin.config.resource_name": "x"}, "additional properties 'resource_name' not allowed"),
        ({"devicePlugin.config.resource_cores": "x"}, "additional properties 'resource_cores' not allowed"),
        ({"devicePlugin.config.grpc_workers": 1}, "at '/devicePlugin/config/grpc_workers': minimum: got 1, want 2"),
        ({"devicePlugin.config.http_timeout_s": 301}, "at '/devicePlugin/config/http_timeout_s': maximum"),
        ({"devicePlugin.config.grpc_max_message_bytes": 1024}, "at '/devicePlugin/config/grpc_max_message_bytes'"),
        ({"devicePlugin.config.hami_core_library": "libvgpu.so"}, "at '/devicePlugin/config/hami_core_library'"),
        ({"devicePlugin.config.mps_shm_dir": "/run/../etc"}, "at '/devicePlugin/config/mps_shm_dir'"),
        (
            {"extender.tls.mode": "job"},
            "at '/extender/tls/mode': value must be one of 'certManager', 'generate', 'secret'",
        ),
        ({"extender.tls.generate.validityDays": 0}, "at '/extender/tls/generate/validityDays': minimum: got 0, want 2"),
        ({"extender.tls.certManager.duration": "1 year"}, "at '/extender/tls/certManager/duration'"),
        ({"extender.tls.certManager.issuerRef": {"kind": "Issuer"}}, "at '/extender/tls/certManager/issuerRef'"),
        ({"extender.tls.clientSecretName": "Bad_Name"}, "at '/extender/tls/clientSecretName'"),
        ({"scheduler.extenderCAData": "-----BEGIN"}, "at '/scheduler/extenderCAData'"),
        ({"resourceNames.memory": "not a name"}, "at '/resourceNames/memory'"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_bad_values_fail_with_the_schema_message(helm: str, values: dict[str, Any], message: str) -> None:
    err = template_error(helm, values)
    assert "values don't meet the specifications of the schema(s)" in err, err
    assert message in err, err


def test_leader_election_timings_out_of_order_fail_with_a_clear_message(helm: str) -> None:
    err = template_error(helm, {"extender.leaderElection.renewDeadlineSeconds": 20})
    assert "retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds, got 2 < 20 < 15" in err, err


def test_replicas_elect_a_leader_that_the_service_selects(helm: str) -> None:
    values = {"extender.replicas": 2, "extender.leaderElection.leaseDurationSeconds": 20}
    chart = by_key(template(helm, values))
    dep = chart[("Deployment", "vgpu-extender")]
    s = _extender_settings(dep)
    assert s.leader_elect and s.leader_elect_resource_namespace == NAMESPACE
    assert (s.leader_elect_lease_duration_seconds, s.leader_elect_renew_deadline_seconds) == (20, 10)
    assert (s.pod_name, s.pod_namespace) == ("<metadata.name>", "<metadata.namespace>")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    selector = chart[("Service", "vgpu-extender")]["spec"]["selector"]
    assert selector == {"app.kubernetes.io/name": "vgpu-extender", "vgpu.io/extender-leader": "true"}
    # Its own Lease only (the name is the extender's default --leader-elect-resource-name): create cannot be named.
    create, own = chart[("Role", "vgpu-extender-leader-election")]["rules"]
    assert create == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}
    assert own["resourceNames"] == [s.leader_elect_resource_name] and set(own["verbs"]) == {"get", "update"}
    pdb = chart[("PodDisruptionBudget", "vgpu-extender")]["spec"]
    assert pdb == {"minAvailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": "vgpu-extender"}}}
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    # One replica: no PDB, which would block every node drain.
    assert ("PodDisruptionBudget", "vgpu-extender") not in by_key(template(helm))


def test_schema_enum_lists_every_policy_helm_accepts(helm: str) -> None:
    from vgpu.placement import registry

    for name in registry.production_names():
        dep = by_key(template(helm, {"extender.nodePolicy": name}))[("Deployment", "vgpu-extender")]
        assert _extender_settings(dep).node_policy == name


def test_renewal_window_longer_than_the_validity_fails_with_a_clear_message(helm: str) -> None:
    err = template_error(helm, {"extender.tls.generate.validityDays": 30})
    assert "extender.tls.generate needs renewBeforeDays < validityDays" in err and "got 30 >= 30" in err, err


# --------------------------------------------------------------------------------------------------------------
# the extender's mutual-TLS certificates (extender.tls.mode)

CLIENT_MOUNT = "/etc/vgpu-scheduler/extender-client"
NOT_AFTER = "kube-vgpu/certificates-not-after"


def _scheduler_tls(chart: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
    cfg = yaml.safe_load(chart[("ConfigMap", "vgpu-scheduler-config")]["data"]["kube-scheduler-config.yaml"])
    tls: dict[str, str] = cfg["extenders"][0]["tlsConfig"]
    return tls


def _mounted_secret(dep: dict[str, Any], mount_path: str) -> str:
    """The Secret whose volume the Deployment's container mounts at mount_path."""
    spec = dep["spec"]["template"]["spec"]
    (volume,) = [m["name"] for m in _container(dep)["volumeMounts"] if m["mountPath"] == mount_path]
    name: str = next(v for v in spec["volumes"] if v["name"] == volume)["secret"]["secretName"]
    return name


def assert_both_sides_read_the_right_files(chart: dict[tuple[str, str], dict[str, Any]], client_secret: str) -> None:
    """kube-scheduler trusts ca.crt and presents tls.crt/tls.key of the client Secret; the extender serves tls.crt
    of its Secret and accepts clients of its ca.crt."""
    tls = _scheduler_tls(chart)
    assert tls == {
        "caFile": f"{CLIENT_MOUNT}/ca.crt",
        "certFile": f"{CLIENT_MOUNT}/tls.crt",
        "keyFile": f"{CLIENT_MOUNT}/tls.key",
    }
    assert _mounted_secret(chart[("Deployment", "vgpu-scheduler")], CLIENT_MOUNT) == client_secret
    s = _extender_settings(chart[("Deployment", "vgpu-extender")])
    mount = "/etc/vgpu-extender/tls"
    assert (str(s.tls_cert_file), str(s.tls_key_file), str(s.client_ca_file)) == tuple(
        f"{mount}/{k}" for k in ("tls.crt", "tls.key", "ca.crt")
    )


def _pem(secret: dict[str, Any], key: str) -> bytes:
    import base64

    return base64.b64decode(secret["data"][key])


def assert_generated_certificates_work(chart: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Load the two generated Secrets with `cryptography` and check what each side relies on."""
    import datetime

    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    server, client = chart[("Secret", "vgpu-extender-tls")], chart[("Secret", "vgpu-extender-client")]
    for secret in (server, client):
        assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        assert secret["metadata"]["namespace"] == NAMESPACE
    ca = x509.load_pem_x509_certificate(_pem(server, "ca.crt"))
    assert _pem(client, "ca.crt") == _pem(server, "ca.crt")  # one CA, trusted by both sides
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    serving = x509.load_pem_x509_certificate(_pem(server, "tls.crt"))
    presented = x509.load_pem_x509_certificate(_pem(client, "tls.crt"))
    # kube-scheduler's check of the extender: issued by the CA in its caFile, for the name it calls
    serving.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {
        "vgpu-extender",
        f"vgpu-extender.{NAMESPACE}",
        f"vgpu-extender.{NAMESPACE}.svc",
        f"vgpu-extender.{NAMESPACE}.svc.cluster.local",
    }
    assert ExtendedKeyUsageOID.SERVER_AUTH in serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # the extender's check of kube-scheduler: issued by the CA in its --client-ca-file, usable as a client
    presented.verify_directly_issued_by(x509.load_pem_x509_certificate(_pem(server, "ca.crt")))
    assert ExtendedKeyUsageOID.CLIENT_AUTH in presented.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # each key is its certificate's
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    for cert, secret in ((serving, server), (presented, client)):
        assert load_pem_private_key(_pem(secret, "tls.key"), None).public_key() == cert.public_key()
    # valid now, for validityDays, and the annotation an upgrade reads says when (never later than the truth)
    now = datetime.datetime.now(datetime.UTC)
    recorded = datetime.datetime.fromisoformat(server["metadata"]["annotations"][NOT_AFTER])
    assert client["metadata"]["annotations"][NOT_AFTER] == server["metadata"]["annotations"][NOT_AFTER]
    for cert in (ca, serving, presented):
        assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
        assert datetime.timedelta(0) <= cert.not_valid_after_utc - recorded < datetime.timedelta(minutes=1)
    return {"ca": ca, "serving": serving, "presented": presented, "recorded": recorded}


def test_generated_certificates_verify_and_both_sides_read_them(helm: str) -> None:
    import datetime

    chart = by_key(template(helm))
    certs = assert_generated_certificates_work(chart)
    lifetime = certs["serving"].not_valid_after_utc - certs["serving"].not_valid_before_utc
    assert abs(lifetime - datetime.timedelta(days=365)) < datetime.timedelta(minutes=1)  # generate.validityDays
    assert_both_sides_read_the_right_files(chart, "vgpu-extender-client")
    assert _mounted_secret(chart[("Deployment", "vgpu-extender")], "/etc/vgpu-extender/tls") == "vgpu-extender-tls"
    # Both Deployments roll when (and only when) the certificates change: one checksum of the same certificates.
    sums = {
        chart[("Deployment", n)]["spec"]["template"]["metadata"]["annotations"]["checksum/extender-tls"]
        for n in ("vgpu-extender", "vgpu-scheduler")
    }
    assert len(sums) == 1
    shorter = by_key(template(helm, {"extender.tls.generate.validityDays": 90}))
    certs = assert_generated_certificates_work(shorter)
    lifetime = certs["serving"].not_valid_after_utc - certs["serving"].not_valid_before_utc
    assert abs(lifetime - datetime.timedelta(days=90)) < datetime.timedelta(minutes=1)


def test_rendering_twice_without_a_cluster_gives_two_valid_sets(helm: str) -> None:
    """`helm template` cannot look up the Secrets: each rendering issues a new CA and certificates. Each set is
    whole and valid on its own (a GitOps render is never half old, half new), and the pods' checksum follows."""
    first, second = by_key(template(helm)), by_key(template(helm))
    a, b = assert_generated_certificates_work(first), assert_generated_certificates_work(second)
    assert a["ca"] != b["ca"] and a["serving"] != b["serving"]

    def checksum(chart: dict[tuple[str, str], dict[str, Any]]) -> str:
        value: str = chart[("Deployment", "vgpu-extender")]["spec"]["template"]["metadata"]["annotations"][
            "checksum/extender-tls"
        ]
        return value

    assert checksum(first) != checksum(second)
    # Everything else is identical between the two renderings.
    for chart in (first, second):
        for key in GENERATED:
            del chart[key]
        for name in ("vgpu-extender", "vgpu-scheduler"):
            del chart[("Deployment", name)]["spec"]["template"]["metadata"]["annotations"]["checksum/extender-tls"]
    assert first == second


def test_cert_manager_mode_issues_both_certificates_from_a_ca_for_the_extender_alone(helm: str) -> None:
    chart = by_key(template(helm, {"extender.tls.mode": "certManager"}))
    assert not GENERATED & set(chart)
    assert "checksum/extender-tls" not in chart[("Deployment", "vgpu-extender")]["spec"]["template"]["metadata"].get(
        "annotations", {}
    )
    assert chart[("Issuer", "vgpu-extender-selfsigned")]["spec"] == {"selfSigned": {}}
    ca = chart[("Certificate", "vgpu-extender-ca")]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"] == {"name": "vgpu-extender-selfsigned", "kind": "Issuer"}
    assert chart[("Issuer", "vgpu-extender-ca")]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    server, client = (
        chart[("Certificate", "vgpu-extender")]["spec"],
        chart[("Certificate", "vgpu-extender-client")]["spec"],
    )
    assert server["secretName"] == "vgpu-extender-tls" and client["secretName"] == "vgpu-extender-client"
    assert "server auth" in server["usages"] and "client auth" in client["usages"]
    assert f"vgpu-extender.{NAMESPACE}.svc" in server["dnsNames"] and "dnsNames" not in client
    for spec in (server, client):
        assert spec["issuerRef"] == {"name": "vgpu-extender-ca", "kind": "Issuer"}
        assert (spec["duration"], spec["renewBefore"]) == ("8760h", "720h")
    assert_both_sides_read_the_right_files(chart, "vgpu-extender-client")
    # An issuer of your own replaces the self-signed chain.
    own = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    chart = by_key(template(helm, {"extender.tls.mode": "certManager", "extender.tls.certManager.issuerRef": own}))
    assert {k for k in chart if k[0] in ("Issuer", "Certificate") and k[1].startswith("vgpu-extender")} == {
        ("Certificate", "vgpu-extender"),
        ("Certificate", "vgpu-extender-client"),
    }
    assert chart[("Certificate", "vgpu-extender")]["spec"]["issuerRef"] == own


def test_own_secrets_mode_renders_no_certificates_and_reads_the_named_secrets(helm: str) -> None:
    values = {
        "extender.tls.mode": "secret",
        "extender.tls.secretName": "corp-extender-tls",
        "extender.tls.clientSecretName": "corp-scheduler-client",
    }
    chart = by_key(template(helm, values))
    assert not [k for k in chart if k[0] in ("Secret", "Certificate", "Issuer") and "extender" in k[1]]
    assert_both_sides_read_the_right_files(chart, "corp-scheduler-client")
    assert _mounted_secret(chart[("Deployment", "vgpu-extender")], "/etc/vgpu-extender/tls") == "corp-extender-tls"
    # The CA may come from the values instead of the client Secret.
    tls = _scheduler_tls(by_key(template(helm, {**values, "scheduler.extenderCAData": "Q0E="})))
    assert tls["caData"] == "Q0E=" and "caFile" not in tls


# --------------------------------------------------------------------------------------------------------------
# every setting the chart passes is accepted by the service's own loader


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it (downward API fields filled in)."""
    fields = {"metadata.name": "pod-0", "metadata.namespace": NAMESPACE, "spec.nodeName": "gpu-1"}
    return {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in container.get("env", [])
    }


def _files(chart: dict[tuple[str, str], dict[str, Any]], doc: dict[str, Any]) -> dict[str, str]:
    """The files the pod's ConfigMap volumes mount, by path in the container."""
    spec = doc["spec"]["template"]["spec"]
    # An optional ConfigMap (vgpu-quotas) is the admin's to create, not the chart's: it mounts nothing by default.
    maps = {
        v["name"]: v["configMap"]["name"]
        for v in spec.get("volumes", [])
        if "configMap" in v and not v["configMap"].get("optional")
    }
    out = {}
    for m in _container(doc).get("volumeMounts", []):
        if m["name"] in maps:
            for key, text in chart[("ConfigMap", maps[m["name"]])]["data"].items():
                out[f"{m['mountPath']}/{key}"] = text
    return out


def load_container_settings(chart: dict[tuple[str, str], dict[str, Any]], doc: dict[str, Any]) -> Any:
    """Run one of our containers' command line, env and mounted config through its service's loader."""
    c = _container(doc)
    env, files = _env(c), _files(chart, doc)

    def read_text(path: str) -> str:
        return files[path]

    if c["command"] == ["vgpu-extender"]:
        from scheduler_extender.main import build_parser
        from scheduler_extender.settings import SCHEMA as EXTENDER

        settings = EXTENDER.load_args(build_parser().parse_args(c["args"]), env, read_text)
        assert settings.serving_problem() is None
        return settings
    if c["command"] == ["vgpu-webhook", "serve"]:
        from webhook import config_load
        from webhook.config import problems
        from webhook.main import parser

        return config_load.SCHEMA.load_args(parser().parse_args(["serve", *c["args"]]), env, read_text, check=problems)
    if c["command"] == ["vgpu-webhook", "install-certs"]:
        from webhook.main import parser

        assert not env
        return parser().parse_args(["install-certs", *c["args"]])
    if c["command"] == ["vgpu-device-plugin"]:
        from device_plugin import config

        return config.SCHEMA.load(c["args"], env, read_text, check=config.problems)
    raise AssertionError(f"no loader for {c['command']}")


OUR_WORKLOADS = {
    ("Deployment", "vgpu-extender"),
    ("Deployment", "vgpu-webhook"),
    ("Job", "vgpu-webhook-certs"),
    ("DaemonSet", "vgpu-device-plugin"),
}


@pytest.mark.parametrize("variant", ["defaults", "everything", "extender-ha"])
def test_every_container_setting_loads_through_the_services_loader(helm: str, variant: str) -> None:
    chart = by_key(template(helm, VARIANTS[variant]))
    workloads = {k for k in chart if k[0] in ("Deployment", "DaemonSet", "Job")}
    assert workloads - OUR_WORKLOADS == {("Deployment", "vgpu-scheduler")}  # kube-scheduler's own flags
    for key in workloads & OUR_WORKLOADS:
        assert load_container_settings(chart, chart[key]) is not None, key
        # and no kubelet service links to collide with the env prefixes (the loader's second guard)
        assert chart[key]["spec"]["template"]["spec"]["enableServiceLinks"] is False, key
    assert chart[("Deployment", "vgpu-scheduler")]["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_device_plugin_limits_pass_through_with_the_plugins_ranges(helm: str) -> None:
    """The six connection limits: the schema's bounds are the plugin's (device_plugin/config.py, problems())."""
    from device_plugin import config

    bounds = {
        "grpc_workers": (2, 256),
        "grpc_keepalive_s": (10, 3600),
        "grpc_max_idle_s": (10, 86400),
        "grpc_max_message_bytes": (64 << 10, 64 << 20),
        "http_timeout_s": (0.5, 300),
        "http_max_connections": (1, 4096),
    }
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]["devicePlugin"]["properties"]["config"]["properties"]
    for name, (lo, hi) in bounds.items():
        assert (props[name]["minimum"], props[name]["maximum"]) == (lo, hi), name
        default = config.PluginConfig.model_fields[name].default
        assert config.problems(config.PluginConfig(node_name="n", **{name: lo})) == []
        assert config.problems(config.PluginConfig(node_name="n", **{name: hi})) == []
        assert config.problems(config.PluginConfig(node_name="n", **{name: hi * 2}))  # above: refused by both
        assert lo <= default <= hi
    for edge in (0, 1):
        values = {f"devicePlugin.config.{k}": v[edge] for k, v in bounds.items()}
        chart = by_key(template(helm, values))
        loaded = load_container_settings(chart, chart[("DaemonSet", "vgpu-device-plugin")])
        assert {k: getattr(loaded, k) for k in bounds} == {k: v[edge] for k, v in bounds.items()}
    # Left out, they stay at the plugin's defaults (the chart writes none of them).
    chart = by_key(template(helm))
    text = chart[("ConfigMap", "vgpu-device-plugin")]["data"]["device-plugin.yaml"]
    assert not set(bounds) & set(yaml.safe_load(text))


def test_the_extender_flowschema_puts_its_lease_requests_in_leader_election_and_has_a_switch(helm: str) -> None:
    """On by default (tests/e2e/test_extender_flowschema_e2e.py applies it to a real apiserver); off leaves the rest."""
    key = ("FlowSchema", "vgpu-extender-leader-election")
    default = by_key(template(helm))
    spec = default[key]["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
    (rule,) = spec["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "vgpu-extender", "namespace": "kube-system"}}
    ]
    assert rule["resourceRules"] == [
        {
            "verbs": ["get", "create", "update"],
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "namespaces": ["kube-system"],
        }
    ]
    off = by_key(template(helm, {"extender.leaderElection.flowSchema": False}))
    assert key not in off and set(off) == set(default) - {key}


def _plugin_rules(chart: dict[Any, Any]) -> set[str]:
    return {r for rule in chart[("ClusterRole", "vgpu-device-plugin")]["rules"] for r in rule["resources"]}


def test_the_device_plugin_may_evict_only_with_the_evict_step_and_behind_the_eviction_guard(helm: str) -> None:
    default = by_key(template(helm, {}))
    assert "pods/eviction" not in _plugin_rules(default)  # the default ladder stops at annotate
    steps = {"devicePlugin.config.enforcement_steps": "event,annotate,evict"}
    evicting = by_key(template(helm, steps))
    assert "pods/eviction" in _plugin_rules(evicting)
    guard = {wh["name"]: wh for wh in evicting[("ValidatingWebhookConfiguration", "vgpu-webhook")]["webhooks"]}[
        "evict.vgpu.io"
    ]
    assert guard["clientConfig"]["service"]["path"] == "/validate-eviction" and guard["failurePolicy"] == "Fail"
    assert guard["rules"][0]["resources"] == ["pods/eviction"] and "namespaceSelector" not in guard
    (cond,) = guard["matchConditions"]
    assert "system:serviceaccount:kube-system:vgpu-device-plugin" in cond["expression"]
    # Its ServiceAccount's namespace and name follow admissionPolicy's, as the policy's own variables do.
    moved = by_key(
        template(
            helm,
            {
                **steps,
                "admissionPolicy.serviceAccountNamespace": "gpu-system",
                "admissionPolicy.devicePluginServiceAccount": "plugin",
                "webhook.validatingWebhook": False,
            },
        )
    )
    (only,) = moved[("ValidatingWebhookConfiguration", "vgpu-webhook")]["webhooks"]
    assert only["name"] == "evict.vgpu.io"
    assert "'system:serviceaccount:gpu-system:plugin'" in only["matchConditions"][0]["expression"]
    err = template_error(helm, {**steps, "webhook.enabled": False})
    assert "enforcement_steps has evict, which needs webhook.enabled" in err, err
