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
