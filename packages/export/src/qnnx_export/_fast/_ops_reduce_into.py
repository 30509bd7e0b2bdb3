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

__all__ = ["EXACT_ROWS", "MAX_REDUCE_INTO_ELEMENTS", "ScatterMatch"]

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


EXACT_ROWS = 2048
"""The most rows a scattered index is matched against: it is compared as a float16, exact up to 2048."""

_SCATTER_REDUCE = {"sum": "sum", "add": "sum", "mean": "mean", "amax": "amax", "amin": "amin"}


class ScatterMatch:
    """Which elements of ``x`` an index names along ``dim`` (the dense form of a scatter), over ``[N, K, rest]``.

    The axis moves first and the others are flattened (``rest``); the index, padded with -1 (no row) to the input's
    other sizes, becomes ``match[n, k, r]``: position ``k`` of the index names row ``n``. It is compared as a float
    (``compare``): HTP moves no int64 tensor (Pad, Transpose), and float16 holds every integer up to 2048 exactly.

    Attributes:
        axis, perm, n, k, rest: The scattered axis, the permutation that moves it first, the input's rows along
            it, the index's, and the product of the other sizes.
        target: The index's shape padded to the input's sizes off the axis.
        match: The ``[N, K, rest]`` bool match.
    """

    def __init__(
        self, t: Translator, node: Node, x: Node, dim: int, index: Node, compare: torch.dtype = torch.float32
    ) -> None:
        shape = tuple(int(s) for s in fake(x).shape)
        index_shape = tuple(int(s) for s in fake(index).shape)
        if not shape or len(index_shape) != len(shape):
            raise Declined(f"{node.target} of a 0-d tensor or with an index of another rank")
        self.t, self.shape, self.index_shape = t, shape, index_shape
        self.axis = axis = onnx_axis(dim, len(shape))
        self.n, self.k = shape[axis], index_shape[axis]
        self.rest = math.prod(shape) // self.n
        if self.n * self.k * self.rest > MAX_REDUCE_INTO_ELEMENTS or self.k == 0:
            raise Declined(
                f"{node.target} over {self.n} x {self.k} x {self.rest} elements (up to {MAX_REDUCE_INTO_ELEMENTS})"
            )
        if self.n > EXACT_ROWS:
            raise Declined(f"{node.target} into {self.n} rows (up to {EXACT_ROWS}, exact as float16)")
        self.target = tuple(self.k if i == axis else s for i, s in enumerate(shape))
        self.perm = [axis, *(i for i in range(len(shape)) if i != axis)]
        idx = t.emit1("Cast", [t.value(index)], {"to": int(ir_dtype(compare))}, dtype=compare, shape=index_shape)
        idx = self.padded(idx, compare, -1.0)
        positions = self.rows3(idx, self.target, compare)
        numbers = t.initializer(torch.arange(self.n, dtype=compare).reshape(self.n, 1, 1), "rows")
        self.match = t.emit1("Equal", [numbers, positions], dtype=torch.bool, shape=(self.n, self.k, self.rest))

    def padded(self, v: ir.Value, dtype: torch.dtype, fill: float) -> ir.Value:
        """``v`` (of the index's shape) padded with ``fill`` to ``target``."""
        if self.index_shape == self.target:
            return v
        t = self.t
        pads = t.ints([0] * len(self.shape) + [a - b for a, b in zip(self.target, self.index_shape, strict=True)])
        return t.emit1("Pad", [v, pads, t.scalar(fill, dtype)], dtype=dtype, shape=self.target)

    def rows(self, v: ir.Value, of: tuple[int, ...], dtype: torch.dtype) -> ir.Value:
        """``v`` (of shape ``of``) as ``[of[axis], rest]``."""
        t, perm = self.t, self.perm
        moved = tuple(of[i] for i in perm)
        if perm != sorted(perm):
            v = t.emit1("Transpose", [v], {"perm": perm}, dtype=dtype, shape=moved)
        return t.emit1(
            "Reshape", [v, t.ints([of[self.axis], self.rest])], dtype=dtype, shape=(of[self.axis], self.rest)
        )

    def rows3(self, v: ir.Value, of: tuple[int, ...], dtype: torch.dtype) -> ir.Value:
        """``v`` (of the padded index's shape) as ``[1, K, rest]``, to broadcast against the ``N`` rows."""
        shape = (1, self.k, self.rest)
        return self.t.emit1("Reshape", [self.rows(v, of, dtype), self.t.ints(shape)], dtype=dtype, shape=shape)

    def source3(self, source: Node, dtype: torch.dtype) -> ir.Value:
        """A scatter's source as ``[1, K, rest]``: read where the index reaches (a wider source is sliced to the
        index's shape), zero where the index is padded, in ``dtype``."""
        t = self.t
        src = t.operand(source, dtype)
        if tuple(fake(source).shape) != self.index_shape:
            starts, ends = t.ints([0] * len(self.shape), "starts"), t.ints(self.index_shape, "ends")
            src = t.emit1("Slice", [src, starts, ends], dtype=dtype, shape=self.index_shape)
        return self.rows3(self.padded(src, dtype, 0.0), self.target, dtype)

    def back(self, result: ir.Value, dtype: torch.dtype) -> ir.Value:
        """``result`` (``[N, rest]``) in the input's layout: the node's output."""
        t, perm = self.t, self.perm
        moved = tuple(self.shape[i] for i in perm)
        result = t.emit1("Reshape", [result, t.ints(moved)], dtype=dtype, shape=moved)
        if perm == sorted(perm):
            return result
        return t.out("Transpose", [result], {"perm": [perm.index(i) for i in range(len(perm))]})


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
    if fake(source).dim() != fake(x).dim():
        raise Declined(f"{node.target} with a source of another rank")
    sm = ScatterMatch(t, node, x, dim, index, dtype)
    n, rest = sm.n, sm.rest
    own = sm.rows(t.value(x), sm.shape, dtype)
    source3 = sm.source3(source, dtype)
    match = sm.match
    weights = t.emit1("Cast", [match], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=(n, sm.k, rest))
    axes = t.ints([1], "axes")
    hits = t.emit1("ReduceSum", [weights, axes], {"keepdims": 0}, dtype=dtype, shape=(n, rest))
    hit = t.emit1("Greater", [hits, t.scalar(0.0, dtype)], dtype=torch.bool, shape=(n, rest))
    if kind in ("sum", "mean"):
        masked = t.emit1("Where", [match, source3, t.scalar(0.0, dtype)], dtype=dtype, shape=(n, sm.k, rest))
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
        masked = t.emit1("Where", [match, source3, t.scalar(neutral, dtype)], dtype=dtype, shape=(n, sm.k, rest))
        reduced = t.emit1(op, [masked, axes], {"keepdims": 0}, dtype=dtype, shape=(n, rest))
        if include_self:
            reduced = t.emit1(both, [reduced, own], dtype=dtype, shape=(n, rest))
    result = t.emit1("Where", [hit, reduced, own], dtype=dtype, shape=(n, rest))
    return sm.back(result, dtype)
