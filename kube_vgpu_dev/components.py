"""The command lines of etcd, kube-apiserver, kube-scheduler and KWOK, and the scheduler's configuration.

Pure: paths and ports in, argv out; ``controlplane.ControlPlane`` starts what these describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from kube_vgpu_dev.pki import ClusterPki

KWOK_NODE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}  # nodes with it are run by start_kwok()'s controller
DEFAULT_SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
"""


def etcd_argv(etcd: Path, data_dir: Path, client_url: str, peer_url: str, *, no_fsync: bool) -> list[str]:
    """A one-member etcd on loopback; *no_fsync* (etcd >= 3.5) is much faster on slow disks, for test data."""
    argv = [
        str(etcd),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--initial-cluster-state=new",
        "--log-level=warn",
    ]
    if no_fsync:
        argv.append("--unsafe-no-fsync")
    return argv


def apiserver_argv(
    binary: Path,
    *,
    etcd_url: str,
    port: int,
    pki: ClusterPki,
    cert_dir: Path,
    verbosity: int,
    disable_admission_plugins: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """kube-apiserver on 127.0.0.1:*port*: client certificates from the cluster CA, Node+RBAC authorization, no
    anonymous access, ServiceAccount tokens, the front proxy as kubeadm configures it."""
    argv = [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.apiserver_cert}",
        f"--tls-private-key-file={pki.apiserver_key}",
        f"--client-ca-file={pki.ca_file}",
        "--authorization-mode=Node,RBAC",
        "--anonymous-auth=false",
        f"--requestheader-client-ca-file={pki.front_proxy_ca_file}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_cert}",
        f"--proxy-client-key-file={pki.front_proxy_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        # No Endpoints for the kubernetes Service: 127.0.0.1 is not a valid endpoint address.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
        f"--cert-dir={cert_dir}",
        f"--v={verbosity}",
    ]
    if disable_admission_plugins:
        argv.append("--disable-admission-plugins=" + ",".join(disable_admission_plugins))
    return argv + list(extra)


def scheduler_config(config_yaml: str | None, kubeconfig: Path) -> str:
    """A KubeSchedulerConfiguration (default profile if None) that connects with *kubeconfig*; leader election
    off unless the YAML turns it on."""
    doc: dict[str, Any] = yaml.safe_load(config_yaml or DEFAULT_SCHEDULER_CONFIG) or {}
    doc.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
    doc.setdefault("kind", "KubeSchedulerConfiguration")
    doc.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    doc.setdefault("leaderElection", {}).setdefault("leaderElect", False)
    return yaml.safe_dump(doc, sort_keys=False)


def scheduler_argv(
    binary: Path, *, config: Path, port: int, kubeconfig: Path, cert_dir: Path, verbosity: int, extra: Sequence[str]
) -> list[str]:
    """kube-scheduler on 127.0.0.1:*port*, delegating authentication and authorization to the apiserver."""
    return [
        str(binary),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--cert-dir={cert_dir}",
        f"--v={verbosity}",
        *extra,
    ]


def kwok_argv(binary: Path, stages: Sequence[Path], kubeconfig: Path) -> list[str]:
    """KWOK's controller for the nodes carrying KWOK_NODE_ANNOTATION only, with the given stage configs."""
    ((key, value),) = KWOK_NODE_ANNOTATION.items()
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={key}={value}",
        "--cidr=10.0.0.0/16",
        "--node-ip=127.0.0.1",
        *[f"--config={s}" for s in stages],
    ]
