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
# shellcheck source=hack/lib/go-tool.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"
go_tool_begin helm helm.sh/helm/v3 14 "$@"

export GOFLAGS="-mod=mod ${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
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
build_banner "helm $VERSION (helm.sh/helm/v3/cmd/helm, Kubernetes 1.$k8s_minor by default)" "a few minutes" "$WORK"
progress_run helm "$BUILD_LOG" env GOBIN="$tmp" nice -n 10 go install -v -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$VERSION"
"$tmp/helm" version --short >/dev/null || { log "the built helm does not run"; exit 1; }
mv -f "$tmp/helm" "$BIN"
log "built $BIN in $(( $(date +%s) - start )) s"
echo "$BIN"
}
main "$@"
