"""The pass registry (name -> pass class, in the default run order) and the runner."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import onnx_ir as ir

from qnnx_export import _passes
from qnnx_export._pass_names import DEFAULT_PASSES
from qnnx_export._passes._base import QnnPass, declared

__all__ = ["PASS_REGISTRY", "pass_table", "run_passes"]

log = logging.getLogger(__name__)

# Importing a family module declares its passes (@register). Every module of the package is read as a family, as
# _pass_names reads them (_base, _graph and this one declare none), so a new family module needs no entry here.
for _family in pkgutil.iter_modules(_passes.__path__):
    if _family.name != __name__.rpartition(".")[2]:
        importlib.import_module(f"{_passes.__name__}.{_family.name}")

# Read-only, built once the families are imported: nothing registers passes later, so there is no state to race on.
PASS_REGISTRY: Mapping[str, type[QnnPass]] = MappingProxyType({cls.name: cls for cls in declared()})
if tuple(PASS_REGISTRY) != DEFAULT_PASSES:  # pragma: no cover - a declaration _pass_names cannot read
    raise ImportError(
        f"_pass_names.DEFAULT_PASSES {DEFAULT_PASSES} != registered passes {tuple(PASS_REGISTRY)}: declare each pass "
        "as @register(order=<int literal>) on a class with name = '<string literal>'"
    )


def run_passes(model: ir.Model, names: Iterable[str]) -> list[tuple[str, bool]]:
    """Run the named passes in order on ``model`` (in place); return ``(name, changed)`` per pass."""
    # A hand-written loop rather than onnx_ir.passes.Sequential/PassManager: those return one PassResult for the
    # whole sequence (no per-pass `modified` for the report) and wrap a failing pass's error in PassError, while
    # callers here get the pass's own PreconditionError/PostconditionError, and a KeyError for an unknown name
    # only when the run reaches it.
    report: list[tuple[str, bool]] = []
    for name in names:
        cls = PASS_REGISTRY[name]
        result = cls()(model)
        report.append((name, bool(result.modified)))
        if result.modified:
            log.debug("pass %s changed the graph", name)
    return report


def pass_table() -> list[dict[str, Any]]:
    """Return ``[{name, defect, doc}]`` for every registered pass, in run order (``doc``: the docstring's first
    paragraph, used by the docs)."""
    return [{"name": n, "defect": c.defect, "doc": _summary(c)} for n, c in PASS_REGISTRY.items()]


def _summary(cls: type[QnnPass]) -> str:
    """The first paragraph of a pass's docstring, on one line."""
    paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())
