"""The developer cluster: ``python -m kube_vgpu_dev up`` (``hack/local-cluster.sh``) runs a control plane, and
optionally our stack on it, until Ctrl-C; ``build`` builds the binaries and says where they are."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from kube_vgpu_dev import stack
from kube_vgpu_dev.binaries import ensure_binaries
from kube_vgpu_dev.controlplane import ControlPlane
from kube_vgpu_dev.objects import DEFAULT_NODE_CAPACITY


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="hack/local-cluster.sh",
        description="A local Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver, kube-scheduler) for "
        "kubectl, with plain GPU nodes, or kube-vgpu's extender and GPU nodes (--with-vgpu). See docs/controlplane.md.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, kube-apiserver and kube-scheduler until Ctrl-C")
    up.add_argument("--scheduler-config", help="KubeSchedulerConfiguration YAML file (default profile if unset)")
    up.add_argument("--no-scheduler", action="store_true", help="do not start kube-scheduler")
    up.add_argument("--nodes", type=int, default=2, help="Nodes to create (default 2)")
    up.add_argument("--gpus", type=int, default=8, help="GPUs of each node (default 8)")
    up.add_argument("--kwok", action="store_true", help="run KWOK's controller for the nodes (pods become Running)")
    up.add_argument("--workdir", help="use this directory (kept) instead of a temp dir")
    up.add_argument(
        "--with-vgpu",
        action="store_true",
        help="also run kube-vgpu: the extender over mutual TLS, the shipped vgpu-scheduler profile, and GPU nodes "
        "carrying a device-plugin inventory (H100-80GB, 10 slices per GPU)",
    )
    sub.add_parser("build", help="build/install the binaries (cached) and print where they are")
    nat = sub.add_parser(
        "native",
        help="copy the packages into OUT and compile the placement core there with mypyc (kube_vgpu_dev.native); "
        "run a benchmark from OUT to use it (benchmarks/native_speed.py compares both)",
    )
    nat.add_argument("out", type=Path, help="a new folder for the compiled tree")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "build":
        bd, etcd = ensure_binaries()
        print(f"bin dir: {bd}\netcd:    {etcd}")
        return 0
    if args.cmd == "native":
        from kube_vgpu_dev.native import NATIVE_MODULES, NativeBuildError, build

        try:
            tree = build(args.out)
        except NativeBuildError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"compiled {len(NATIVE_MODULES)} modules into {tree}; e.g. cd {tree} && python benchmarks/cold_shape.py")
        return 0
    if args.nodes < 0 or args.gpus < 0:
        print(f"--nodes and --gpus take 0 or more (got {args.nodes}, {args.gpus})", file=sys.stderr)
        return 2
    if args.scheduler_config and not Path(args.scheduler_config).is_file():
        print(f"--scheduler-config: no such file: {args.scheduler_config}", file=sys.stderr)
        return 2
    return up(args)


def up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: it may be ignored if started with &
        signal.signal(sig, lambda *_: stop.set())
    with ControlPlane(workdir=args.workdir, keep_workdir=bool(args.workdir)) as cp:
        hint = ""
        if args.with_vgpu:
            stack.gpu_nodes(cp, "gpu-node", args.nodes, args.gpus)
            ext = stack.Extender(cp)
            ext.start()
            cp.start_scheduler(stack.scheduler_config(cp, ext))
            hint = extender_hint(cp, ext)
        else:
            for i in range(args.nodes):
                cp.add_node(f"node-{i}", {**DEFAULT_NODE_CAPACITY, "nvidia.com/gpu": str(args.gpus)}, kwok=args.kwok)
        if args.kwok:
            cp.start_kwok()
        if not args.no_scheduler and not args.with_vgpu:
            text = Path(args.scheduler_config).read_text() if args.scheduler_config else None
            cp.start_scheduler(text)
        info = {"server": cp.server, "kubeconfig": str(cp.admin_kubeconfig), "workdir": str(cp.workdir)}
        print(json.dumps(info, indent=2))
        print(
            f"\nexport KUBECONFIG={cp.admin_kubeconfig}\nexport PATH={cp.bin_dir}:$PATH   # kubectl\n"
            f"logs: {cp.logs_dir}\nCtrl-C stops everything.",
            flush=True,
        )
        if hint:
            print(hint, flush=True)
        while not stop.wait(1.0):
            dead = [p.name for p in cp.processes if not p.alive()]
            if dead:
                print(f"process exited: {dead}\n{cp.dump_logs()}", file=sys.stderr)
                return 1
        print("stopping...", file=sys.stderr)
    return 0


def extender_hint(cp: ControlPlane, ext: stack.Extender) -> str:
    """How to reach the extender: /state needs --enable-state (on here) and, like every verb, the client
    certificate kube-scheduler presents (mutual TLS); the probes are on the plain health port."""
    ca = cp.workdir / "vgpu-ca.pem"
    ca.write_bytes(cp.ca.cert_pem)
    cert, key = ext.client_cert
    return (
        f"\nkube-vgpu extender: {ext.url}  (serving CA: {ca}; probes and metrics: {ext.health_url})\n"
        f"  kubectl apply -f deploy/examples/llm-d-pd-pods.yaml && kubectl get pods -o wide\n"
        f"  curl -s --cacert {ca} --cert {cert} --key {key} {ext.url}/state > /tmp/vgpu-state.json && "
        f"vgpu show --cluster /tmp/vgpu-state.json"
    )
