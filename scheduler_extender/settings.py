"""Extender configuration (version v1): one pydantic model with defaults, descriptions and validation.

Flags, env variables, file keys and `--help` all come from this model through `vgpu.settings.Schema`
(`SCHEMA` below); precedence flags > env > file > defaults. Env variables are `VGPU_EXTENDER_<FIELD>` in
upper case (e.g. VGPU_EXTENDER_NODE_POLICY=spread); nested resource names use
`VGPU_EXTENDER_RESOURCES__COUNT` (flag `--resources-count`). The file is YAML, `version: v1` optional.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vgpu.config import PlacementConfig, ResourceNames
from vgpu.errors import UnknownPolicyError
from vgpu.placement import registry
from vgpu.settings import Schema, SettingsError

ENV_PREFIX = "VGPU_EXTENDER_"


__all__ = ["ENV_PREFIX", "SCHEMA", "ExtenderSettings", "ResourceNameSettings", "SettingsError", "load"]


class ResourceNameSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    count: str = Field(default="nvidia.com/gpu", description="resource name of the GPU count")
    memory: str = Field(default="nvidia.com/gpumem", description="resource name of GPU memory (MiB)")
    memory_percentage: str = Field(
        default="nvidia.com/gpumem-percentage", description="resource name of GPU memory in percent"
    )
    cores: str = Field(default="nvidia.com/gpucores", description="resource name of the SM share")
    priority: str = Field(default="nvidia.com/priority", description="resource name of the priority")


class ExtenderSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    version: Literal["v1"] = "v1"
    address: str = Field(default="0.0.0.0", description="listen address")
    port: int = Field(default=8888, ge=1, le=65535, description="listen port")
    tls_cert_file: Path | None = Field(default=None, description="serve HTTPS with this certificate (PEM)")
    tls_key_file: Path | None = Field(default=None, description="private key of --tls-cert-file (PEM)")
    client_ca_file: Path | None = Field(
        default=None,
        description="require a client certificate signed by this CA (PEM) for every request on --port (mTLS)",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="the kube source without client certificates: anyone who reaches the port can bind (development)",
    )
    health_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="plain-HTTP port serving only /healthz, /readyz and /metrics (kubelet probes carry no client cert)",
    )
    enable_state: bool = Field(
        default=False, description="serve GET /state (every pod's slices and GPU UUIDs) on --port, behind the same mTLS"
    )
    allocation_metrics: Literal["per-gpu", "per-node"] = Field(
        default="per-gpu",
        description="the allocation view on /metrics: per-gpu (vgpu_gpu_* and vgpu_node_*, ~7.5 samples a GPU: "
        "~300,000 at 5,000 nodes x 8 GPUs) or per-node (vgpu_node_* only, 6 a node); per-node past ~1,000 nodes, "
        "where Prometheus keeps every series in memory",
    )
    source: Literal["kube", "file"] = Field(default="kube", description="where the cluster state comes from")
    cluster_file: Path | None = Field(default=None, description="cluster file for --source file")
    persist: bool = Field(default=False, description="write binds back to the cluster file (atomic rename)")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig; in-cluster config when unset")
    node_policy: str = Field(
        default="default",
        description=f"cluster-wide node placement policy: {', '.join(registry.production_names())}",
    )
    gpu_policy: Literal["binpack", "spread"] | None = Field(
        default=None, description="GPU order inside a node; unset = the node policy's own"
    )
    narrow_filter: bool = Field(default=False, description="filter returns only the best-scored tier")
    filter_answers_one: bool = Field(
        default=False,
        description="filter answers only the node prioritize would rank first (and holds it), so kube-scheduler binds "
        "it without scoring or calling prioritize; its own soft preferences then no longer weigh (docs/extender.md)",
    )
    priority_mapping: Literal["rank", "minmax"] = Field(
        default="rank", description="how fine scores become kube-scheduler's 0..10 (docs/extender.md)"
    )
    topology: bool = Field(
        default=True,
        description="a multi-GPU container gets GPUs that are NVLink peers, else on one NUMA node, before the "
        "policy's order; false = the policy's order alone (docs/topology.md)",
    )
    topology_weight: float = Field(
        default=2.0,
        ge=0,
        le=100,
        description="node score per unit of how well the GPU set a node gives a multi-GPU pod is connected; at 2 any "
        "node with an NVLink set outscores every node without one (docs/topology.md)",
    )
    bind_grace_seconds: float = Field(
        default=30.0, gt=0, description="how long an assignment without a Binding keeps its slices reserved"
    )
    bind_timeout_seconds: float = Field(
        default=5.0,
        ge=1,
        le=600,
        description="kube-scheduler's extender httpTimeout (5 s when unset there): /bind answers, bound or rolled "
        "back, within it",
    )
    relearn_interval_seconds: float = Field(
        default=60.0, gt=0, description="how often arriving pods are fed to a learning policy (fragaware)"
    )
    requeue_max_pods: int = Field(
        default=50,
        ge=0,
        description=(
            "when capacity frees, nudge the pending pods so kube-scheduler retries them, at most this many per "
            "--requeue-interval-seconds (the rest wait for the next interval); 0 = off"
        ),
    )
    requeue_interval_seconds: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="a pending pod is nudged at most once per this many seconds (later releases coalesce into one)",
    )
    leader_elect: bool = Field(
        default=False, description="run as one of several replicas: only the Lease holder serves (kube source only)"
    )
    leader_elect_resource_name: str = Field(
        default="vgpu-extender", min_length=1, description="name of the coordination.k8s.io/v1 Lease"
    )
    leader_elect_resource_namespace: str = Field(
        default="kube-system", min_length=1, description="namespace of the Lease"
    )
    leader_elect_lease_duration_seconds: float = Field(
        default=15.0, gt=0, description="how long a standby waits on an unrenewed lease before taking it over"
    )
    leader_elect_renew_deadline_seconds: float = Field(
        default=10.0, gt=0, description="how long a leader keeps serving while it cannot renew"
    )
    leader_elect_retry_period_seconds: float = Field(
        default=2.0, gt=0, description="how often candidates try to acquire and the leader renews"
    )
    pod_name: str | None = Field(
        default=None, description="this extender's own pod (downward API): the leader labels it for the Service"
    )
    pod_namespace: str | None = Field(default=None, description="namespace of pod_name")
    watch_timeout_seconds: int = Field(default=300, ge=10, description="server-side watch timeout")
    # The apiserver calls' own timeouts (scheduler_extender.kube.CallTimeouts); a bind's calls get at most what is
    # left of bind_timeout_seconds instead.
    apiserver_call_timeout_seconds: float = Field(
        default=10.0,
        ge=0.5,
        le=300,
        description="read timeout of an apiserver call outside a bind (reads, label and lease writes, requeue nudges)",
    )
    apiserver_connect_timeout_seconds: float = Field(
        default=3.0,
        ge=0.1,
        le=60,
        description="how long connecting to the apiserver may take (at most apiserver_call_timeout_seconds)",
    )
    apiserver_list_timeout_seconds: float = Field(
        default=60.0,
        ge=1,
        le=600,
        description="read timeout of a LIST of every active pod or node (relists, a new leader's first read)",
    )
    watch_read_slack_seconds: float = Field(
        default=30.0,
        ge=1,
        le=600,
        description="a watch silent this long past watch_timeout_seconds is closed and relisted (a dead connection)",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="largest request body accepted; a longer one is refused with 413 while it streams in",
    )
    max_json_values: int = Field(
        default=200_000,
        ge=1000,
        description="most JSON values in one body (commas and brackets counted): bounds parse time and memory; the "
        "full-NodeList mode (nodeCacheCapable: false) needs ~100 per node",
    )
    max_node_names: int = Field(
        default=15_000, ge=1, description="most nodes one /filter or /prioritize may name (Kubernetes: 5,000 nodes)"
    )
    request_read_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="a request must arrive whole (headers and body) within this long, or its connection is closed",
    )
    max_connections: int = Field(
        default=1000, ge=1, description="open connections served at once; beyond them requests get 503"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log level")
    log_format: Literal["text", "json"] = Field(default="text", description="text, or json for one object per line")
    resources: ResourceNameSettings = Field(default_factory=ResourceNameSettings)

    @model_validator(mode="after")
    def _consistent(self) -> ExtenderSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("client_ca_file (mTLS) needs tls_cert_file and tls_key_file: client certificates need TLS")
        if self.health_port is not None and self.health_port == self.port:
            raise ValueError(f"health_port must differ from port (both {self.port})")
        if self.source == "file" and self.cluster_file is None:
            raise ValueError("source 'file' needs cluster_file")
        if self.leader_elect and self.source != "kube":
            raise ValueError("leader_elect needs source 'kube' (the Lease lives in the apiserver)")
        if not (
            self.leader_elect_retry_period_seconds
            < self.leader_elect_renew_deadline_seconds
            < self.leader_elect_lease_duration_seconds
        ):
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{self.leader_elect_retry_period_seconds} / {self.leader_elect_renew_deadline_seconds} / "
                f"{self.leader_elect_lease_duration_seconds} s"
            )
        if self.apiserver_connect_timeout_seconds > self.apiserver_call_timeout_seconds:
            raise ValueError(
                "apiserver_connect_timeout_seconds must be at most apiserver_call_timeout_seconds, got "
                f"{self.apiserver_connect_timeout_seconds} > {self.apiserver_call_timeout_seconds} s"
            )
        if (self.pod_name is None) != (self.pod_namespace is None):
            raise ValueError("pod_name and pod_namespace go together")
        try:
            registry.check_production(self.node_policy)  # experiment names are for the benchmarks only
        except UnknownPolicyError as exc:
            raise ValueError(str(exc)) from None
        return self

    def serving_problem(self) -> str | None:
        """Why the program must not serve with these settings (checked at start, not at load, so tools that only
        read settings need no certificates): the kube source binds pods, so its verbs need client authentication."""
        if self.source == "kube" and self.client_ca_file is None and not self.allow_unauthenticated:
            return (
                "the kube source binds pods, so its verbs need client authentication: set client_ca_file "
                "(kube-scheduler's extender tlsConfig presents a certificate it signed; docs/extender.md, Security), "
                "or allow_unauthenticated for development only"
            )
        return None

    def placement(self) -> PlacementConfig:
        """Every setting named like a PlacementConfig field, passed by name: a placement setting cannot be accepted,
        validated and then dropped here (as --priority-mapping once was); tests pin which fields these are."""
        given = PLACEMENT_SETTINGS & set(type(self).model_fields)
        return PlacementConfig(**{name: getattr(self, name) for name in sorted(given)})

    def resource_names(self) -> ResourceNames:
        r = self.resources
        return ResourceNames(r.count, r.memory, r.memory_percentage, r.cores, r.priority)


PLACEMENT_SETTINGS = frozenset(f.name for f in dataclasses.fields(PlacementConfig))

SCHEMA: Schema[ExtenderSettings] = Schema(
    model=ExtenderSettings,
    prog="vgpu-extender",
    description="kube-scheduler extender for fractional, role-aware GPU placement (filter, prioritize, bind).",
    env_prefix=ENV_PREFIX,
    require_version=False,
    epilog="Every option is also an environment variable (VGPU_EXTENDER_<OPTION>, nested: "
    "VGPU_EXTENDER_RESOURCES__COUNT) and a key of the --config file. Precedence: flags > environment > file > "
    "defaults. See docs/extender.md.",
)


def read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def load(*, flags: Mapping[str, Any], env: Mapping[str, str], config_file: Path | None) -> ExtenderSettings:
    """Merge file < env < flags; `flags` maps field names (nested: `resources__count`) to values, None = not given."""
    layers = []
    if config_file is not None:
        try:
            text = read_text(str(config_file))
        except OSError as exc:
            raise SettingsError(f"config file {config_file}: {exc}") from None
        layers.append(SCHEMA.from_yaml(text, str(config_file)))
    layers += [SCHEMA.from_env(env), SCHEMA.from_flags(flags)]
    return SCHEMA.build(*layers)
