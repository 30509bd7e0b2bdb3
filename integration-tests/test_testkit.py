"""qnnx-testkit stays test support: no package's code imports it, it needs neither torch nor onnx, and tests reach
their helper modules through configuration (pytest's ``pythonpath`` option, ``PYTHONPATH`` for child processes),
never by editing ``sys.path``."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_no_package_code_imports_the_testkit() -> None:
    found = []
    for path in sorted((ROOT / "packages").glob("*/src/**/*.py")):
        if path.is_relative_to(ROOT / "packages" / "testkit"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "qnnx_testkit"]
    assert not found, found


def test_the_testkit_is_only_ever_a_test_requirement() -> None:
    """qnnx-testkit appears in test extras only, and itself depends on pytest and Hypothesis alone."""
    runtime = {
        p.name: _requirement_names(tomllib.loads((p / "pyproject.toml").read_text())["project"].get("dependencies", []))
        for p in PACKAGES
    }
    assert not [name for name, deps in runtime.items() if "qnnx-testkit" in deps and name != "testkit"]
    assert runtime["testkit"] == {"pytest", "hypothesis"}


def test_tests_never_edit_sys_path() -> None:
    """No test module calls sys.path.insert/append (the tools under tools/ may: they run as scripts)."""
    found = []
    for path in sorted([*(ROOT / "packages").glob("*/tests/**/*.py"), *(ROOT / "integration-tests").glob("**/*.py")]):
        text = path.read_text(encoding="utf-8")
        found += [
            f"{path.relative_to(ROOT)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if re.search(r"sys\.path\.(insert|append|extend)\(", line) and not line.lstrip().startswith("#")
        ]
    assert not found, found
