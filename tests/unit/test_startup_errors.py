"""Each service started without a prerequisite (apiserver, kubelet folder, certificate, file) exits 2 with one
line naming what is missing and the flag/env to pass, never a traceback. The real entry points, as
subprocesses, in an environment with no in-cluster service account and no kubeconfig."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from webhook import certs

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(program: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "VGPU_", "KUBECONFIG", "NODE_NAME"))}
    env["HOME"] = str(home)  # no ~/.kube/config
    exe = BIN / program
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", ENTRY_MODULES[program]]
    return subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=60, cwd=home)


ENTRY_MODULES = {
    "vgpu-device-plugin": "device_plugin.main",
    "vgpu-extender": "scheduler_extender.main",
    "vgpu-webhook": "webhook.main",
}


def assert_clear(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def kube_free(tmp_path: Path) -> Path:
    return tmp_path


def extender_auth_args(home: Path) -> list[str]:
    """The kube source may require client authentication; opt out where the flag exists (not the point here)."""
    help_text = run("vgpu-extender", "--help", home=home).stdout
    return ["--allow-unauthenticated"] if "--allow-unauthenticated" in help_text else []


# --- device plugin ----------------------------------------------------------------------------------


def test_device_plugin_without_plugin_dir(kube_free: Path) -> None:
    proc = run("vgpu-device-plugin", "--node-name", "n1", "--plugin-dir", str(kube_free / "absent"), home=kube_free)
    assert_clear(proc, "kubelet device-plugins folder", str(kube_free / "absent"), "--plugin-dir", "VGPU_DP_PLUGIN_DIR")


def test_device_plugin_without_apiserver(kube_free: Path) -> None:
    proc = run("vgpu-device-plugin", "--node-name", "n1", "--plugin-dir", str(kube_free), home=kube_free)
    assert_clear(proc, "no Kubernetes API", "Service host/port is not set", "--kubeconfig", "VGPU_DP_KUBECONFIG")


def test_device_plugin_with_unreadable_kubeconfig(kube_free: Path) -> None:
    bad = kube_free / "missing-kubeconfig"
    proc = run(
        "vgpu-device-plugin",
        "--node-name",
        "n1",
        "--plugin-dir",
        str(kube_free),
        "--kubeconfig",
        str(bad),
        home=kube_free,
    )
    assert_clear(proc, f"cannot load the kubeconfig {bad}", "--kubeconfig")


def test_device_plugin_with_missing_fake_nvml_scenario(kube_free: Path) -> None:
    proc = run("vgpu-device-plugin", "--node-name", "n1", "--fake-nvml", "nope.yaml", home=kube_free)
    assert_clear(proc, "fake-NVML scenario nope.yaml does not exist", "--fake-nvml", "VGPU_DP_FAKE_NVML")


# --- extender ---------------------------------------------------------------------------------------


def test_device_plugin_with_missing_hami_core_library(kube_free: Path) -> None:
    lib = str(kube_free / "libvgpu.so")
    proc = run("vgpu-device-plugin", "--node-name", "n1", "--hami-core-library", lib, home=kube_free)
    assert_clear(proc, f"HAMi-core library {lib} does not exist", "--hami-core-library", "VGPU_DP_HAMI_CORE_LIBRARY")


def test_device_plugin_with_an_unwritable_hami_core_dir(kube_free: Path) -> None:
    (kube_free / "libvgpu.so").write_bytes(b"")
    (kube_free / "file").write_text("")
    bad = str(kube_free / "file" / "hami")  # under a regular file: cannot be created
    args = ["--hami-core-library", str(kube_free / "libvgpu.so"), "--hami-core-dir", bad]
    proc = run("vgpu-device-plugin", "--node-name", "n1", "--plugin-dir", str(kube_free), *args, home=kube_free)
    assert_clear(proc, f"cannot write HAMi-core's ld.so.preload under hami_core_dir {bad}", "--hami-core-dir")


def test_extender_without_apiserver(kube_free: Path) -> None:
    proc = run("vgpu-extender", *extender_auth_args(kube_free), home=kube_free)
    assert_clear(proc, "no Kubernetes API", "--kubeconfig", "VGPU_EXTENDER_KUBECONFIG", "--source file")


def test_extender_with_unreadable_kubeconfig(kube_free: Path) -> None:
    bad = kube_free / "kc"
    proc = run("vgpu-extender", *extender_auth_args(kube_free), "--kubeconfig", str(bad), home=kube_free)
    assert_clear(proc, f"cannot load the kubeconfig {bad}", "--kubeconfig")


def test_extender_with_missing_cluster_file(kube_free: Path) -> None:
    proc = run("vgpu-extender", "--source", "file", "--cluster-file", "absent.yaml", home=kube_free)
    assert_clear(proc, "cluster file absent.yaml does not exist", "--cluster-file", "VGPU_EXTENDER_CLUSTER_FILE")


def test_extender_with_missing_tls_files(kube_free: Path) -> None:
    cluster = str(REPO / "vgpu_cli" / "data" / "demo-cluster.yaml")
    args = ["--source", "file", "--cluster-file", cluster, "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"]
    proc = run("vgpu-extender", *args, home=kube_free)
    assert_clear(proc, "tls cert file c.pem does not exist", "--tls-cert-file", "VGPU_EXTENDER_TLS_CERT_FILE")


# --- webhook ----------------------------------------------------------------------------------------


def test_webhook_without_certificate(kube_free: Path) -> None:
    proc = run("vgpu-webhook", "serve", "--inventory-source", "none", home=kube_free)
    assert_clear(proc, "TLS certificate /etc/vgpu-webhook/tls/tls.crt does not exist", "--cert-file", "gen-certs")


def test_webhook_without_key(kube_free: Path) -> None:
    paths = certs.write_dev_certs(kube_free / "tls", certs.DEFAULT_HOSTS)
    args = ["serve", "--cert-file", str(paths.cert), "--key-file", "k.pem", "--inventory-source", "none"]
    proc = run("vgpu-webhook", *args, home=kube_free)
    assert_clear(proc, "TLS key k.pem does not exist", "--key-file", "VGPU_WEBHOOK_KEY_FILE")


def test_webhook_node_inventory_without_apiserver(kube_free: Path) -> None:
    paths = certs.write_dev_certs(kube_free / "tls", certs.DEFAULT_HOSTS)
    proc = run("vgpu-webhook", "serve", "--cert-file", str(paths.cert), "--key-file", str(paths.key), home=kube_free)
    assert_clear(proc, "no Kubernetes API", "--kubeconfig", "VGPU_WEBHOOK_KUBECONFIG", "--inventory-source static")


def test_webhook_install_certs_without_apiserver(kube_free: Path) -> None:
    proc = run("vgpu-webhook", "install-certs", "--kubeconfig", str(kube_free / "kc"), home=kube_free)
    assert_clear(proc, "cannot load the kubeconfig", "--kubeconfig")
