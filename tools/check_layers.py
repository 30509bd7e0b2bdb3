"""Check the layering rule of the qnnx monorepo by reading every source file's imports.

- clikit (the foundation: the CLI conventions, the chip table and the HTP facts two leaves read) imports the standard
  library only, so no qnnx package; every package may import it;
- detection, export, opcheck and ctxcache (the leaves) never import each other, nor the backend;
- only export and backend import torch;
- opcheck and export never import onnxruntime (so `pip install qnnx-opcheck` gives a small CLI), except opcheck's
  opt-in live check (``qnnx_opcheck/_live.py``, run in a child process);
- no package's src/ imports qnnx_testkit (a test-only distribution: tests may use it, shipped code may not);
- inside qnnx-backend, modules follow the compile's pipeline in the order of ``BACKEND_LAYERS``: a module imports
  only modules of earlier layers (function-level and ``TYPE_CHECKING`` imports included), and every module of the
  package is declared there;
- in every package, no module imports or reads another module's private name (``from m import _x`` or ``m._x``,
  other than a submodule): what another module needs is a public internal name (no underscore) in a private
  module. ``KNOWN_PRIVATE_USES`` lists the uses in packages whose owners are still reworking them; it only shrinks.

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
# The one module of a package that ORT_FORBIDDEN still lets use onnxruntime: the opt-in live check, which runs the
# installed EP in a child process (the static check needs no onnxruntime).
ORT_ALLOWED_FILES = {"packages/opcheck/src/qnnx_opcheck/_live.py"}
TEST_ONLY = "qnnx_testkit"

# qnnx-backend's modules, earliest first: trace -> plan -> export -> check -> build -> run, save/load beside it. A
# module may import only modules of earlier layers; modules of one layer do not import each other.
BACKEND_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("errors", "_version", "_scratch")),
    ("records; the checks of an untrusted QNN call", ("_report", "_progress", "_quantspec", "_payload", "_untrusted")),
    (
        "options, calibration records, the parts of a graph too large for one context",
        ("_options", "_calibrate", "_parts"),
    ),
    (
        "trace; comparing with eager; the CPU-EP split; the torch-free loader",
        ("_trace", "_compare", "_split", "_arrays"),
    ),
    ("plan: buckets; sessions", ("_buckets", "_session")),
    ("programs; the exporters' checks and the QDQ model", ("_program", "_faithful", "_quantize")),
    ("export", ("_export",)),
    ("check", ("_check",)),
    ("build; the outputs PyTorch computes beside a QNN graph", ("_build", "_host_outputs")),
    ("the device chain; run one static graph", ("_chain", "_variant")),
    ("save and load", ("_aot", "_aot_load")),
    ("run: the callable Dynamo gets", ("_compiled",)),
    ("entry points", ("_backend",)),
    ("faces", ("_explain", "_saved", "_registry")),
    (
        "Hugging Face generation: the memory view; prompts padded to buckets; rotary tables",
        ("_hf_memory", "_hf_prompts", "_hf_rope"),
    ),
    ("Hugging Face generation: saved and loaded", ("_hf_saved",)),
    ("Hugging Face generation: compile, and the public module", ("hf",)),
    ("the package", ("__init__",)),
)

# Private names used across modules of packages whose owners are reworking them (one entry per file and name). The
# list only shrinks: a new use fails the check; an entry whose use is gone is reported, to be deleted.
KNOWN_PRIVATE_USES: frozenset[str] = frozenset()


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


class _Modules:
    """The modules of every package's src/ under ``root``, by dotted name."""

    def __init__(self, root: Path) -> None:
        self.paths: dict[str, Path] = {}
        for path in sorted((root / "packages").glob("*/src/**/*.py")):
            src = path.relative_to(root / "packages").parts[:2]
            parts = list(path.relative_to(root / "packages" / src[0] / src[1]).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts:
                self.paths[".".join(parts)] = path

    def is_module(self, name: str) -> bool:
        return name in self.paths

    def name_of(self, path: Path) -> str:
        return next(name for name, p in self.paths.items() if p == path)


def _imports(tree: ast.AST, own: str, is_package: bool) -> list[tuple[str, str | None, str | None]]:
    """(module, name taken from it or None, the local name bound) for every import in a file, at any depth; relative
    imports resolved against ``own``."""
    found: list[tuple[str, str | None, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, None, alias.asname or alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = own.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                found.append((base, alias.name, alias.asname or alias.name))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(root: Path = ROOT) -> list[str]:
    """``path: module._name`` for every private name a module imports from, or reads on, another project module
    (a submodule is not a private name)."""
    modules = _Modules(root)
    found: set[str] = set()
    for own, path in modules.paths.items():
        rel = path.relative_to(root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound: dict[str, str] = {}  # local name -> the project module it is
        for module, name, local in _imports(tree, own, path.name == "__init__.py"):
            if not module.startswith("qnnx_"):
                continue
            target = module if name is None else f"{module}.{name}"
            if name is None:
                if local is not None:
                    bound[local] = module.split(".")[0] if local == module.split(".")[0] else module
            elif modules.is_module(target):
                bound[local or name] = target
            elif _private(name) and module != own:
                found.add(f"{rel}: {target}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            chain: list[str] = []
            base: ast.expr = node
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in bound:
                continue
            module = bound[base.id]
            for attr in chain:
                if modules.is_module(f"{module}.{attr}"):
                    module = f"{module}.{attr}"
                    continue
                if _private(attr) and module != own:
                    found.add(f"{rel}: {module}.{attr}")
                break
    return sorted(found)


def backend_order(root: Path = ROOT) -> list[str]:
    """Every import inside qnnx-backend that reaches a module of the same or a later layer of ``BACKEND_LAYERS``,
    and every module missing from it."""
    rank = {module: k for k, (_, names) in enumerate(BACKEND_LAYERS) for module in names}
    layer = {module: title for title, names in BACKEND_LAYERS for module in names}
    src = root / "packages" / "backend" / "src" / "qnnx_backend"
    found = []
    for path in sorted(src.glob("*.py")):
        rel = path.relative_to(root)
        own = path.stem
        if own not in rank:
            found.append(f"{rel}: {own} is not in tools/check_layers.py's BACKEND_LAYERS (declare its layer)")
            continue
        own_name = "qnnx_backend" if own == "__init__" else f"qnnx_backend.{own}"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for module, name, _ in _imports(tree, own_name, own == "__init__"):
            if module != "qnnx_backend" and not module.startswith("qnnx_backend."):
                continue
            parts = module.split(".")[1:]
            if not parts and name is not None and (src / f"{name}.py").exists():
                parts = [name]
            target = parts[0] if parts else "__init__"
            if target == own or target not in rank:
                continue
            if rank[target] >= rank[own]:
                found.append(
                    f"{rel}: {own} ({layer[own]}) imports {target} ({layer[target]}): a module imports only modules "
                    "of earlier layers of BACKEND_LAYERS"
                )
    return sorted(set(found))


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
                if name == "onnxruntime" and layer in ORT_FORBIDDEN and rel.as_posix() not in ORT_ALLOWED_FILES:
                    found.append(f"{rel}: qnnx-{layer} imports onnxruntime (it must work without it)")
    for path in sorted((root / "packages").glob("*/src/**/*.py")):
        if path.relative_to(root / "packages").parts[2] != TEST_ONLY and TEST_ONLY in imported_roots(path):
            rel = path.relative_to(root)
            found.append(f"{rel}: imports {TEST_ONLY} (a test-only distribution: only tests may use it)")
    found.extend(backend_order(root))
    for use in private_uses(root):
        if use not in KNOWN_PRIVATE_USES:
            path, name = use.split(": ")
            found.append(f"{path}: uses the private name {name} of another module (make it a public internal name)")
    return found


def stale_allowances(root: Path = ROOT) -> list[str]:
    """Entries of ``KNOWN_PRIVATE_USES`` whose file is there and no longer has the use (delete them)."""
    uses = set(private_uses(root))
    return sorted(u for u in KNOWN_PRIVATE_USES if (root / u.split(": ")[0]).exists() and u not in uses)


def main() -> int:
    bad = violations()
    for line in bad:
        print(line)
    for entry in stale_allowances():
        print(f"note: KNOWN_PRIVATE_USES lists {entry!r}, which is gone: delete the entry")
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
