# Visible progress for the long first builds of the hack/build-*.sh scripts. Source it after defining `log`.
#
#   build_banner <what> <how long a first build takes> <cache dir>
#       one line before a build starts: what is built, that it happens once, and where it is cached
#   progress_run <what> <log file> <command...>
#       runs the command (a `go get` / `go build -v` / `go install -v`) with its stderr in <log file> and,
#       every KUBE_VGPU_PROGRESS_SECONDS (whole seconds, default 30) while it runs, one line: time so far, modules
#       downloaded, packages compiled and the last one. On failure the end of the log (the compiler's
#       errors) is printed. Returns the command's exit status.
# Go's own output is thousands of "go: downloading" and package lines; the log keeps all of it.

build_banner() {
  log "building $1: done once, cached in $3 (set KUBE_VGPU_CACHE to move it); a first build takes $2 on 2 cores"
}

progress_run() {
  local what=$1 logf=$2
  shift 2
  local every=${KUBE_VGPU_PROGRESS_SECONDS:-30} t0 pid ticker rc=0
  t0=$(date +%s)
  : >"$logf"
  "$@" 2>>"$logf" &
  pid=$!
  # The ticker looks every second and ends by itself once the build has (no sleeping child left behind to
  # hold our stderr open).
  (
    local next=$every downloads packages last
    while kill -0 "$pid" 2>/dev/null; do
      sleep 1
      (($(date +%s) - t0 >= next)) && kill -0 "$pid" 2>/dev/null || continue
      next=$((next + every))
      downloads=$(grep -c '^go: downloading' "$logf" || true)
      # `go build -v` prints one import path per package it compiles: a line without spaces, not "go: ..."
      packages=$(grep -Evc '^go: | |^#' "$logf" || true)
      last=$(grep -Ev '^go: | |^#' "$logf" | tail -n 1 || true)
      log "$what: $(($(date +%s) - t0)) s so far; $downloads modules downloaded, $packages packages compiled${last:+ (now: $last)}"
    done
  ) &
  ticker=$!
  wait "$pid" || rc=$?
  wait "$ticker" 2>/dev/null || true
  if ((rc != 0)); then
    log "$what failed (exit $rc) after $(($(date +%s) - t0)) s; the end of its output ($logf):"
    grep -v '^go: downloading' "$logf" | tail -n 40 >&2 || true
  fi
  return "$rc"
}
