"""Reductions and scans over axes: mean, sum, max, min, the softmax family, cumsum, and the orderings (topk, sort)."""

from __future__ import annotations

import math
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


_SOFTMAX = {aten._softmax.default: "Softmax", aten._log_softmax.default: "LogSoftmax"}
# Over the given axes (all of them for the overloads without a dim, or for dim=None).
_REDUCTIONS = {
    aten.mean.dim: "ReduceMean",
    aten.sum.dim_IntList: "ReduceSum",
    aten.amax.default: "ReduceMax",
    aten.amin.default: "ReduceMin",
    aten.mean.default: "ReduceMean",
    aten.sum.default: "ReduceSum",
}


@handles(*_REDUCTIONS)
def _reduce(
    t: Translator, node: Node, x: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False, **kwargs: object
) -> ir.Value:
    op = _REDUCTIONS[node.target]  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload
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


@handles(aten.prod.default, aten.prod.dim_int)
def _prod(
    t: Translator,
    node: Node,
    x: Node,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> ir.Value:
    """``torch.prod`` of a float tensor, over one axis or every element, as a tree of Muls: the axis is padded with
    ones to a power of two, then its halves are multiplied until one position is left (QNN HTP has no ReduceProd).
    The order of the multiplications differs from PyTorch's, as any reduction's may; an intermediate product
    beyond float16's range saturates on HTP as a user's own chain of Muls would."""
    val = node.meta["val"]
    out_dtype, out_shape = val.dtype, tuple(int(s) for s in val.shape)
    if out_dtype not in (torch.float32, torch.float16) or fake(x).dtype != out_dtype:
        raise Declined(f"prod of {fake(x).dtype} to {out_dtype}")
    shape = tuple(int(s) for s in fake(x).shape)
    if 0 in shape:
        raise Declined("prod of an empty tensor")
    data = t.value(x)
    if dim is None:  # every element: a flat view
        shape = (math.prod(shape),)
        data = t.emit1("Reshape", [data, t.ints(shape)], dtype=out_dtype, shape=shape)
        axis = 0
    elif not shape:
        return data
    else:
        axis = onnx_axis(dim, len(shape))
    n = shape[axis]
    width = 1 << (n - 1).bit_length()
    if width > n:
        pads = [0] * (2 * len(shape))
        pads[len(shape) + axis] = width - n
        shape = (*shape[:axis], width, *shape[axis + 1 :])
        data = t.emit1("Pad", [data, t.ints(pads), t.scalar(1.0, out_dtype)], dtype=out_dtype, shape=shape)
    while shape[axis] > 1:
        half = shape[axis] // 2
        shape = (*shape[:axis], half, *shape[axis + 1 :])
        first, second = (
            t.emit1("Slice", [data, t.ints([s]), t.ints([s + half]), t.ints([axis])], dtype=out_dtype, shape=shape)
            for s in (0, half)
        )
        data = t.emit1("Mul", [first, second], dtype=out_dtype, shape=shape)
    return t.emit1("Reshape", [data, t.ints(out_shape)], dtype=out_dtype, shape=out_shape)


# A running product is written as a chain of Muls, one per position: every intermediate is one of the outputs (a
# prefix product), so nothing overflows float16 on HTP that the output does not show; a log-step scan would form
# products of inner windows, which can overflow where every prefix is finite.
_CUMPROD_MAX_STEPS = 32


@handles(aten.cumprod.default)
def _cumprod(t: Translator, node: Node, x: Node, dim: int, dtype: torch.dtype | None = None) -> ir.Value:
    """``torch.cumprod`` along ``dim`` as the chain ``y[k] = y[k - 1] * x[k]`` of Slices and Muls, then one Concat
    (ONNX has no running product; up to 32 positions)."""
    val = node.meta["val"]
    shape = tuple(val.shape)
    if val.dtype not in (torch.float32, torch.float16) or fake(x).dtype != val.dtype:
        raise Declined(f"cumprod to {val.dtype} from {fake(x).dtype}")
    if not shape:
        return t.value(x)
    d = onnx_axis(dim, len(shape))
    n = shape[d]
    if n == 0 or n > _CUMPROD_MAX_STEPS:
        raise Declined(f"cumprod over {n} positions (1 to {_CUMPROD_MAX_STEPS} are written as a chain of Muls)")
    if n == 1:
        return t.value(x)
    one = (*shape[:d], 1, *shape[d + 1 :])
    data = t.value(x)
    prefixes: list[ir.Value] = []
    for k in range(n):
        ends, axes = t.ints([k + 1], "ends"), t.ints([d], "axes")
        piece = t.emit1("Slice", [data, t.ints([k], "starts"), ends, axes], dtype=val.dtype, shape=one)
        prefixes.append(piece if k == 0 else t.emit1("Mul", [prefixes[-1], piece], dtype=val.dtype, shape=one))
    return t.out("Concat", prefixes, {"axis": d})


@handles(aten.aminmax.default)
def _aminmax(
    t: Translator, node: Node, x: Node, *, dim: int | None = None, keepdim: bool = False
) -> tuple[ir.Value, ir.Value]:
    """``torch.aminmax``: ReduceMin and ReduceMax over ``dim``, or over every axis when it is None (torch.onnx
    asks for a dim there and fails)."""
    val = node.meta["val"][0]
    rank = fake(x).dim()
    if rank == 0:
        return t.value(x), t.value(x)
    axes = [onnx_axis(dim, rank)] if dim is not None else list(range(rank))
    shape = tuple(val.shape)
    pair = tuple(
        t.emit1(op, [t.value(x), t.ints(axes, "axes")], {"keepdims": int(bool(keepdim))}, dtype=val.dtype, shape=shape)
        for op in ("ReduceMin", "ReduceMax")
    )
    return pair[0], pair[1]


@handles(aten.logsumexp.default)
def _logsumexp(t: Translator, node: Node, x: Node, dim: Sequence[int], keepdim: bool = False) -> ir.Value:
    """``torch.logsumexp`` as eager computes it: ``log(sum(exp(x - m))) + m`` with ``m`` the maximum over the axes,
    set to 0 where it is infinite (a row of -inf gives ``log(0) + 0 = -inf``, a row holding +inf gives +inf).

    The -inf test reads ``Equal(ReduceMax(x), -inf)`` and selects with ``Where``, the form ``safe_softmax_without_inf``
    rewrites for HTP (which has no infinities) into ``ReduceMax(x) <= -32768``. There a row of -inf stand-ins gives
    the -inf constant, which HTP holds as a number beyond float16's range, so the backend computes that call in
    PyTorch rather than return a finite number. Every exponent is at most 0 and the sum at least 1."""
    val = node.meta["val"]
    dtype = val.dtype
    if not dtype.is_floating_point:
        raise Declined(f"logsumexp to {dtype}")
    in_shape = tuple(int(s) for s in fake(x).shape)
    if 0 in in_shape:
        raise Declined("logsumexp of an empty tensor")
    rank = len(in_shape)
    xv = t.operand(x, dtype)
    if rank == 0:
        return xv
    axes = sorted({onnx_axis(d, rank) for d in dim}) or list(range(rank))
    kept = tuple(1 if i in axes else s for i, s in enumerate(in_shape))
    axes_value = t.ints(axes, "axes")

    def emit(op: str, inputs: list[ir.Value], shape: tuple[int, ...] = kept, **attrs: int) -> ir.Value:
        return t.emit1(op, inputs, attrs, dtype=dtype, shape=shape)

    top = emit("ReduceMax", [xv, axes_value], keepdims=1)
    ninf, pinf, zero = (t.scalar(v, dtype) for v in (float("-inf"), float("inf"), 0.0))
    empty_row = t.emit1("Equal", [top, ninf], dtype=torch.bool, shape=kept)
    infinite_top = t.emit1("Equal", [top, pinf], dtype=torch.bool, shape=kept)
    shift = emit("Where", [infinite_top, zero, emit("Where", [empty_row, zero, top])])
    exp = emit("Exp", [emit("Sub", [xv, shift], in_shape)], in_shape)
    total = emit("Add", [emit("Log", [emit("ReduceSum", [exp, axes_value], keepdims=1)]), shift])
    out = emit("Where", [empty_row, ninf, total])
    shape = tuple(int(s) for s in val.shape)
    return out if shape == kept else t.emit1("Reshape", [out, t.ints(shape)], dtype=dtype, shape=shape)


# A p-norm's prescaled sum is at most the number of elements reduced: from float16's largest value on it would
# saturate on HTP and come back finite and wrong (the root brings it back into range).
_MAX_NORM_ELEMENTS = 65504
# The floor of the largest magnitude a p-norm divides by (l2_norm_prescaled's too): a row of zeros stays zero.
_NORM_SCALE_FLOOR = 2.0**-14


def _norm_rows(
    t: Translator, x: ir.Value, dtype: torch.dtype, shape: tuple[int, ...], axes: list[int]
) -> tuple[ir.Value, tuple[int, ...], list[int]]:
    """``x`` (its shape and the axes to reduce) as it is up to rank 4; at rank 5, where the QNN EP declines
    ReduceMax and a keepdims ReduceL2 and l2_norm_prescaled leaves the norm, as ``[kept elements, reduced
    elements]`` reduced over its last axis."""
    if len(shape) < 5:
        return x, shape, axes
    kept = [i for i in range(len(shape)) if i not in axes]
    perm = kept + axes
    moved = tuple(shape[i] for i in perm)
    if perm != list(range(len(shape))):
        x = t.emit1("Transpose", [x], {"perm": perm}, dtype=dtype, shape=moved)
    rows = (math.prod(moved[: len(kept)]), math.prod(moved[len(kept) :]))
    return t.emit1("Reshape", [x, t.ints(rows)], dtype=dtype, shape=rows), rows, [1]


@handles(aten.linalg_vector_norm.default)
def _vector_norm(
    t: Translator,
    node: Node,
    x: Node,
    ord: float = 2,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> ir.Value:
    """``torch.linalg.vector_norm`` of a float tensor over ``dim`` (every axis when None or empty), in ``dtype``:

    - ``ord=2``: ReduceL2 (l2_norm_prescaled computes it on ``x / max|x|`` for HTP, whose sum of squares saturates);
    - ``ord=1``: ReduceSum of Abs; ``ord=inf`` / ``-inf``: ReduceMax / ReduceMin of Abs;
    - ``ord=0``: the count of nonzero elements, ``ReduceSum(Where(x == 0, 0, 1))``;
    - any other ``p > 0``: ``m * sum((|x| / m)^p)^(1/p)`` with ``m = max(max|x|, 2^-14)``: every term is at most 1,
      the largest one 1, so the sum neither overflows nor loses its large terms (up to 65504 elements reduced).

    A negative ``p`` other than -inf declines: prescaled by the least magnitude, HTP divides by it through its
    reciprocal, which leaves float16's range for a least magnitude below 1.5e-5 (``p = -1.5`` of ``[1.9e-3, 9.7e-6,
    2.6e-4]`` came out 6.1e-6 for 9.6e-6). A rank-5 input is reduced as ``[kept, reduced]`` rows."""
    val = node.meta["val"]
    out_dtype = val.dtype
    if out_dtype not in (torch.float32, torch.float16) or not fake(x).dtype.is_floating_point:
        raise Declined(f"vector norm of {fake(x).dtype} to {out_dtype}")
    p = float(ord)
    if p < 0 and p != float("-inf"):
        raise Declined(f"vector norm of order {p}")
    shape = tuple(int(s) for s in fake(x).shape)
    if 0 in shape:
        raise Declined("vector norm of an empty tensor")
    out_shape = tuple(int(s) for s in val.shape)
    xv = t.operand(x, out_dtype)
    if not shape:
        return (
            t.out("Abs", [xv]) if p != 0 else t.out("Where", [_is_zero(t, xv, out_dtype, ()), *_zero_one(t, out_dtype)])
        )
    rank = len(shape)
    axes = sorted({onnx_axis(d, rank) for d in dim or ()}) or list(range(rank))
    return p_norm(t, xv, out_dtype, shape, axes, p, out_shape)


@handles(aten.dist.default)
def _dist(t: Translator, node: Node, a: Node, b: Node, p: float = 2) -> ir.Value:
    """``torch.dist(a, b, p)``: the ``p``-norm of ``a - b`` (broadcast) over every element, as :func:`_vector_norm`
    computes it."""
    out_dtype = node.meta["val"].dtype
    if out_dtype not in (torch.float32, torch.float16):
        raise Declined(f"dist to {out_dtype}")
    order = float(p)
    if order < 0 and order != float("-inf"):
        raise Declined(f"dist of order {order}")
    shape = tuple(int(s) for s in torch.broadcast_shapes(fake(a).shape, fake(b).shape))
    if 0 in shape:
        raise Declined("dist of empty tensors")
    diff = t.emit1("Sub", [t.operand(a, out_dtype), t.operand(b, out_dtype)], dtype=out_dtype, shape=shape)
    if not shape:  # two 0-d tensors: the norm of one element
        shape = (1,)
        diff = t.emit1("Reshape", [diff, t.ints(shape)], dtype=out_dtype, shape=shape)
    return p_norm(t, diff, out_dtype, shape, list(range(len(shape))), order, ())


def p_norm(
    t: Translator,
    xv: ir.Value,
    out_dtype: torch.dtype,
    shape: tuple[int, ...],
    axes: list[int],
    p: float,
    out_shape: tuple[int, ...],
) -> ir.Value:
    """The ``p``-norm of ``xv`` (of ``shape``, rank >= 1, no empty axis) over ``axes``, reshaped to ``out_shape``, as
    :func:`_vector_norm` describes it (``p >= 0`` or ``-inf``)."""
    count = math.prod(shape[i] for i in axes)
    if p not in (0, 1, 2, float("inf"), float("-inf")) and count >= _MAX_NORM_ELEMENTS:  # the prescaled sum
        raise Declined(f"vector norm of order {p} over {count} elements (up to {_MAX_NORM_ELEMENTS - 1})")
    rows, rows_shape, axes = _norm_rows(t, xv, out_dtype, shape, axes)
    kept = tuple(1 if i in axes else s for i, s in enumerate(rows_shape))

    def emit(op: str, *inputs: ir.Value, full: bool = False, **attrs: int) -> ir.Value:
        return t.emit1(op, list(inputs), attrs, dtype=out_dtype, shape=rows_shape if full else kept)

    axes_value = t.ints(axes, "axes")
    if p == 2:
        norm = emit("ReduceL2", rows, axes_value, keepdims=1)
    elif p == 0:
        nonzero = emit("Where", _is_zero(t, rows, out_dtype, rows_shape), *_zero_one(t, out_dtype), full=True)
        norm = emit("ReduceSum", nonzero, axes_value, keepdims=1)
    else:
        magnitude = emit("Abs", rows, full=True)
        ops = {1.0: "ReduceSum", float("inf"): "ReduceMax", float("-inf"): "ReduceMin"}
        norm = emit(ops.get(p, "ReduceMax"), magnitude, axes_value, keepdims=1)
        if p not in ops:  # m * sum((|x| / m)^p)^(1/p), m the largest magnitude (floored)
            scale = emit("Max", norm, t.scalar(_NORM_SCALE_FLOOR, out_dtype))
            terms = emit("Pow", emit("Div", magnitude, scale, full=True), t.scalar(p, out_dtype), full=True)
            total = emit("ReduceSum", terms, axes_value, keepdims=1)
            norm = emit("Mul", emit("Pow", total, t.scalar(1.0 / p, out_dtype)), scale)
    return (
        norm if kept == out_shape else t.emit1("Reshape", [norm, t.ints(out_shape)], dtype=out_dtype, shape=out_shape)
    )


def _is_zero(t: Translator, x: ir.Value, dtype: torch.dtype, shape: tuple[int, ...]) -> ir.Value:
    return t.emit1("Equal", [x, t.scalar(0.0, dtype)], dtype=torch.bool, shape=shape)


def _zero_one(t: Translator, dtype: torch.dtype) -> tuple[ir.Value, ir.Value]:
    return t.scalar(0.0, dtype), t.scalar(1.0, dtype)
