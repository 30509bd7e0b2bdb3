"""Extrema with their positions: ``max``/``min`` over one axis (values and int64 indices), over every element, and
``argmax``/``argmin``.

The values are a ReduceMax/ReduceMin, the indices an ArgMax/ArgMin with ``select_last_index=0``: the first
position of the extremum on ties, as PyTorch returns it. On HTP the values are compared at float16 precision, so
two values within float16 noise of each other can swap places (the same holds for TopK, which every router's
``topk`` already runs as); equal values keep PyTorch's order.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

_IS_MAX = {
    aten.max.dim: True,
    aten.min.dim: False,
    aten.max.default: True,
    aten.min.default: False,
    aten.argmax.default: True,
    aten.argmin.default: False,
}


def _ordered(node: Node, x: Node) -> torch.dtype:
    """The input's dtype; declines bool (an extremum of truth values is ``any``/``all``, not an order)."""
    dtype: torch.dtype = fake(x).dtype
    if dtype == torch.bool:
        raise Declined(f"{node.target} of a bool tensor")
    return dtype


def _position(t: Translator, node: Node, xv: ir.Value, axis: int, keepdim: bool, shape: tuple[int, ...]) -> ir.Value:
    """The int64 index of the first extremum along ``axis``."""
    op = "ArgMax" if _IS_MAX[node.target] else "ArgMin"  # type: ignore[index]  # fx types Node.target loosely
    attrs = {"axis": axis, "keepdims": int(bool(keepdim)), "select_last_index": 0}
    return t.emit1(op, [xv], attrs, dtype=torch.int64, shape=shape)


@handles(aten.max.dim, aten.min.dim)
def _extremum_dim(t: Translator, node: Node, x: Node, dim: int, keepdim: bool = False) -> tuple[ir.Value, ir.Value]:
    """``torch.max(x, dim)`` / ``torch.min(x, dim)``: the values and the int64 index of the first extremum."""
    dtype = _ordered(node, x)
    values = node.meta["val"][0]
    out = tuple(int(s) for s in values.shape)
    rank = fake(x).dim()
    if rank == 0:  # the value itself, at position 0
        zeros = t.initializer(torch.zeros(out, dtype=torch.int64), "extremum_index")
        return t.value(x), t.emit1("Identity", [zeros], dtype=torch.int64, shape=out)
    axis = onnx_axis(dim, rank)
    xv = t.value(x)
    reduce = "ReduceMax" if _IS_MAX[node.target] else "ReduceMin"  # type: ignore[index]  # fx types Node.target loosely
    reduced = t.emit1(reduce, [xv, t.ints([axis], "axes")], {"keepdims": int(bool(keepdim))}, dtype=dtype, shape=out)
    return reduced, _position(t, node, xv, axis, keepdim, out)


@handles(aten.max.default, aten.min.default)
def _extremum_all(t: Translator, node: Node, x: Node) -> ir.Value:
    """``torch.max(x)`` / ``torch.min(x)`` over every element (a 0-d result)."""
    _ordered(node, x)
    rank = fake(x).dim()
    if rank == 0:
        return t.value(x)
    reduce = "ReduceMax" if _IS_MAX[node.target] else "ReduceMin"  # type: ignore[index]  # fx types Node.target loosely
    return t.out(reduce, [t.value(x), t.ints(list(range(rank)), "axes")], {"keepdims": 0})


@handles(aten.argmax.default, aten.argmin.default)
def _arg_extremum(t: Translator, node: Node, x: Node, dim: int | None = None, keepdim: bool = False) -> ir.Value:
    """``argmax``/``argmin`` along ``dim``, or of the flattened tensor when ``dim`` is None."""
    _ordered(node, x)
    shape = tuple(int(s) for s in fake(x).shape)
    out = tuple(int(s) for s in node.meta["val"].shape)
    if not shape:
        return t.initializer(torch.zeros((), dtype=torch.int64), "extremum_index")
    xv = t.value(x)
    if dim is None:
        count = math.prod(shape)
        xv = t.emit1("Reshape", [xv, t.ints([count])], dtype=fake(x).dtype, shape=(count,))
        found = _position(t, node, xv, 0, False, ())
        return t.out("Reshape", [found, t.ints(out)]) if out != () else found
    axis = onnx_axis(dim, len(shape))
    return _position(t, node, xv, axis, keepdim, out)
