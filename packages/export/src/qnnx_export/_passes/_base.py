"""The base of the QNN-safety passes (:class:`QnnPass`) and the graph helpers they share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult, PostconditionError, PreconditionError
from onnx_ir.passes.common import RemoveUnusedNodesPass

from qnnx_export._naming import UniqueNames

__all__ = ["QnnPass"]


# --------------------------------------------------------------------------------------------- helpers


def _const(value: ir.Value | None) -> np.ndarray | None:
    """Return the constant array behind ``value`` (initializer or Constant node), else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:
        return None


def _shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """Return the static shape of ``value`` or None when unknown or symbolic."""
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


def _names(graph: ir.Graph, prefix: str) -> UniqueNames:
    """Fresh value/node names ``<prefix>_<hint>...`` that collide with nothing in the graph."""
    taken = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    for node in graph:
        taken.update(o.name for o in node.outputs if o.name)
        if node.name:
            taken.add(node.name)
    return UniqueNames(taken, prefix=f"{prefix}_")


def _add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def _new_value(name: str, dtype: ir.DataType | None, shape: Iterable[int] | None) -> ir.Value:
    return ir.Value(
        name=name,
        type=ir.TensorType(dtype) if dtype is not None else None,
        shape=ir.Shape(list(shape)) if shape is not None else None,
    )


class QnnPass(InPlacePass):
    """Base of the QNN-safety passes: a named, documented in-place rewrite with checks.

    Attributes:
        name: Registry name used in :attr:`ExportOptions.passes`.
        defect: One sentence: the QNN defect avoided and where it was observed.
    """

    name: ClassVar[str] = ""
    defect: ClassVar[str] = ""

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

    def find_defects(self, graph: ir.Graph) -> list[str]:
        """Return a description of every occurrence of the defect still in ``graph`` (by default: the nodes
        :meth:`match` still finds)."""
        return [n.name or n.op_type for n, _ in self.matched(graph)]

    def ensures(self, model: ir.Model) -> None:
        left = self.find_defects(model.graph)
        if left:
            raise PostconditionError(f"{self.name} left {len(left)} occurrence(s): {left[:3]}")


def _replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Redirect every use of ``old`` (graph outputs too, keeping the output's name) to ``new``."""
    was_output = old.is_graph_output()
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    if was_output:
        name = old.name
        old.name = f"{name}__qnnx_replaced"
        new.name = name
