"""Check the layering rule of the qnnx monorepo by reading every source file's imports.

- clikit (the foundation: the CLI conventions and the chip table) imports the standard library only, so no qnnx
  package; every package may import it;
- detection, export, opcheck and ctxcache (the leaves) never import each other, nor the backend;
- only export and backend import torch;
- opcheck and export never import onnxruntime (so `pip install qnnx-opcheck` gives a small CLI);
- no package's src/ imports qnnx_testkit (a test-only distribution: tests may use it, shipped code may not).

Exit 0 when the rules hold, 1 with one line per violation otherwise. Run: `python tools/check_layers.py`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOUNDATIONS = ("clikit",)
LAYERS = (*FOUNDATIONS, "detection", "export", "opcheck", "ctxcache", "backend")
TORCH_ALLOWED = {"export", "backend"}
ORT_FORBIDDEN = {"export", "opcheck"}
TEST_ONLY = "qnnx_testkit"


def imported_roots(path: Path) -> set[str]:
    """Top-level module names imported anywhere in a file (module level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def violations(root: Path = ROOT) -> list[str]:
    """Every broken rule, as human lines."""
    found = []
    foundations = {f"qnnx_{name}" for name in FOUNDATIONS}
    for layer in LAYERS:
        own = f"qnnx_{layer}"
        for path in sorted((root / "packages" / layer / "src").rglob("*.py")):
            rel = path.relative_to(root)
            for name in sorted(imported_roots(path)):
                if name == own:
                    continue
                if layer in FOUNDATIONS:
                    if name not in sys.stdlib_module_names:
                        found.append(f"{rel}: foundation qnnx-{layer} imports {name} (the standard library only)")
                    continue
                if name.startswith("qnnx_") and name not in foundations | {TEST_ONLY} and layer != "backend":
                    found.append(f"{rel}: leaf qnnx-{layer} imports {name} (only qnnx-backend composes packages)")
                if name == "torch" and layer not in TORCH_ALLOWED:
                    found.append(f"{rel}: qnnx-{layer} imports torch (only export and backend may)")
                if name == "onnxruntime" and layer in ORT_FORBIDDEN:
                    found.append(f"{rel}: qnnx-{layer} imports onnxruntime (it must work without it)")
    for path in sorted((root / "packages").glob("*/src/**/*.py")):
        if path.relative_to(root / "packages").parts[2] != TEST_ONLY and TEST_ONLY in imported_roots(path):
            rel = path.relative_to(root)
            found.append(f"{rel}: imports {TEST_ONLY} (a test-only distribution: only tests may use it)")
    return found


def main() -> int:
    bad = violations()
    for line in bad:
        print(line)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
