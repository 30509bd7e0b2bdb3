"""Reductions into rows chosen at run time: ``index_reduce`` (mean, amax, amin).

Written densely, without ScatterElements (whose reductions qnnx-opcheck refuses on HTP): the runtime index becomes
the ``[N, K]`` match ``index[k] == n`` between the ``N`` rows of the input and the ``K`` rows of the source; a mean
sums the matched source rows with one MatMul and counts them, an extremum reduces the source masked by the match
over an ``[N, K, rest]`` view (bounded by ``MAX_REDUCE_INTO_ELEMENTS``). Rows no index names keep their values.
``prod`` stays with PyTorch: a product of float16 partial products can saturate on HTP where the result does not.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

MAX_REDUCE_INTO_ELEMENTS = 1 << 22
"""The largest ``N x K x rest`` view an extremum is reduced over."""

_LIMIT = 65504.0  # float16's largest finite value: the neutral element of a masked max or min on HTP


class _Rows:
    """A tensor (``x`` of the node, or its source) moved to ``[rows, rest]`` (the indexed axis first, the others
    flattened), and back."""

    def __init__(self, t: Translator, x: Node, axis: int, dtype: torch.dtype) -> None:
        shape = tuple(int(s) for s in fake(x).shape) or (1,)
        self.t, self.axis, self.shape, self.dtype = t, axis, shape, dtype
        self.perm = [axis, *(i for i in range(len(shape)) if i != axis)]
        self.moved = tuple(shape[i] for i in self.perm)
        self.rest = math.prod(self.moved[1:])
        value = t.operand(x, dtype)
        if self.perm != sorted(self.perm):
            value = t.emit1("Transpose", [value], {"perm": self.perm}, dtype=dtype, shape=self.moved)
        self.value = t.emit1(
            "Reshape", [value, t.ints([shape[axis], self.rest])], dtype=dtype, shape=(shape[axis], self.rest)
        )

    def back(self, value: ir.Value, out_shape: tuple[int, ...]) -> ir.Value:
        """``value`` (``[rows, rest]``) in the original layout, as ``out_shape``."""
        t = self.t
        moved = t.emit1("Reshape", [value, t.ints(self.moved)], dtype=self.dtype, shape=self.moved)
        if self.perm != sorted(self.perm):
            inverse = [self.perm.index(i) for i in range(len(self.perm))]
            moved = t.emit1("Transpose", [moved], {"perm": inverse}, dtype=self.dtype, shape=self.shape)
        return t.emit1("Reshape", [moved, t.ints(out_shape)], dtype=self.dtype, shape=out_shape)


@handles(aten.index_reduce.default)
def _index_reduce(
    t: Translator, node: Node, x: Node, dim: int, index: Node, source: Node, reduce: str, *, include_self: bool = True
) -> ir.Value:
    """``x.index_reduce(dim, index, source, reduce, include_self=...)`` for ``mean``, ``amax`` and ``amin``."""
    val = node.meta["val"]
    dtype = val.dtype
    if dtype not in (torch.float32, torch.float16) or fake(source).dtype != dtype:
        raise Declined(f"index_reduce of {dtype}")
    if reduce not in ("mean", "amax", "amin"):
        raise Declined(f"index_reduce with reduce={reduce!r} (a float16 product can saturate part-way on HTP)")
    rank = max(fake(x).dim(), 1)
    axis = onnx_axis(dim, rank)
    rows, src = _Rows(t, x, axis, dtype), _Rows(t, source, axis, dtype)
    n, k, rest = rows.moved[0], src.moved[0], rows.rest
    if n * k * rest > MAX_REDUCE_INTO_ELEMENTS:
        raise Declined(f"index_reduce over {n} x {k} x {rest} elements (up to {MAX_REDUCE_INTO_ELEMENTS})")
    positions = t.emit1("Reshape", [t.operand(index, torch.int64), t.ints([1, k])], dtype=torch.int64, shape=(1, k))
    numbers = t.initializer(torch.arange(n, dtype=torch.int64).reshape(n, 1), "rows")
    match = t.emit1("Equal", [numbers, positions], dtype=torch.bool, shape=(n, k))
    weights = t.emit1("Cast", [match], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=(n, k))
    hits = t.emit1("ReduceSum", [weights, t.ints([1], "axes")], {"keepdims": 1}, dtype=dtype, shape=(n, 1))
    hit = t.emit1("Greater", [hits, t.scalar(0.0, dtype)], dtype=torch.bool, shape=(n, 1))
    if reduce == "mean":
        total = t.emit1("MatMul", [weights, src.value], dtype=dtype, shape=(n, rest))
        count = hits
        if include_self:
            total = t.emit1("Add", [total, rows.value], dtype=dtype, shape=(n, rest))
            count = t.emit1("Add", [hits, t.scalar(1.0, dtype)], dtype=dtype, shape=(n, 1))
        safe = t.emit1("Max", [count, t.scalar(1.0, dtype)], dtype=dtype, shape=(n, 1))
        reduced = t.emit1("Div", [total, safe], dtype=dtype, shape=(n, rest))
    else:
        op, neutral = ("ReduceMax", -_LIMIT) if reduce == "amax" else ("ReduceMin", _LIMIT)
        wide = t.emit1("Reshape", [match, t.ints([n, k, 1])], dtype=torch.bool, shape=(n, k, 1))
        source3 = t.emit1("Reshape", [src.value, t.ints([1, k, rest])], dtype=dtype, shape=(1, k, rest))
        masked = t.emit1("Where", [wide, source3, t.scalar(neutral, dtype)], dtype=dtype, shape=(n, k, rest))
        reduced = t.emit1(op, [masked, t.ints([1], "axes")], {"keepdims": 0}, dtype=dtype, shape=(n, rest))
        if include_self:
            both = "Max" if reduce == "amax" else "Min"
            reduced = t.emit1(both, [reduced, rows.value], dtype=dtype, shape=(n, rest))
    result = t.emit1("Where", [hit, reduced, rows.value], dtype=dtype, shape=(n, rest))
    return rows.back(result, tuple(int(s) for s in val.shape))


_EXACT_ROWS = 2048

_SCATTER_REDUCE = {"sum": "sum", "add": "sum", "mean": "mean", "amax": "amax", "amin": "amin"}


@handles(aten.scatter_add.default, aten.scatter_reduce.two, aten.scatter.reduce)
def _scatter_reduce(
    t: Translator,
    node: Node,
    x: Node,
    dim: int,
    index: Node,
    source: Node,
    reduce: str = "sum",
    *,
    include_self: bool = True,
) -> ir.Value:
    """``scatter_add``, ``scatter_reduce`` (sum, mean, amax, amin) and ``scatter(..., reduce="add")``: each element
    of the input reduced with the source elements whose index names it along ``dim`` (``[N, K, rest]`` matches);
    positions no index names keep their values."""
    val = node.meta["val"]
    dtype = val.dtype
    if node.target is aten.scatter_add.default:
        reduce = "sum"
    if dtype not in (torch.float32, torch.float16) or fake(source).dtype != dtype:
        raise Declined(f"{node.target} of {dtype}")
    if reduce not in _SCATTER_REDUCE:
        raise Declined(f"{node.target} with reduce={reduce!r} (a float16 product can saturate part-way on HTP)")
    kind = _SCATTER_REDUCE[reduce]
    shape = tuple(int(s) for s in fake(x).shape)
    index_shape = tuple(int(s) for s in fake(index).shape)
    if not shape or len(index_shape) != len(shape) or fake(source).dim() != len(shape):
        raise Declined(f"{node.target} of a 0-d tensor or with an index of another rank")
    axis = onnx_axis(dim, len(shape))
    n, k = shape[axis], index_shape[axis]
    rest = math.prod(shape) // n
    if n * k * rest > MAX_REDUCE_INTO_ELEMENTS or k == 0:
        raise Declined(f"{node.target} over {n} x {k} x {rest} elements (up to {MAX_REDUCE_INTO_ELEMENTS})")
    # The source is read where the index reaches; the index is padded with -1 (no row) to the input's other sizes.
    src = t.value(source)
    if tuple(fake(source).shape) != index_shape:
        src = t.emit1(
            "Slice",
            [src, t.ints([0] * len(shape), "starts"), t.ints(index_shape, "ends")],
            dtype=dtype,
            shape=index_shape,
        )
    target = tuple(k if i == axis else s for i, s in enumerate(shape))
    # The index is compared as a float: HTP moves no int64 tensor (Pad, Transpose), and float16 holds every
    # integer up to 2048 exactly.
    if n > _EXACT_ROWS:
        raise Declined(f"{node.target} into {n} rows (up to {_EXACT_ROWS}, exact as float16)")
    idx = t.emit1("Cast", [t.value(index)], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=index_shape)
    if index_shape != target:
        pads = t.ints([0] * len(shape) + [a - b for a, b in zip(target, index_shape, strict=True)], "pads")
        idx = t.emit1("Pad", [idx, pads, t.scalar(-1.0, dtype)], dtype=dtype, shape=target)
        src = t.emit1("Pad", [src, pads, t.scalar(0.0, dtype)], dtype=dtype, shape=target)
    perm = [axis, *(i for i in range(len(shape)) if i != axis)]

    def rows(v: ir.Value, of: tuple[int, ...], dt: torch.dtype, first: int) -> ir.Value:
        moved = tuple(of[i] for i in perm)
        if perm != sorted(perm):
            v = t.emit1("Transpose", [v], {"perm": perm}, dtype=dt, shape=moved)
        return t.emit1("Reshape", [v, t.ints([first, rest])], dtype=dt, shape=(first, rest))

    own = rows(t.value(x), shape, dtype, n)
    positions = t.emit1("Reshape", [rows(idx, target, dtype, k), t.ints([1, k, rest])], dtype=dtype, shape=(1, k, rest))
    source3 = t.emit1("Reshape", [rows(src, target, dtype, k), t.ints([1, k, rest])], dtype=dtype, shape=(1, k, rest))
    numbers = t.initializer(torch.arange(n, dtype=dtype).reshape(n, 1, 1), "rows")
    match = t.emit1("Equal", [numbers, positions], dtype=torch.bool, shape=(n, k, rest))
    weights = t.emit1("Cast", [match], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=(n, k, rest))
    axes = t.ints([1], "axes")
    hits = t.emit1("ReduceSum", [weights, axes], {"keepdims": 0}, dtype=dtype, shape=(n, rest))
    hit = t.emit1("Greater", [hits, t.scalar(0.0, dtype)], dtype=torch.bool, shape=(n, rest))
    if kind in ("sum", "mean"):
        masked = t.emit1("Where", [match, source3, t.scalar(0.0, dtype)], dtype=dtype, shape=(n, k, rest))
        reduced = t.emit1("ReduceSum", [masked, axes], {"keepdims": 0}, dtype=dtype, shape=(n, rest))
        if include_self:
            reduced = t.emit1("Add", [reduced, own], dtype=dtype, shape=(n, rest))
        if kind == "mean":
            count = hits
            if include_self:
                count = t.emit1("Add", [hits, t.scalar(1.0, dtype)], dtype=dtype, shape=(n, rest))
            safe = t.emit1("Max", [count, t.scalar(1.0, dtype)], dtype=dtype, shape=(n, rest))
            reduced = t.emit1("Div", [reduced, safe], dtype=dtype, shape=(n, rest))
    else:
        op, neutral, both = ("ReduceMax", -_LIMIT, "Max") if kind == "amax" else ("ReduceMin", _LIMIT, "Min")
        masked = t.emit1("Where", [match, source3, t.scalar(neutral, dtype)], dtype=dtype, shape=(n, k, rest))
        reduced = t.emit1(op, [masked, axes], {"keepdims": 0}, dtype=dtype, shape=(n, rest))
        if include_self:
            reduced = t.emit1(both, [reduced, own], dtype=dtype, shape=(n, rest))
    result = t.emit1("Where", [hit, reduced, own], dtype=dtype, shape=(n, rest))
    moved = tuple(shape[i] for i in perm)
    result = t.emit1("Reshape", [result, t.ints(moved)], dtype=dtype, shape=moved)
    if perm == sorted(perm):
        return result
    return t.out("Transpose", [result], {"perm": [perm.index(i) for i in range(len(perm))]})
