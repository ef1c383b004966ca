#!/usr/bin/env bash
# Start a local control plane (etcd, kube-apiserver, kube-scheduler, 2 plain GPU nodes) on 127.0.0.1 for a
# person to use with kubectl. Prints the KUBECONFIG to export; Ctrl-C stops and removes everything.
#
#   hack/local-cluster.sh [--nodes N] [--gpus N] [--scheduler-config FILE] [--no-scheduler] [--kwok] [--workdir DIR]
#
# Builds the binaries on first use (hack/build-control-plane.sh, cached). See docs/controlplane.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m tests.e2e.controlplane up "$@"
