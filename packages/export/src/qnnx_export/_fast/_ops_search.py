"""``searchsorted`` and ``bucketize`` as counts: the insertion index of a value in a sorted row is how many of the
row's elements come before it, so every value is compared with every element of its row and the hits are summed.

Eager PyTorch's binary search keeps ``start = mid + 1`` while ``!(row[mid] >= value)`` (``side="left"``) or
``!(row[mid] > value)`` (``side="right"``); the count sums the same predicate over the row, so a NaN value gets the
row's length, as in eager. On a sorted row the two agree; a row holding NaN is outside it (binary search's answer
then depends on which elements it probes). A ``sorter`` does not change a count (it is a permutation of the row), so
it is not read. The comparisons run in the inputs' common dtype; on HTP float inputs are float16, so a value and an
element that round to one float16 count as equal (as ``bucketize`` through torch.onnx already does there), and an
infinity reaches HTP as float16's largest magnitude (qnnx-backend clips such inputs: HTP compares infinities
wrongly), which orders it as eager does against finite elements below that. The
work is one comparison per (value, element) pair: rows beyond :data:`_MAX_PAIRS` pairs are declined.

``nonzero_static`` is the same kind of count turned around: the positions of the nonzero elements, found by their
running count.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

_MAX_PAIRS = 1 << 22  # value x element comparisons written as one tensor


def _shape_of(x: Node | int | float) -> tuple[int, ...]:
    return tuple(int(s) for s in fake(x).shape) if not isinstance(x, (int, float)) else ()


def insertion_counts(
    t: Translator, node: Node, row: Node, values: Node | int | float, *, right: bool, out_int32: bool
) -> ir.Value:
    """The number of elements of ``row``'s last axis before each value: ``[*lead, M]`` rows and ``[*lead, K]``
    values (or one ``[M]`` row for values of any shape)."""
    val = node.meta["val"]
    if val.dtype != (torch.int32 if out_int32 else torch.int64):
        raise Declined(f"{node.target} returning {val.dtype}")
    if isinstance(values, bool) or (not isinstance(values, (int, float)) and fake(values).dtype == torch.bool):
        raise Declined(f"{node.target} of bool values")
    row_shape, value_shape = _shape_of(row), _shape_of(values)
    row_dtype = fake(row).dtype
    value_dtype = fake(values).dtype if not isinstance(values, (int, float)) else torch.result_type(fake(row), values)
    if row_dtype == torch.bool or row_dtype.is_complex or value_dtype.is_complex:
        raise Declined(f"{node.target} of {row_dtype} and {value_dtype}")
    common = torch.promote_types(row_dtype, value_dtype)
    if not row_shape:
        raise Declined(f"{node.target} of a 0-d sequence")
    width = row_shape[-1]
    if len(row_shape) == 1:
        lead, count = 1, math.prod(value_shape)
    elif row_shape[:-1] == value_shape[:-1]:
        lead, count = math.prod(row_shape[:-1]), value_shape[-1]
    else:
        raise Declined(f"{node.target} of rows {row_shape} and values {value_shape} (leading dims must match)")
    if lead * count * width > _MAX_PAIRS:
        raise Declined(f"{node.target} would compare {lead * count * width} pairs (up to {_MAX_PAIRS})")
    if not count * width * lead:
        raise Declined(f"{node.target} with an empty sequence or no values")
    rows = t.emit1("Reshape", [t.operand(row, common), t.ints([lead, 1, width])], dtype=common, shape=(lead, 1, width))
    vals = t.emit1(
        "Reshape", [t.operand(values, common), t.ints([lead, count, 1])], dtype=common, shape=(lead, count, 1)
    )
    pairs = (lead, count, width)
    # left: !(row >= value); right: !(row > value), eager's binary-search predicate.
    reached = t.emit1("GreaterOrEqual" if not right else "Greater", [rows, vals], dtype=torch.bool, shape=pairs)
    before = t.emit1("Not", [reached], dtype=torch.bool, shape=pairs)
    hits = t.emit1("Cast", [before], {"to": int(ir_dtype(torch.int32))}, dtype=torch.int32, shape=pairs)
    counts = t.emit1("ReduceSum", [hits, t.ints([2], "axes")], {"keepdims": 0}, dtype=torch.int32, shape=(lead, count))
    shaped = t.emit1("Reshape", [counts, t.ints(list(val.shape))], dtype=torch.int32, shape=tuple(val.shape))
    if out_int32:
        return shaped
    return t.out("Cast", [shaped], {"to": int(ir_dtype(torch.int64))})


def _side(right: bool, side: str | None) -> bool:
    if side is None:
        return right
    if side not in ("left", "right"):
        raise Declined(f"searchsorted side={side!r} (left or right)")
    return side == "right"


@handles(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(
    t: Translator,
    node: Node,
    sorted_sequence: Node,
    values: Node | int | float,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Node | None = None,
) -> ir.Value:
    """``searchsorted(sorted_sequence, values)``: the count of each row's elements before each value."""
    return insertion_counts(t, node, sorted_sequence, values, right=_side(right, side), out_int32=out_int32)


@handles(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(
    t: Translator,
    node: Node,
    values: Node | int | float,
    boundaries: Node,
    *,
    out_int32: bool = False,
    right: bool = False,
) -> ir.Value:
    """``bucketize(values, boundaries)``: ``searchsorted(boundaries, values)`` over 1-d boundaries."""
    if len(_shape_of(boundaries)) != 1:
        raise Declined(f"bucketize with boundaries of shape {_shape_of(boundaries)} (1-d)")
    return insertion_counts(t, node, boundaries, values, right=right, out_int32=out_int32)


@handles(aten.nonzero_static.default)
def _nonzero_static(t: Translator, node: Node, x: Node, *, size: int, fill_value: int = -1) -> ir.Value:
    """``nonzero_static(x, size=..., fill_value=...)``: the coordinates of the first ``size`` nonzero elements in
    row-major order, rows of ``fill_value`` after the last one. The element numbered ``k`` among the nonzero ones is
    the one whose running count of nonzero elements is ``k + 1``: one comparison per (row, element) pair, its flat
    position summed out of the match, then split into coordinates by integer division. A float is nonzero as
    ``Not(Equal(x, 0))`` decides it (right on HTP for zeros, -0.0 and every value float16 keeps)."""
    val = node.meta["val"]
    shape = tuple(int(s) for s in fake(x).shape)
    count, rank = math.prod(shape), len(shape)
    if not size or not rank or not count:
        raise Declined("nonzero_static with an empty result or input")
    if size * count > _MAX_PAIRS or count >= 1 << 24:
        raise Declined(f"nonzero_static of {count} elements into {size} rows (up to {_MAX_PAIRS} pairs)")
    if fake(x).is_complex():
        raise Declined(f"nonzero_static of {fake(x).dtype}")
    flat = t.emit1("Reshape", [t.value(x), t.ints([1, count])], dtype=fake(x).dtype, shape=(1, count))
    if fake(x).dtype != torch.bool:
        zero = t.scalar(0.0 if fake(x).dtype.is_floating_point else 0, fake(x).dtype)
        flat = t.emit1(
            "Not",
            [t.emit1("Equal", [flat, zero], dtype=torch.bool, shape=(1, count))],
            dtype=torch.bool,
            shape=(1, count),
        )
    ones = t.emit1("Cast", [flat], {"to": int(ir_dtype(torch.int32))}, dtype=torch.int32, shape=(1, count))
    running = t.emit1("CumSum", [ones, t.scalar(1, torch.int64)], dtype=torch.int32, shape=(1, count))
    slots = t.initializer(torch.arange(1, size + 1, dtype=torch.int32).reshape(size, 1), "nonzero_rank")
    pairs = (size, count)
    hit = t.emit1(
        "And", [t.emit1("Equal", [running, slots], dtype=torch.bool, shape=pairs), flat], dtype=torch.bool, shape=pairs
    )
    positions = t.initializer(torch.arange(count, dtype=torch.int32).reshape(1, count), "nonzero_position")
    zero32 = t.scalar(0, torch.int32)
    picked = t.emit1("Where", [hit, positions, zero32], dtype=torch.int32, shape=pairs)
    flat_at = t.emit1("ReduceSum", [picked, t.ints([1], "axes")], {"keepdims": 1}, dtype=torch.int32, shape=(size, 1))
    total = t.emit1("ReduceSum", [ones, t.ints([1], "axes")], {"keepdims": 1}, dtype=torch.int32, shape=(1, 1))
    found = t.emit1("LessOrEqual", [slots, total], dtype=torch.bool, shape=(size, 1))
    columns, outer = [], None
    for d in range(rank):
        stride = math.prod(shape[d + 1 :])
        whole = t.emit1("Div", [flat_at, t.scalar(stride, torch.int32)], dtype=torch.int32, shape=(size, 1))
        column = whole
        if outer is not None:  # minus the outer dims' share: (p // stride) - (p // outer_stride) * shape[d]
            share = t.emit1("Mul", [outer, t.scalar(shape[d], torch.int32)], dtype=torch.int32, shape=(size, 1))
            column = t.emit1("Sub", [whole, share], dtype=torch.int32, shape=(size, 1))
        columns.append(column)
        outer = whole
    coords = columns[0] if rank == 1 else t.emit1("Concat", columns, {"axis": 1}, dtype=torch.int32, shape=(size, rank))
    filled = t.emit1(
        "Where", [found, coords, t.scalar(int(fill_value), torch.int32)], dtype=torch.int32, shape=(size, rank)
    )
    return t.out("Cast", [filled], {"to": int(ir_dtype(val.dtype))})
