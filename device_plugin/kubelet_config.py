"""The node's Topology Manager as the device plugin states it in the node inventory (vgpu.kubelet_topology).

The policy and scope come from the plugin's settings, else from the kubelet's own KubeletConfiguration file
(fields `topologyManagerPolicy`, `topologyManagerScope`: k8s.io/kubelet@v0.34.4 config/v1beta1/types.go);
a kubelet started with --topology-manager-policy flags instead of a file needs the settings. Whether each
replica's NUMA node is advertised follows vgpu.kubelet_topology.advertises_numa; when the policy is unknown
(no setting, the file unreadable) it is not, which is safe under every policy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from vgpu.kubelet_topology import POLICIES, SCOPES, NodePolicy, Policy, Scope, advertises_numa

log = logging.getLogger(__name__)
NumaMode = Literal["auto", "always", "never"]


def read_kubelet_config(path: str) -> tuple[str, str] | None:
    """(topologyManagerPolicy, topologyManagerScope) of a KubeletConfiguration file, "" where unset (the
    kubelet's defaults none and container); None when the file cannot be read (the policy is unknown)."""
    try:
        doc: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        log.warning("cannot read the kubelet config %s (%s)", path, exc)
        return None
    if not isinstance(doc, dict):
        return None
    options = doc.get("topologyManagerPolicyOptions") or {}
    if isinstance(options, dict) and str(options.get("prefer-closest-numa-nodes", "")).lower() == "true":
        log.info("prefer-closest-numa-nodes only reorders multi-NUMA hints of equal width; modelled as without it")
    return str(doc.get("topologyManagerPolicy") or ""), str(doc.get("topologyManagerScope") or "")


def node_policy(
    *,
    policy: str,
    scope: str,
    kubelet_config: str,
    numa: NumaMode,
    gpu_numa: Iterable[int | None],
) -> NodePolicy:
    """The NodePolicy to publish; settings win over the kubelet's file (whose values the settings' own
    validation does not see: one the kubelet would not accept is logged and taken as the default)."""
    read = read_kubelet_config(kubelet_config) if not (policy and scope) else ("", "")
    file_policy, file_scope = read if read is not None else ("", "")
    if not policy and read is None and numa == "auto":
        # Unknown policy: hide NUMA, which every policy admits (the kubelet then offers every free replica).
        log.warning(
            "topology manager policy unknown (no setting, %s unreadable): replicas carry no NUMA", kubelet_config
        )
        numa = "never"
    p = policy or file_policy or "none"
    s = scope or file_scope or "container"
    if p not in POLICIES:
        log.error(
            "%s: topologyManagerPolicy %r is not one of %s; assuming none", kubelet_config, p, ", ".join(POLICIES)
        )
        p = "none"
    if s not in SCOPES:
        log.error(
            "%s: topologyManagerScope %r is not one of %s; assuming container", kubelet_config, s, ", ".join(SCOPES)
        )
        s = "container"
    log.info("topology manager policy %s, scope %s (settings, else %s)", p, s, kubelet_config)
    known = tuple(sorted({n for n in gpu_numa if n is not None}))
    return NodePolicy(
        policy=cast(Policy, p),
        scope=cast(Scope, s),
        numa_advertised=advertises_numa(cast(Policy, p), numa) and bool(known),
        numa_nodes=known,
    )
