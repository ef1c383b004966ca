# Shared by the hack/build-*.sh scripts that `go install` one tool into the cache outside the repository:
# arguments (--print-bin, --force, --help), the cached fast path, the flock that serialises concurrent
# builds, and a temporary GOBIN under the tool's cache directory (removed on exit) so the binary can be moved
# into place atomically. Source it, set VERSION, then call:
#
#   go_tool_begin <tool> <module> <last help line of the script> "$@"
#
# Afterwards WORK, BIN, BUILD_LOG, tmp and start are set, `log` prints with the script's prefix and
# hack/lib/progress.sh's build_banner / progress_run are loaded; when the tool is cached (or only its path
# was asked) the function has already printed the path and exited.

# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

go_tool_begin() {
  local module=$2 help_to=$3
  TOOL=$1
  shift 3
  local cache_root="${KUBE_VGPU_CACHE:-$HOME/.cache/kube-vgpu}"
  WORK="$cache_root/$TOOL-$VERSION"
  BIN="$WORK/bin/$TOOL"
  BUILD_LOG="$WORK/build.log"

  local print_only=0 force=0 arg
  for arg in "$@"; do
    case "$arg" in
      --print-bin) print_only=1 ;;
      --force) force=1 ;;
      -h|--help) sed -n "2,${help_to}p" "$0"; exit 0 ;;
      *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
  done

  if (( print_only )); then echo "$BIN"; exit 0; fi
  if (( ! force )) && [[ -x "$BIN" ]]; then
    log "cached: $BIN ($module $VERSION)"
    echo "$BIN"
    exit 0
  fi

  command -v go >/dev/null || { log "go is not installed (need Go >= the 'go' line of $module's go.mod)"; exit 1; }
  mkdir -p "$WORK/bin"
  exec 9>"$WORK/.lock"
  flock 9
  if (( ! force )) && [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi

  tmp="$(mktemp -d "$WORK/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
}

log() { echo "[build-$TOOL] $*" >&2; }
