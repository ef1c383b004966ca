"""The placement core compiled with mypyc, in a tree of its own: ``python -m kube_vgpu_dev native OUT``.

The cold pass over every node (a new pod shape, each relearn) is pure Python in the planner, the fit and the
fragmentation policies; mypyc compiles those modules, unchanged, to C extensions (benchmarks/native_speed.py measures
what that saves, same run, and checks that every decision stays byte-identical). Nothing here is shipped or used by
the services yet: the build copies the importable packages into OUT and compiles there, so the repository never holds
a stale extension that Python would import in place of an edited module.

Compiled code differs from the interpreter's in a few ways the sources must respect (each was met here): a tuple
keeps no identity (`is` against a tuple constant), a class attribute's default is not readable from the class,
`object.__new__` of a compiled class is refused, a `runtime_checkable` Protocol cannot be compiled (so
vgpu/placement/base.py stays interpreted), and an `int` stored into a `float` variable must be converted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The modules of the cold pass (benchmarks/cold_shape.py --where), compiled together so their calls to each other
# are native calls.
NATIVE_MODULES = (
    "vgpu/fit.py",
    "vgpu/state.py",
    "vgpu/planner.py",
    "vgpu/placement/binpack.py",
    "vgpu/placement/fgd.py",
    "vgpu/placement/frag.py",
    "vgpu/placement/fragaware.py",
    "vgpu/placement/gpushare.py",
    "vgpu/placement/role_score.py",
)
# What a compiled tree holds besides: the packages the services and benchmarks import, and mypy's configuration.
_COPIED = (
    "vgpu",
    "vgpu_cli",
    "vgpu_http",
    "scheduler_extender",
    "webhook",
    "device_plugin",
    "benchmarks",
    "tests",
    "kube_vgpu_dev",
)


class NativeBuildError(RuntimeError):
    pass


def missing_tools() -> str | None:
    """Why a build cannot run on this machine, or None."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        return "no C compiler (gcc or cc) on PATH"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy: `make venv`)"
    return None


def build(out: Path, *, root: Path = ROOT) -> Path:
    """Copy the packages of `root` into `out` (which must not exist) and compile `NATIVE_MODULES` there in place.
    Returns `out`; raises NativeBuildError with mypyc's last lines when the compile fails."""
    why = missing_tools()
    if why is not None:
        raise NativeBuildError(f"cannot compile the placement core: {why}")
    if out.exists():
        raise NativeBuildError(f"{out} exists; give a new folder (the build copies the sources into it)")
    out.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "results")
    for name in _COPIED:
        shutil.copytree(root / name, out / name, ignore=ignore)
    shutil.copy2(root / "pyproject.toml", out / "pyproject.toml")
    proc = subprocess.run(
        [sys.executable, "-m", "mypyc", *NATIVE_MODULES],
        cwd=out,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same build from the same sources
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise NativeBuildError(f"mypyc failed (exit {proc.returncode}) in {out}:\n{tail}")
    shutil.rmtree(out / "build", ignore_errors=True)  # setuptools' objects; the extensions were copied in place
    not_built = [m for m in NATIVE_MODULES if not compiled(out, m)]
    if not_built:
        raise NativeBuildError(f"mypyc reported success but left no extension for {', '.join(not_built)} in {out}")
    return out


def compiled(tree: Path, module: str) -> Path | None:
    """The extension built for `module` (a path like vgpu/fit.py) in `tree`, if any."""
    path = tree / module
    found = sorted(path.parent.glob(f"{path.stem}.*.so"))
    return found[0] if found else None
