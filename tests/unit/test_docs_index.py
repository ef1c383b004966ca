"""The docs stay reachable and self-contained: the README links every doc, relative links resolve, and no
text points at documents outside the repository (the design brief's sections, issue numbers)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+\.md)(#[^)]*)?\)")


def test_readme_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in DOCS if f"(docs/{name})" not in readme]
    assert not missing, f"README.md's documentation list lacks {missing}"


def test_relative_doc_links_resolve() -> None:
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target, _anchor in LINK.findall(path.read_text()):
            if "://" not in target and not (path.parent / target).resolve().is_file():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_no_references_outside_the_repository() -> None:
    # Tracked text only (git ls-files), so build outputs and virtualenvs do not count.
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"DESIGN ?§|\b[Ii]ssues? #?\d+\b")
    hits = []
    for name in files:
        if not name.endswith((".py", ".md", ".yaml", ".yml", ".proto", ".sh", ".toml", ".tpl")) or name.startswith(
            "docs/img/"
        ):
            continue
        if name == "tests/unit/test_docs_index.py":
            continue
        for no, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{name}:{no}: {line.strip()[:100]}")
    assert not hits, "state the fact or point at the doc that holds it:\n" + "\n".join(hits)
