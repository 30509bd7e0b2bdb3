"""``segment_reduce``: sum, mean, max or min over consecutive segments of an axis, whose lengths (or offsets) are a
tensor, constant or a runtime input.

Each segment's elements are picked by a mask ``start <= position < end`` over the axis (``end`` the running sum of
the lengths, ``start = end - length``), folded on the host when the lengths are constants. The data is viewed as
``[lead, L, inner]`` (``lead`` the dims before the axis, which ``lengths`` shares, ``inner`` the dims after); the
reduction is over ``[lead, S, L, inner]`` with the masked-out elements set to the reduction's identity: 0 for the
sums, and for max/min the data's own least/greatest element, so every value stays in the data's range (float16 on
HTP). Then, as eager computes it: ``initial`` enters every segment (``max(initial, ...)``, ``initial + sum``, and
``(initial + sum) / length`` for the mean), and an empty segment gives ``initial``, or without it 0 (sum), NaN
(mean), -inf (max) or +inf (min). ``prod`` is declined: a float16 product can saturate part-way on HTP.
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

_MAX_ELEMENTS = 1 << 22  # elements of the masked [lead, S, L, inner] tensor
_EMPTY = {"sum": 0.0, "mean": float("nan"), "max": float("-inf"), "min": float("inf")}


def _bounds(
    t: Translator, lengths: Node | None, offsets: Node | None, lead: int, segments: int
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Each segment's first and end position and its length, int32 ``[lead, S, 1]``."""
    given = lengths if lengths is not None else offsets
    assert given is not None
    constant = t.constant_of(given)
    if constant is not None:  # folded on the host
        host = _host_bounds(constant.to(torch.int64).reshape(lead, -1), by_lengths=lengths is not None)
        names = ("segment_start", "segment_end", "segment_length")
        start, end, size = (
            t.initializer(v.to(torch.int32).reshape(lead, segments, 1).contiguous(), name)
            for v, name in zip(host, names, strict=True)
        )
        return start, end, size
    return _graph_bounds(t, t.operand(given, torch.int32), lead, segments, by_lengths=lengths is not None)


def _host_bounds(c: torch.Tensor, *, by_lengths: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if by_lengths:
        end = c.cumsum(-1)
        return end - c, end, c
    return c[:, :-1], c[:, 1:], c[:, 1:] - c[:, :-1]


def _graph_bounds(
    t: Translator, raw: ir.Value, lead: int, segments: int, *, by_lengths: bool
) -> tuple[ir.Value, ir.Value, ir.Value]:
    width = segments if by_lengths else segments + 1
    raw = t.emit1("Reshape", [raw, t.ints([lead, width])], dtype=torch.int32, shape=(lead, width))
    if by_lengths:
        end = t.emit1("CumSum", [raw, t.scalar(1, torch.int64)], dtype=torch.int32, shape=(lead, segments))
        start = t.emit1("Sub", [end, raw], dtype=torch.int32, shape=(lead, segments))
    else:
        ends = (t.ints([segments]), t.ints([segments + 1]))
        start = t.emit1("Slice", [raw, t.ints([0]), ends[0], t.ints([1])], dtype=torch.int32, shape=(lead, segments))
        end = t.emit1("Slice", [raw, t.ints([1]), ends[1], t.ints([1])], dtype=torch.int32, shape=(lead, segments))
    size = t.emit1("Sub", [end, start], dtype=torch.int32, shape=(lead, segments))
    shape = (lead, segments, 1)
    start, end, size = (
        t.emit1("Reshape", [v, t.ints(list(shape))], dtype=torch.int32, shape=shape) for v in (start, end, size)
    )
    return start, end, size


@handles(aten.segment_reduce.default)
def _segment_reduce(
    t: Translator,
    node: Node,
    data: Node,
    reduce: str,
    *,
    lengths: Node | None = None,
    indices: Node | None = None,
    offsets: Node | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> ir.Value:
    """``segment_reduce(data, reduce, lengths=... | offsets=..., axis, initial)`` for sum, mean, max and min."""
    del unsafe  # eager's checks of the lengths; a graph computes what the lengths say
    val = node.meta["val"]
    dtype = val.dtype
    if reduce not in _EMPTY:
        raise Declined(f"segment_reduce with reduce={reduce!r} (sum, mean, max and min are translated)")
    if indices is not None or (lengths is None) == (offsets is None):
        raise Declined("segment_reduce by indices, or by both lengths and offsets")
    if not dtype.is_floating_point:
        raise Declined(f"segment_reduce of {dtype} data")
    shape = tuple(int(s) for s in fake(data).shape)
    axis = axis % len(shape) if shape else 0
    lead, count, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    segments = int(val.shape[axis])
    if not lead * count * inner * segments:
        raise Declined("segment_reduce with an empty data, segment list or result")
    if lead * segments * count * inner > _MAX_ELEMENTS:
        raise Declined(f"segment_reduce over {lead * segments * count * inner} masked elements (up to {_MAX_ELEMENTS})")
    start, end, size = _bounds(t, lengths, offsets, lead, segments)
    positions = t.initializer(torch.arange(count, dtype=torch.int32).reshape(1, 1, count), "segment_positions")
    grid = (lead, segments, count)
    after = t.emit1("GreaterOrEqual", [positions, start], dtype=torch.bool, shape=grid)
    before = t.emit1("Less", [positions, end], dtype=torch.bool, shape=grid)
    inside = t.emit1("And", [after, before], dtype=torch.bool, shape=grid)
    inside = t.emit1("Unsqueeze", [inside, t.ints([3], "axes")], dtype=torch.bool, shape=(*grid, 1))
    rows = t.emit1(
        "Reshape", [t.value(data), t.ints([lead, 1, count, inner])], dtype=dtype, shape=(lead, 1, count, inner)
    )
    full, kept = (lead, segments, count, inner), (lead, segments, inner)
    if reduce in ("max", "min"):
        extreme = "ReduceMin" if reduce == "max" else "ReduceMax"  # the fill: the data's own other extreme
        fill = t.emit1(extreme, [t.value(data)], {"keepdims": 0}, dtype=dtype, shape=())
        masked = t.emit1("Where", [inside, rows, fill], dtype=dtype, shape=full)
        op = "ReduceMax" if reduce == "max" else "ReduceMin"
        out = t.emit1(op, [masked, t.ints([2], "axes")], {"keepdims": 0}, dtype=dtype, shape=kept)
        if initial is not None:
            out = t.emit1(
                "Max" if reduce == "max" else "Min", [out, t.scalar(float(initial), dtype)], dtype=dtype, shape=kept
            )
    else:
        masked = t.emit1("Where", [inside, rows, t.scalar(0.0, dtype)], dtype=dtype, shape=full)
        out = t.emit1("ReduceSum", [masked, t.ints([2], "axes")], {"keepdims": 0}, dtype=dtype, shape=kept)
        if initial is not None:
            out = t.emit1("Add", [out, t.scalar(float(initial), dtype)], dtype=dtype, shape=kept)
        if reduce == "mean":
            length = t.emit1("Cast", [size], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=(lead, segments, 1))
            length = t.emit1("Max", [length, t.scalar(1.0, dtype)], dtype=dtype, shape=(lead, segments, 1))
            out = t.emit1("Div", [out, length], dtype=dtype, shape=kept)
    empty = t.emit1("Equal", [size, t.scalar(0, torch.int32)], dtype=torch.bool, shape=(lead, segments, 1))
    if_empty = float(initial) if initial is not None else _EMPTY[reduce]
    out = t.emit1("Where", [empty, t.scalar(if_empty, dtype), out], dtype=dtype, shape=kept)
    return t.out("Reshape", [out, t.ints(list(val.shape))])
