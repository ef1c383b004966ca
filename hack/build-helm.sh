#!/usr/bin/env bash
# Build the `helm` CLI from the Go module helm.sh/helm/v3, cached outside the repository. The chart tests
# (tests/unit/test_helm_chart.py) lint and render deploy/helm/kube-vgpu with it.
#
# Usage: hack/build-helm.sh [--print-bin] [--force]
#
# Environment:
#   KUBE_VGPU_HELM_VERSION  Go module version of helm.sh/helm/v3 (default below)
#   KUBE_VGPU_CACHE         cache root (default $HOME/.cache/kube-vgpu)
#
# How: `go install helm.sh/helm/v3/cmd/helm@<version>` with CGO off and the -X flags of helm's own Makefile
# (below). -mod=mod lets the go command resolve the module graph itself (there is no wrapper module). The binary is moved into place atomically; concurrent callers are serialised with flock.
# Prints the binary's path as its last line.
set -euo pipefail
# The whole script is one function, so that bash has read all of it before running any: editing this file
# while a build runs cannot break that build.
main() {

VERSION="${KUBE_VGPU_HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${KUBE_VGPU_CACHE:-$HOME/.cache/kube-vgpu}"
WORK="$CACHE_ROOT/helm-$VERSION"
BIN="$WORK/bin/helm"

print_only=0
force=0
for arg in "$@"; do
  case "$arg" in
    --print-bin) print_only=1 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[build-helm] $*" >&2; }

if (( print_only )); then echo "$BIN"; exit 0; fi
if (( ! force )) && [[ -x "$BIN" ]]; then
  log "cached: $BIN (helm.sh/helm/v3 $VERSION)"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed (need Go >= the 'go' line of helm's go.mod)"; exit 1; }
mkdir -p "$WORK/bin"
exec 9>"$WORK/.lock"
flock 9
if (( ! force )) && [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi

tmp="$(mktemp -d "$WORK/build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export GOFLAGS="-mod=mod ${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
start=$(date +%s)
# helm's own Makefile stamps its version and the Kubernetes version it assumes when no cluster is asked
# (`helm template`, `helm lint`: .Capabilities.KubeVersion) from the k8s.io/client-go it builds against;
# without these, helm assumes v1.20 and a chart's kubeVersion ">=1.30" fails to render. Same flags here.
gomod=$(go mod download -json "helm.sh/helm/v3@$VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
client_go=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$gomod")   # v0.<minor>.<patch>
[[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || { log "cannot read k8s.io/client-go's version from $gomod"; exit 1; }
k8s_minor="${BASH_REMATCH[1]}"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
log "building helm.sh/helm/v3/cmd/helm@$VERSION (Kubernetes 1.$k8s_minor by default, CGO_ENABLED=0, nice 10) ..."
GOBIN="$tmp" nice -n 10 go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$VERSION"
"$tmp/helm" version --short >/dev/null || { log "the built helm does not run"; exit 1; }
mv -f "$tmp/helm" "$BIN"
log "built $BIN in $(( $(date +%s) - start )) s"
echo "$BIN"
}
main "$@"
