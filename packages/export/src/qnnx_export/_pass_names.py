"""The names of the QNN-safety passes in run order, read from the passes' own declarations without importing them.

A pass is declared once, in the module of its family under ``_passes/``: a class with ``name = "..."`` under
``@register(order=N)`` (see :func:`qnnx_export._passes._base.register`). The registry imports those classes, which
costs onnx_ir and numpy; the options only need the names, so this module reads the same declarations with
:mod:`ast` (standard library only), on first use. ``_passes._registry`` refuses to import when the two readings
differ, and a test compares them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["DEFAULT_PASSES", "declared_passes"]

#: The default pipeline, in run order: every declared pass by ascending ``order`` (computed on first access).
DEFAULT_PASSES: tuple[str, ...]

_PASSES_DIR = Path(__file__).with_name("_passes")


@functools.cache
def declared_passes(folder: Path = _PASSES_DIR) -> tuple[str, ...]:
    """The ``name`` of every class declared with ``@register(order=N)`` in the modules of ``folder``, by ``order``."""
    declared: list[tuple[int, str]] = []
    for path in sorted(folder.glob("*.py")):
        for snippet in _declarations(path.read_text(encoding="utf-8")):
            tree = ast.parse(snippet, filename=str(path))
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and (order := _declared_order(node)) is not None:
                    declared.append((order, _declared_name(node, path)))
    return tuple(name for _, name in sorted(declared))


def _declarations(source: str) -> list[str]:
    """Each ``@register`` declaration of a module's source, from its decorator to the class's ``name = ...`` line
    (or to the class's end when it has none), as text that parses on its own.

    Parsing only these heads, not the passes' whole modules, is what keeps the first use cheap: the full parse of
    the pass modules took about 20 ms, once per process, inside every cold compile (the cache key names the
    passes). The class heads are what the declaration is; a misreading cannot go unseen, since the registry
    refuses to import when this reading and the registered classes differ.
    """
    lines = source.splitlines()
    found: list[str] = []
    for start, line in enumerate(lines):
        if not (line.startswith("@") and "register(" in line):
            continue
        end, in_class = len(lines), False
        for k in range(start + 1, len(lines)):
            text = lines[k]
            if not in_class:  # the decorator's own lines, then the class statement
                in_class = text.startswith("class ")
            elif text.startswith("    name") and text[8:].lstrip()[:1] in (":", "="):
                end = k + 1  # the name: the rest of the class is not needed
                break
            elif text[:1] not in ("", " ", "\t", "#", ")"):
                end = k  # the next top-level statement: the class ended
                break
        found.append("\n".join(lines[start:end]) + "\n")
    return found


def _declared_order(cls: ast.ClassDef) -> int | None:
    """The ``order`` of a class's ``@register(order=N)`` decorator, or None for a class without one."""
    for deco in cls.decorator_list:
        if not isinstance(deco, ast.Call):
            continue
        func = deco.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if called != "register":
            continue
        for kw in deco.keywords:
            if kw.arg == "order" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, int):
                return kw.value.value
        raise ImportError(f"{cls.name}: @register needs order=<an int literal>")
    return None


def _declared_name(cls: ast.ClassDef, path: Path) -> str:
    for stmt in cls.body:
        targets: list[ast.expr] = (
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else stmt.targets if isinstance(stmt, ast.Assign) else []
        )
        value = getattr(stmt, "value", None)
        named = any(isinstance(t, ast.Name) and t.id == "name" for t in targets)
        if named and isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    raise ImportError(f"{path.name}: the registered pass {cls.name} declares no name = '<a string literal>'")


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "DEFAULT_PASSES":
        return declared_passes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
