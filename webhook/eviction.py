"""The eviction guard: a node's device plugin may evict only pods on its own node (`/validate-eviction`).

RBAC cannot name "its own node", and an Eviction carries only the pod's name (policy/v1 Eviction: metadata and
deleteOptions), so the admission policy (CEL, no lookups) cannot tell where the pod runs. The ValidatingWebhookConfiguration
sends this endpoint only the evictions of the device plugin's ServiceAccount (its matchConditions), and every eviction
that reaches it must:

- come with a token bound to a pod on a node: the apiserver puts that node into the user info as the extra
  `authentication.kubernetes.io/node-name` (k8s.io/apiserver v0.34.4 pkg/authentication/serviceaccount/util.go
  `NodeNameKey`), exactly one value;
- name the pod's UID in `deleteOptions.preconditions.uid`, so the apiserver evicts that very pod and no other of the
  same name created after this check (k8s.io/kubernetes v1.34.4 pkg/registry/core/pod/storage/eviction.go passes the
  Eviction's DeleteOptions, preconditions included, to the pod's delete);
- name a pod whose `spec.nodeName` is that node (fixed once bound, so the check cannot go stale).

Anything else is refused with 403 and a message that says which rule and why. `decide_eviction` is pure: the pod is
read by the caller's `lookup` (webhook.kube.find_pod: one list of the namespace by field selector).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from vgpu.assignment_check import DNS1123_LABEL, is_dns1123_label
from webhook.admission import Outcome, deny
from webhook.review import AdmissionRequest

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# A pod name is a DNS subdomain, dot-separated DNS labels (k8s.io/apimachinery v0.34 pkg/util/validation/validation.go,
# IsDNS1123Subdomain), a namespace one label; both checked before they go into the pod read's path and field selector.
_SUBDOMAIN = re.compile(rf"{DNS1123_LABEL.pattern}(\.{DNS1123_LABEL.pattern})*")
MAX_NAME = 253
DOCS = 'docs/security.md, "Evictions"'

PodLookup = Callable[[str, str], Mapping[str, Any] | None]


def _field(obj: object, *path: str) -> object:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _refuse(who: str, why: str) -> Outcome:
    return deny(f"kube-vgpu: {who} may only evict pods on the node bound into its token: {why} ({DOCS})", code=403)


def is_pod_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and _SUBDOMAIN.fullmatch(name) is not None


def decide_eviction(request: AdmissionRequest, lookup: PodLookup | None) -> Outcome:
    """Admit or refuse one eviction (a CREATE of pods/eviction); any other request is not this endpoint's and passes."""
    if request.operation != "CREATE" or request.resource.resource != "pods" or request.subResource != "eviction":
        return Outcome(allowed=True)
    user = request.userInfo.username or "<no user>"
    namespace, name = request.namespace, request.name
    pod_ref = f"pod {namespace}/{name}"
    nodes = (request.userInfo.extra or {}).get(NODE_NAME_EXTRA) or []
    if len(nodes) != 1 or not nodes[0]:
        return _refuse(
            user,
            f"its token carries {'no' if not nodes else len(nodes)} node name(s) ({NODE_NAME_EXTRA}); only the "
            "projected token the kubelet mounts in its pod carries one (a legacy Secret token never does)",
        )
    node = nodes[0]
    uid = _field(request.object, "deleteOptions", "preconditions", "uid")
    if not isinstance(uid, str) or not uid:
        return _refuse(
            user,
            f"the eviction of {pod_ref} must name the pod's UID in deleteOptions.preconditions.uid, so that it "
            "cannot reach another pod of that name",
        )
    if not is_dns1123_label(namespace) or not is_pod_name(name):
        return _refuse(
            user,
            f"{pod_ref!r} is not a pod's namespace and name (a DNS label of at most 63 characters, a DNS subdomain of "
            f"at most {MAX_NAME})",
        )
    if lookup is None:
        return deny(
            f"kube-vgpu: cannot check the eviction of {pod_ref}: this webhook has no apiserver access to read the "
            f"pod (kubeconfig or in-cluster credentials); evictions by {user} are refused until it has ({DOCS})",
            code=500,
            kind="error",
        )
    try:
        pod = lookup(namespace, name)
    except Exception as exc:  # the apiserver's answer, or none: refuse, the plugin retries at its next step
        return deny(
            f"kube-vgpu: cannot read {pod_ref} to check the node of its eviction by {user}: {exc}; refused, retry "
            f"later ({DOCS})",
            code=500,
            kind="error",
        )
    if pod is None:  # the apiserver answers NotFound itself; a later pod of that name has another UID
        return Outcome(allowed=True, kind="admitted", details={"node": node})
    pod_uid = _field(pod, "metadata", "uid")
    if pod_uid != uid:
        return _refuse(user, f"{pod_ref} has UID {pod_uid}, not {uid} as the eviction names")
    pod_node = _field(pod, "spec", "nodeName")
    if pod_node != node:
        where = f"runs on node {pod_node}" if isinstance(pod_node, str) and pod_node else "is on no node yet"
        return _refuse(user, f"its token is bound to node {node}, and {pod_ref} {where}")
    return Outcome(allowed=True, kind="admitted", details={"node": node})
