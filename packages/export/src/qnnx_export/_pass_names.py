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
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and (order := _declared_order(node)) is not None:
                declared.append((order, _declared_name(node, path)))
    return tuple(name for _, name in sorted(declared))


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
