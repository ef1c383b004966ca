#!/usr/bin/env bash
# Optional: build KWOK's controller (sigs.k8s.io/kwok/cmd/kwok) into the cache and copy its "fast" stage
# configs next to it. Prints the path of the kwok binary. Not needed by the default e2e setup (plain Nodes);
# ControlPlane.start_kwok() uses it to run pods on fake nodes (Running status, graceful deletes complete).
#
# Environment: KUBE_VGPU_KWOK_VERSION (default below), KUBE_VGPU_CACHE (default $HOME/.cache/kube-vgpu)
set -euo pipefail
# The whole script is one function, so that bash has read all of it before running any: editing this file
# while a (long) build runs cannot break that build.
main() {

KWOK_VERSION="${KUBE_VGPU_KWOK_VERSION:-v0.8.0}"
CACHE_ROOT="${KUBE_VGPU_CACHE:-$HOME/.cache/kube-vgpu}"
OUT="$CACHE_ROOT/kwok-$KWOK_VERSION"
STAGES=(node/fast/node-initialize.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

log() { echo "[build-kwok] $*" >&2; }
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

if [[ -x "$OUT/bin/kwok" && -d "$OUT/stages" ]]; then
  log "cached: $OUT/bin/kwok"
  echo "$OUT/bin/kwok"; exit 0
fi
command -v go >/dev/null || { log "go is not installed"; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [[ -x "$OUT/bin/kwok" && -d "$OUT/stages" ]]; then echo "$OUT/bin/kwok"; exit 0; fi

export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
start=$(date +%s)
build_banner "kwok (sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION, CGO_ENABLED=0, nice 10)" "a few minutes" "$OUT"
rm -rf "$OUT/bin.tmp"
progress_run kwok "$OUT/build.log" env GOBIN="$OUT/bin.tmp" CGO_ENABLED=0 nice -n 10 \
  go install -v -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"

# The stage configs ship in the module (kustomize/stage/...); without stages kwok does nothing.
src=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
rm -rf "$OUT/stages.tmp"; mkdir -p "$OUT/stages.tmp"
for s in "${STAGES[@]}"; do cp "$src/kustomize/stage/$s" "$OUT/stages.tmp/${s//\//-}"; done
chmod -R u+w "$OUT/stages.tmp"

rm -rf "$OUT/bin" "$OUT/stages"
mv "$OUT/bin.tmp" "$OUT/bin"; mv "$OUT/stages.tmp" "$OUT/stages"
log "built in $(( $(date +%s) - start ))s"
echo "$OUT/bin/kwok"
}
main "$@"
