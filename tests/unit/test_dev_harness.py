"""kube_vgpu_dev's pure parts: the components' command lines and scheduler configuration, the cluster PKI, the
developer cluster's argument checks (no process started)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from kube_vgpu_dev import cli, components
from kube_vgpu_dev.kubeconfig import kubeconfig_text
from kube_vgpu_dev.pki import ClusterPki, make_cluster_pki
from kube_vgpu_dev.processes import free_port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    return make_cluster_pki(tmp_path_factory.mktemp("pki"))


def test_cluster_pki_signs_the_apiserver_and_admin_and_keeps_the_front_proxy_apart(pki: ClusterPki) -> None:
    ca = x509.load_pem_x509_certificate(pki.ca_file.read_bytes())
    apiserver = x509.load_pem_x509_certificate(pki.apiserver_cert.read_bytes())
    apiserver.verify_directly_issued_by(ca)
    san = apiserver.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    x509.load_pem_x509_certificate(pki.admin_cert.read_bytes()).verify_directly_issued_by(ca)
    front = x509.load_pem_x509_certificate(pki.front_proxy_cert.read_bytes())
    front.verify_directly_issued_by(pki.front_proxy_ca.keypair.certificate)
    with pytest.raises(ValueError):  # another issuer: the front proxy's client is not a cluster user
        front.verify_directly_issued_by(ca)
    assert pki.sa_key.stat().st_mode & 0o077 == 0 and b"PRIVATE KEY" in pki.sa_key.read_bytes()
    assert isinstance(load_pem_public_key(pki.sa_pub.read_bytes()), ec.EllipticCurvePublicKey)  # ES256 tokens


def test_apiserver_argv_wires_the_pki_and_the_plugins(pki: ClusterPki, tmp_path: Path) -> None:
    argv = components.apiserver_argv(
        tmp_path / "kube-apiserver",
        etcd_url="http://127.0.0.1:1",
        port=6443,
        pki=pki,
        cert_dir=tmp_path,
        verbosity=2,
        disable_admission_plugins=["ServiceAccount"],
        extra=["--feature-gates=X=true"],
    )
    assert f"--client-ca-file={pki.ca_file}" in argv
    assert f"--service-account-signing-key-file={pki.sa_key}" in argv
    assert f"--requestheader-client-ca-file={pki.front_proxy_ca_file}" in argv
    assert "--anonymous-auth=false" in argv and "--secure-port=6443" in argv
    assert argv[-2:] == ["--disable-admission-plugins=ServiceAccount", "--feature-gates=X=true"]


def test_scheduler_config_sets_the_kubeconfig_and_leaves_leader_election_to_the_yaml(tmp_path: Path) -> None:
    kc = tmp_path / "scheduler.kubeconfig"
    default = yaml.safe_load(components.scheduler_config(None, kc))
    assert default["kind"] == "KubeSchedulerConfiguration"
    assert default["clientConnection"]["kubeconfig"] == str(kc)
    assert default["leaderElection"] == {"leaderElect": False}
    own = "leaderElection: {leaderElect: true}\nprofiles: [{schedulerName: vgpu-scheduler}]\n"
    doc = yaml.safe_load(components.scheduler_config(own, kc))
    assert doc["leaderElection"]["leaderElect"] is True
    assert doc["profiles"] == [{"schedulerName": "vgpu-scheduler"}]
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"


def test_kwok_manages_only_annotated_nodes(tmp_path: Path) -> None:
    argv = components.kwok_argv(tmp_path / "kwok", [tmp_path / "a.yaml", tmp_path / "b.yaml"], tmp_path / "kc")
    ((key, value),) = components.KWOK_NODE_ANNOTATION.items()
    assert "--manage-all-nodes=false" in argv
    assert f"--manage-nodes-with-annotation-selector={key}={value}" in argv
    assert argv[-2:] == [f"--config={tmp_path / 'a.yaml'}", f"--config={tmp_path / 'b.yaml'}"]


def test_kubeconfig_embeds_server_ca_and_client(pki: ClusterPki) -> None:
    doc = yaml.safe_load(kubeconfig_text("https://127.0.0.1:6443", pki.ca.cert_pem, pki.admin_client, "admin"))
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert doc["users"][0]["name"] == "admin" == doc["contexts"][0]["context"]["user"]
    assert doc["current-context"] == doc["contexts"][0]["name"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--nodes", "-1"], "--nodes and --gpus take 0 or more"),
        (["up", "--scheduler-config", "/nonexistent/sched.yaml"], "no such file: /nonexistent/sched.yaml"),
    ],
)
def test_up_refuses_bad_arguments_before_starting_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_free_ports_lie_below_the_ephemeral_range_are_bindable_and_never_repeat() -> None:
    """A port from the ephemeral range can become some outgoing connection's source port before the server binds
    it ("address already in use" on a busy machine); free_port picks below the range, each port once."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except OSError:
        low = 32768
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    if low - 15000 >= 1000:
        assert all(15000 <= p < low for p in ports), ports
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
