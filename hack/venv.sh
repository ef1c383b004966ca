#!/usr/bin/env bash
# Create .venv with the project installed editable plus its dev tools; idempotent.
#
# Usage: hack/venv.sh            (the Makefile targets call it before using .venv/bin/*)
#
# Environment:
#   VENV     where the virtualenv lives (default .venv in the repository root)
#   PYTHON   interpreter to create it with (default: the first of python3.13/3.12/3.11/python3 that is >= 3.11)
#
# Re-installs only when pyproject.toml changed since the last successful install (its sha256 is kept in
# a stamp file inside the venv), so `make demo` / `make test` cost nothing after the first run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
STAMP="$VENV/.pyproject.sha256"

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

want=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$STAMP" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  echo "hack/venv.sh: installing kube-vgpu[dev] into $VENV (pyproject.toml changed or first run)" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  echo "$want" >"$STAMP"
fi
