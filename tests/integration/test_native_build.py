"""The placement core compiled with mypyc (kube_vgpu_dev.native) decides exactly as the interpreted sources do.

Compiled code breaks a few things the interpreter allows (a tuple's identity, a class attribute read from the class,
`object.__new__`): each broke a decision or a call here before the sources were changed. The compiled tree is built
once (~1.5 min), then benchmarks/native_speed.py runs the cold pass of every shape on both cluster kinds and the warm
loop in both trees, per policy, and must find every digest equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kube_vgpu_dev.native import NATIVE_MODULES, ROOT, build, compiled, missing_tools

pytestmark = pytest.mark.skipif(missing_tools() is not None, reason=f"no native build here: {missing_tools()}")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("native") / "tree")


def test_every_listed_module_is_an_extension_and_is_what_the_tree_imports(tree: Path) -> None:
    assert all(compiled(tree, m) is not None for m in NATIVE_MODULES)
    names = [m.removesuffix(".py").replace("/", ".") for m in NATIVE_MODULES]
    code = f"import importlib, json; print(json.dumps([importlib.import_module(n).__file__ for n in {names!r}]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True).stdout
    files = json.loads(out)
    assert [Path(f).suffix for f in files] == [".so"] * len(names), files
    assert all(Path(f).is_relative_to(tree) for f in files)
    assert not list(ROOT.glob("vgpu/**/*.so")), "the build must leave the repository's sources alone"


@pytest.mark.parametrize("policy", ["default", "fgd", "binpack"])
def test_compiled_decisions_equal_the_interpreted_ones(tree: Path, policy: str) -> None:
    small = ["--nodes", "400", "--rounds", "1", "--passes", "1", "--warm-pods", "40", "--policy", policy]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "native_speed.py"), "--tree", str(tree), *small],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "decisions: identical" in proc.stdout
    digests = [line for line in proc.stdout.splitlines() if line.startswith("digest ")]
    assert len(digests) == 3 and not any("DIFFERENT" in d for d in digests), digests
