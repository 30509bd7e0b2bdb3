"""The base of the QNN-safety passes (:class:`QnnPass`) and their declaration (:func:`register`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult, PostconditionError, PreconditionError
from onnx_ir.passes.common import RemoveUnusedNodesPass

from qnnx_export._naming import UniqueNames
from qnnx_export._passes._graph import fresh_names, replace_value

__all__ = ["QnnPass", "Replacement", "declared", "register"]

#: What :meth:`QnnPass.replace_matched` calls per matched node: ``(names, node, match) -> (new nodes, new value)``.
Replacement = Callable[[UniqueNames, ir.Node, Any], tuple[Sequence[ir.Node], ir.Value]]


class QnnPass(InPlacePass):
    """Base of the QNN-safety passes: a named, documented in-place rewrite with checks.

    Attributes:
        name: Registry name used in :attr:`ExportOptions.passes`.
        defect: One sentence: the QNN defect avoided and where it was observed.
        order: Where the default pipeline runs the pass (ascending), set by :func:`register`.
    """

    name: ClassVar[str] = ""
    defect: ClassVar[str] = ""
    order: ClassVar[int] = -1

    def requires(self, model: ir.Model) -> None:
        if model.graph.opset_imports.get("", 0) < 20:
            raise PreconditionError(f"{self.name} expects opset >= 20, got {model.graph.opset_imports.get('')}")

    def call(self, model: ir.Model) -> PassResult:
        changed = self.rewrite(model.graph)
        if changed:
            RemoveUnusedNodesPass()(model)
            model.graph.sort()
        return PassResult(model, modified=changed)

    def rewrite(self, graph: ir.Graph) -> bool:  # pragma: no cover - abstract
        """Rewrite ``graph`` in place; return True when something changed."""
        raise NotImplementedError

    def match(self, node: ir.Node) -> Any:
        """For a pass that matches node by node: what :meth:`rewrite` needs for ``node``, or None."""
        return None

    def matched(self, graph: ir.Graph) -> list[tuple[ir.Node, Any]]:
        """Every node of ``graph`` with its :meth:`match`, taken before any rewrite."""
        return [(n, m) for n in list(graph) if (m := self.match(n)) is not None]

    def replace_matched(self, graph: ir.Graph, prefix: str, build: Replacement) -> bool:
        """Replace every matched node's first output: ``build(names, node, match)`` gives the nodes that compute
        the replacement (inserted after the node) and its value, which takes over the output's uses. ``names``
        makes fresh names ``<prefix>_...``. Returns whether anything matched."""
        names = fresh_names(graph, prefix)
        matched = self.matched(graph)
        for node, found in matched:
            nodes, new = build(names, node, found)
            graph.insert_after(node, nodes)
            replace_value(graph, node.outputs[0], new)
        return bool(matched)

    def find_defects(self, graph: ir.Graph) -> list[str]:
        """Return a description of every occurrence of the defect still in ``graph`` (by default: the nodes
        :meth:`match` still finds)."""
        return [n.name or n.op_type for n, _ in self.matched(graph)]

    def ensures(self, model: ir.Model) -> None:
        left = self.find_defects(model.graph)
        if left:
            raise PostconditionError(f"{self.name} left {len(left)} occurrence(s): {left[:3]}")


_P = TypeVar("_P", bound=type[QnnPass])
# name -> pass class, filled as the family modules are imported (under the import lock); _registry freezes it.
_DECLARED: dict[str, type[QnnPass]] = {}


def register(*, order: int) -> Callable[[_P], _P]:
    """Declare a pass: the one place it is listed. The registry (``PASS_REGISTRY``) and the default pipeline
    (``DEFAULT_PASSES``) hold every declared pass, run in ascending ``order`` (leave gaps: a new pass takes a free
    number between its neighbours). ``_pass_names`` reads the declaration from the source, so ``order`` must be an
    int literal and the class must set ``name`` to a string literal."""

    def declare(cls: _P) -> _P:
        clash = next((c for c in _DECLARED.values() if c.order == order), None)
        if not cls.name or cls.name in _DECLARED or clash is not None:
            what = f"order {order} is taken by {clash.name!r}" if clash else f"name {cls.name!r} is empty or taken"
            raise TypeError(f"cannot register pass {cls.__name__}: {what}")
        cls.order = order
        _DECLARED[cls.name] = cls
        return cls

    return declare


def declared() -> list[type[QnnPass]]:
    """Every pass declared so far with :func:`register`, in run order."""
    return sorted(_DECLARED.values(), key=lambda cls: cls.order)
