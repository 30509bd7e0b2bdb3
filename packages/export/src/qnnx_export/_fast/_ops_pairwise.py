"""Binary float ops with rules of their own for special values or range (``fmax``, ``fmin``, ``hypot``), and the
pairwise distances (``cdist``, ``pdist``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, out_shape
from qnnx_export._fast._ops_reduction import p_norm
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Operand, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

_NAN_IGNORING = {aten.fmax.default: "Max", aten.fmin.default: "Min"}


def _float_operands(t: Translator, node: Node, a: Operand, b: Operand) -> tuple[torch.dtype, ir.Value, ir.Value]:
    dtype = node.meta["val"].dtype
    if dtype not in (torch.float32, torch.float16):
        raise Declined(f"{node.target} to {dtype}")
    return dtype, t.operand(a, dtype), t.operand(b, dtype)


@handles(*_NAN_IGNORING)
def _fmax_fmin(t: Translator, node: Node, a: Operand, b: Operand) -> ir.Value:
    """``fmax``/``fmin``: Max/Min, except that a NaN operand gives the other one (NaN only where both are NaN),
    found as ``x != x``."""
    dtype, av, bv = _float_operands(t, node, a, b)
    shape = out_shape(node)
    both = t.emit1(_NAN_IGNORING[node.target], [av, bv], dtype=dtype, shape=shape)  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload

    def nan(v: ir.Value) -> ir.Value:
        same = t.emit1("Equal", [v, v], dtype=torch.bool, shape=tuple(v.shape or ()))  # type: ignore[arg-type]  # every translator value has a shape
        return t.emit1("Not", [same], dtype=torch.bool, shape=tuple(v.shape or ()))  # type: ignore[arg-type]  # every translator value has a shape

    b_or_max = t.emit1("Where", [nan(bv), av, both], dtype=dtype, shape=shape)
    return t.out("Where", [nan(av), bv, b_or_max])


@handles(aten.hypot.default)
def _hypot(t: Translator, node: Node, a: Operand, b: Operand) -> ir.Value:
    """``sqrt(a^2 + b^2)`` as ``m * sqrt(1 + (s / m)^2)`` with ``m = max(|a|, |b|)`` and ``s`` the smaller: the
    squares of the plain form overflow float16 for values above 256 on HTP. ``m = 0`` gives 0."""
    dtype, av, bv = _float_operands(t, node, a, b)
    shape = out_shape(node)
    abs_a = t.emit1("Abs", [av], dtype=dtype, shape=tuple(av.shape or ()))  # type: ignore[arg-type]  # every translator value has a shape
    abs_b = t.emit1("Abs", [bv], dtype=dtype, shape=tuple(bv.shape or ()))  # type: ignore[arg-type]  # every translator value has a shape
    big = t.emit1("Max", [abs_a, abs_b], dtype=dtype, shape=shape)
    small = t.emit1("Min", [abs_a, abs_b], dtype=dtype, shape=shape)
    zero = t.emit1("Equal", [big, t.scalar(0.0, dtype)], dtype=torch.bool, shape=shape)
    safe = t.emit1("Where", [zero, t.scalar(1.0, dtype), big], dtype=dtype, shape=shape)
    ratio = t.emit1("Div", [small, safe], dtype=dtype, shape=shape)
    square = t.emit1("Mul", [ratio, ratio], dtype=dtype, shape=shape)
    root = t.emit1(
        "Sqrt", [t.emit1("Add", [square, t.scalar(1.0, dtype)], dtype=dtype, shape=shape)], dtype=dtype, shape=shape
    )
    return t.out("Mul", [big, root])


# The most elements the differences of every pair of rows may hold (float16 on HTP: 8 MiB).
_MAX_PAIR_ELEMENTS = 1 << 22


def _distances(t: Translator, node: Node, a: Node, b: Node, p: float) -> tuple[ir.Value, tuple[int, ...]]:
    """The ``p``-norm distances ``[..., P, R]`` between the rows of ``a`` ``[..., P, M]`` and ``b`` ``[..., R, M]``:
    the norm of every difference ``a[..., i, None, :] - b[..., None, j, :]``. Not the expansion ``|a|^2 + |b|^2 -
    2ab`` PyTorch may use for p = 2: in float16 it cancels to noise for rows that lie close together."""
    dtype = fake(a).dtype
    if dtype not in (torch.float32, torch.float16) or fake(b).dtype != dtype:
        raise Declined(f"{node.target} of {fake(a).dtype} and {fake(b).dtype}")
    if p < 0:
        raise Declined(f"{node.target} with p = {p}")
    sa, sb = tuple(int(s) for s in fake(a).shape), tuple(int(s) for s in fake(b).shape)
    batch = torch.broadcast_shapes(sa[:-2], sb[:-2])
    pairs = (*batch, sa[-2], sb[-2], sa[-1])
    if 0 in pairs or math.prod(pairs) > _MAX_PAIR_ELEMENTS:
        raise Declined(f"{node.target} of {math.prod(pairs)} pair elements (1 to {_MAX_PAIR_ELEMENTS})")
    left = t.emit1("Unsqueeze", [t.value(a), t.ints([-2], "axes")], dtype=dtype, shape=(*sa[:-1], 1, sa[-1]))
    right = t.emit1("Unsqueeze", [t.value(b), t.ints([-3], "axes")], dtype=dtype, shape=(*sb[:-2], 1, *sb[-2:]))
    diff = t.emit1("Sub", [left, right], dtype=dtype, shape=pairs)
    return p_norm(t, diff, dtype, pairs, [len(pairs) - 1], p, pairs[:-1]), pairs[:-1]


@handles(aten._cdist_forward.default)
def _cdist(t: Translator, node: Node, a: Node, b: Node, p: float, compute_mode: int | None = None) -> ir.Value:
    """``torch.cdist``: the distances of every pair of rows, each a vector norm of their difference."""
    return _distances(t, node, a, b, float(p))[0]


@handles(aten._pdist_forward.default)
def _pdist(t: Translator, node: Node, x: Node, p: float = 2.0) -> ir.Value:
    """``torch.nn.functional.pdist``: the distances ``d(i, j)`` for ``i < j`` in row-major order, gathered from the
    ``[N, N]`` distances of every pair (constant positions)."""
    full, shape = _distances(t, node, x, x, float(p))
    n = shape[-1]
    if n < 2:
        raise Declined(f"pdist of {n} row(s)")
    flat = t.emit1("Reshape", [full, t.ints([n * n])], dtype=fake(x).dtype, shape=(n * n,))
    upper = torch.tensor([i * n + j for i in range(n) for j in range(i + 1, n)], dtype=torch.int64)
    return t.out("Gather", [flat, t.initializer(upper, "pairs")], {"axis": 0})
