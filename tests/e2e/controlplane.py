"""The control-plane harness for the e2e tests; it lives in kube_vgpu_dev (docs/controlplane.md).

Re-exported here so that tests keep importing ``from tests.e2e.controlplane import ControlPlane, ...``.
"""

from kube_vgpu_dev.binaries import ensure_binaries, ensure_kwok, ensure_prometheus
from kube_vgpu_dev.components import DEFAULT_SCHEDULER_CONFIG, KWOK_NODE_ANNOTATION
from kube_vgpu_dev.controlplane import ControlPlane
from kube_vgpu_dev.kubeconfig import kubeconfig_text
from kube_vgpu_dev.objects import DEFAULT_NODE_CAPACITY
from kube_vgpu_dev.pki import CertificateAuthority, make_ca_and_server_cert
from kube_vgpu_dev.processes import ControlPlaneError, ManagedProcess, free_port
from webhook.certs import KeyPair

__all__ = [
    "DEFAULT_NODE_CAPACITY",
    "DEFAULT_SCHEDULER_CONFIG",
    "KWOK_NODE_ANNOTATION",
    "CertificateAuthority",
    "ControlPlane",
    "ControlPlaneError",
    "KeyPair",
    "ManagedProcess",
    "ensure_binaries",
    "ensure_kwok",
    "ensure_prometheus",
    "free_port",
    "kubeconfig_text",
    "make_ca_and_server_cert",
]
