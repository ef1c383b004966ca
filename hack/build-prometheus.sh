#!/usr/bin/env bash
# Build the `prometheus` server from the Go module github.com/prometheus/prometheus, cached outside the
# repository (the e2e dashboard test runs it). See docs/telemetry.md.
#
# Usage: hack/build-prometheus.sh [--print-bin] [--force]
#
# Environment:
#   KUBE_VGPU_PROMETHEUS_VERSION  Go module version (default below; v0.316.0 is Prometheus 3.16.0)
#   KUBE_VGPU_CACHE               cache root (default $HOME/.cache/kube-vgpu)
#
# How: `go install github.com/prometheus/prometheus/cmd/prometheus@<version>` (the module has no replace
# directives, so no wrapper module is needed). Tags:
#   - without `builtinassets` the React UI is not embedded (web/ui/static is not in the module zip; it is
#     built by npm in Prometheus' release process). The HTTP API, which is all we use, works; the UI pages
#     answer with an error.
#   - `remove_all_sd` drops the cloud service-discovery plugins (AWS, Azure, GCE, Kubernetes, ...): static
#     and file SD stay, and the build is several times smaller and faster.
# The binary is moved into place atomically; concurrent callers are serialised with flock.
set -euo pipefail

VERSION="${KUBE_VGPU_PROMETHEUS_VERSION:-v0.316.0}"
CACHE_ROOT="${KUBE_VGPU_CACHE:-$HOME/.cache/kube-vgpu}"
WORK="$CACHE_ROOT/prometheus-$VERSION"
BIN="$WORK/bin/prometheus"

print_only=0
force=0
for arg in "$@"; do
  case "$arg" in
    --print-bin) print_only=1 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[build-prometheus] $*" >&2; }

if (( print_only )); then echo "$BIN"; exit 0; fi
if (( ! force )) && [[ -x "$BIN" ]]; then
  log "cached: $BIN (github.com/prometheus/prometheus $VERSION)"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed (need Go >= the 'go' line of prometheus' go.mod)"; exit 1; }
mkdir -p "$WORK/bin"
exec 9>"$WORK/.lock"
flock 9
if (( ! force )) && [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi

tmp="$(mktemp -d "$WORK/build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "building github.com/prometheus/prometheus/cmd/prometheus@$VERSION (tags remove_all_sd) ..."
start=$(date +%s)
GOBIN="$tmp" GOFLAGS="${GOFLAGS:--buildvcs=false}" nice -n 10 \
  go install -tags remove_all_sd -trimpath -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/prometheus@$VERSION"
mv -f "$tmp/prometheus" "$BIN"
log "built $BIN in $(( $(date +%s) - start )) s"
echo "$BIN"
