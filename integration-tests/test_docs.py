"""The docs a user reads: no paths of the machine that wrote them, no links to files that do not exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A path of one machine: a home, a temp folder, a checkout or venv location, a Windows drive.
# Built from parts, so that this file does not itself name the folders it looks for.
_FOLDERS = "|".join("/" + name + "/" for name in ("work", "tmp", "home", "root", "Users", "opt"))
LOCAL_PATH = re.compile(r"(?<![\w.<])(" + _FOLDERS + r"|[A-Z]:\\\\)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:  # not a git checkout (an sdist): walk the tree
        return [p for pat in patterns for p in ROOT.rglob(pat.replace("**/", "")) if ".nox" not in p.parts]
    return [ROOT / line for line in out.stdout.splitlines() if line]


def _docs() -> list[Path]:
    return [p for p in _tracked("*.md", "**/*.md") if p.exists()]


def test_no_machine_paths_in_docs_or_sources() -> None:
    """No Markdown file, package source or pyproject names a folder of one machine."""
    files = _docs() + [p for p in _tracked("packages/*/src/**/*.py", "packages/*/pyproject.toml") if p.exists()]
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if LOCAL_PATH.search(line) and "fake" not in line  # the testing fakes name made-up folders on purpose
    ]
    assert not found, "\n".join(found)


def test_relative_links_point_at_files_that_exist() -> None:
    """Every relative link of a Markdown file resolves to a file or folder of the repository."""
    broken = []
    for doc in _docs():
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("readme", sorted((ROOT / "packages").glob("*/README.md")), ids=lambda p: p.parent.name)
def test_package_readmes_use_absolute_links(readme: Path) -> None:
    """A package README is its PyPI page, where a relative link is broken: every link there is absolute."""
    relative = [t for t in LINK.findall(readme.read_text(encoding="utf-8")) if not re.match(r"^(https?:|mailto:|#)", t)]
    assert not relative, relative


def test_export_guide_lists_every_pass_in_run_order() -> None:
    """docs/export.md's pass table names every registered rewrite pass, in the order the pipeline runs them."""
    from qnnx_export._passes import DEFAULT_PASSES

    text = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| \d+ \| `([a-z0-9_]+)` \|", text, flags=re.MULTILINE)
    assert tuple(listed) == DEFAULT_PASSES


def test_export_guide_counts_the_translated_overloads() -> None:
    """docs/export.md's count of the direct translator's ATen overloads is the registry's."""
    import qnnx_export as qe

    text = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    counts = re.findall(r"`qe\.fast_path_ops\(\)` lists the (\d+) it has", text)
    assert counts == [str(len(qe.fast_path_ops()))]
