"""Reductions and scans over axes: mean, sum, max, min, the softmax family, cumsum, and the orderings (topk, sort)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


_REDUCTIONS = {
    aten.mean.dim: "ReduceMean",
    aten.sum.dim_IntList: "ReduceSum",
    aten.amax.default: "ReduceMax",
    aten.amin.default: "ReduceMin",
}
_REDUCTIONS_OF_ALL = {aten.mean.default: "ReduceMean", aten.sum.default: "ReduceSum"}
_SOFTMAX = {aten._softmax.default: "Softmax", aten._log_softmax.default: "LogSoftmax"}


def _reduce_as(
    op: str, t: Translator, node: Node, x: Node, dim: int | Sequence[int] | None, keepdim: bool, **kwargs: object
) -> ir.Value:
    if kwargs.get("dtype") not in (None, fake(x).dtype):
        raise Declined(f"{node.target} with dtype=")
    rank = fake(x).dim()
    dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
    axes = sorted(onnx_axis(d, rank) for d in dims) or list(range(rank))
    if rank == 0:
        return t.operand(x, node.meta["val"].dtype)
    # sum of bool/int8 gives int64 in PyTorch: reduce in the output dtype.
    xv = t.operand(x, node.meta["val"].dtype)
    return t.out(op, [xv, t.ints(axes, "axes")], {"keepdims": int(bool(keepdim))})


@handles(*_REDUCTIONS)
def _reduce(
    t: Translator, node: Node, x: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False, **kwargs: object
) -> ir.Value:
    return _reduce_as(_REDUCTIONS[node.target], t, node, x, dim, keepdim, **kwargs)  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload


@handles(*_REDUCTIONS_OF_ALL)
def _reduce_all(t: Translator, node: Node, x: Node, **kwargs: object) -> ir.Value:
    return _reduce_as(_REDUCTIONS_OF_ALL[node.target], t, node, x, None, False, **kwargs)  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload


@handles(*_SOFTMAX)
def _softmax(t: Translator, node: Node, x: Node, dim: int, half_to_float: bool = False) -> ir.Value:
    if half_to_float:
        raise Declined("softmax with half_to_float")
    return t.out(_SOFTMAX[node.target], [t.value(x)], {"axis": onnx_axis(dim, fake(x).dim())})  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload


@handles(aten._safe_softmax.default)
def _safe_softmax(t: Translator, node: Node, x: Node, dim: int, dtype: torch.dtype | None = None) -> ir.Value:
    """softmax, but rows whose inputs are all -inf give 0 (not NaN), as PyTorch's attention does."""
    val = node.meta["val"]
    if dtype not in (None, fake(x).dtype):
        raise Declined("_safe_softmax with dtype=")
    axis = onnx_axis(dim, val.dim())
    xv = t.value(x)
    shape = tuple(val.shape)
    soft = t.emit1("Softmax", [xv], {"axis": axis}, dtype=val.dtype, shape=shape)
    row_shape = tuple(1 if i == axis else s for i, s in enumerate(shape))
    row_max = t.emit1("ReduceMax", [xv, t.ints([axis], "axes")], {"keepdims": 1}, dtype=val.dtype, shape=row_shape)
    masked = t.emit1("Equal", [row_max, t.scalar(float("-inf"), val.dtype)], dtype=torch.bool, shape=row_shape)
    return t.out("Where", [masked, t.scalar(0.0, val.dtype), soft])


@handles(aten.cumsum.default)
def _cumsum(t: Translator, node: Node, x: Node, dim: int, *, dtype: torch.dtype | None = None) -> ir.Value:
    """``cumsum`` in the output's dtype (PyTorch's: ``dtype``, or int64 for integer and bool inputs)."""
    val = node.meta["val"]
    if fake(x).dim() == 0:
        return t.operand(x, val.dtype)
    axis = onnx_axis(dim, fake(x).dim())
    return t.out("CumSum", [t.operand(x, val.dtype), t.initializer(torch.tensor(axis, dtype=torch.int64), "axis")])


def _top_k(t: Translator, node: Node, x: Node, k: int, dim: int, largest: bool) -> tuple[ir.Value, ir.Value]:
    rank = fake(x).dim()
    if rank == 0:
        raise Declined(f"{node.target} of a 0-d tensor")
    if fake(x).dtype == torch.bool:
        raise Declined(f"{node.target} of a bool tensor")
    values, indices = node.meta["val"]
    shape = tuple(values.shape)
    got = t.emit(
        "TopK",
        [t.value(x), t.ints([k], "k")],
        {"axis": onnx_axis(dim, rank), "largest": int(bool(largest)), "sorted": 1},
        outputs=[(values.dtype, shape), (indices.dtype, shape)],
    )
    return got[0], got[1]


@handles(aten.topk.default)
def _topk(
    t: Translator, node: Node, x: Node, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[ir.Value, ir.Value]:
    """``topk`` as TopK (always sorted, which ``sorted=False`` allows)."""
    return _top_k(t, node, x, k, dim, largest)


@handles(aten.sort.default)
def _sort(t: Translator, node: Node, x: Node, dim: int = -1, descending: bool = False) -> tuple[ir.Value, ir.Value]:
    """``sort`` as a TopK of the whole axis. Only the overload without ``stable=True``: PyTorch promises no order
    among equal values there, and HTP's TopK may return equal values in another order than the CPU's."""
    size = fake(x).shape[onnx_axis(dim, fake(x).dim())] if fake(x).dim() else 1
    return _top_k(t, node, x, int(size), dim, descending)
