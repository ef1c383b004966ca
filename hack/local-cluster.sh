#!/usr/bin/env bash
# Start a local control plane (etcd, kube-apiserver, kube-scheduler, 2 plain GPU nodes) on 127.0.0.1 for a
# person to use with kubectl. Prints the KUBECONFIG to export; Ctrl-C stops and removes everything.
#
#   hack/local-cluster.sh [--nodes N] [--gpus N] [--scheduler-config FILE] [--no-scheduler] [--kwok]
#                         [--with-vgpu] [--workdir DIR]
#   hack/local-cluster.sh build      # only build/install the binaries and print where they are
#
# Builds the binaries on first use (hack/build-control-plane.sh, cached). Runs kube_vgpu_dev.cli with the
# project's virtualenv (.venv, `make venv`) when there is one. See docs/controlplane.md.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
case "${1:-}" in
  build) exec "$python" -m kube_vgpu_dev build ;;
  up) shift; exec "$python" -m kube_vgpu_dev up "$@" ;;
  -h|--help) exec "$python" -m kube_vgpu_dev up --help ;;
  *) exec "$python" -m kube_vgpu_dev up "$@" ;;
esac
