#!/usr/bin/env bash
# Create .venv with the project installed editable plus its dev tools; idempotent.
#
# Usage: hack/venv.sh            (the Makefile targets call it before using .venv/bin/*)
#
# Environment:
#   VENV     where the virtualenv lives (default .venv in the repository root)
#   PYTHON   interpreter to create it with (default: the first of python3.13/3.12/3.11/python3 that is >= 3.11)
#
# The dependencies come from requirements/dev.lock (every package pinned with its sha256 hashes, resolved
# by uv for Python >= 3.11 on every platform; refresh it with `make lock` after changing pyproject.toml),
# installed with pip --require-hashes; then the project itself, editable, without dependencies. A check
# that the lock satisfies pyproject.toml's requirements catches a lock that was not refreshed.
#
# Re-installs only when pyproject.toml or the lock changed since the last successful install (their
# sha256 is kept in a stamp file inside the venv), so `make demo` / `make test` cost nothing after the
# first run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
LOCK=requirements/dev.lock
STAMP="$VENV/.deps.sha256"

find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "hack/venv.sh: need Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  python=${PYTHON:-$(find_python)}
  echo "hack/venv.sh: creating $VENV with $python" >&2
  "$python" -m venv "$VENV"
fi

want=$(cat pyproject.toml "$LOCK" | sha256sum | cut -d' ' -f1)
have=$(cat "$STAMP" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  echo "hack/venv.sh: installing $LOCK and kube-vgpu into $VENV (pyproject.toml or the lock changed, or first run)" >&2
  pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install --quiet --require-hashes -r "$LOCK"
  "${pip[@]}" install --quiet --no-deps -e .
  # Every requirement of kube-vgpu and its dev extra must be met by what the lock installed.
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

unmet = []
for line in md.requires("kube-vgpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": "dev"}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(f"{req} (not in the lock)")
        continue
    if not req.specifier.contains(version, prereleases=True):
        unmet.append(f"{req} (the lock has {version})")
if unmet:
    sys.exit("hack/venv.sh: requirements/dev.lock does not satisfy pyproject.toml: " + "; ".join(unmet) + ". Refresh it with `make lock`.")
PY
  echo "$want" >"$STAMP"
fi
