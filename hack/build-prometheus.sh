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
# The whole script is one function, so that bash has read all of it before running any: editing this file
# while a build runs cannot break that build.
main() {

VERSION="${KUBE_VGPU_PROMETHEUS_VERSION:-v0.316.0}"
# shellcheck source=hack/lib/go-tool.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"
go_tool_begin prometheus github.com/prometheus/prometheus 18 "$@"

build_banner "prometheus $VERSION (github.com/prometheus/prometheus/cmd/prometheus, tags remove_all_sd)" "a few minutes" "$WORK"
progress_run prometheus "$BUILD_LOG" env GOBIN="$tmp" GOFLAGS="${GOFLAGS:--buildvcs=false}" nice -n 10 \
  go install -v -tags remove_all_sd -trimpath -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/prometheus@$VERSION"
mv -f "$tmp/prometheus" "$BIN"
log "built $BIN in $(( $(date +%s) - start )) s"
echo "$BIN"
}
main "$@"
