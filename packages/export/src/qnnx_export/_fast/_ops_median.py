"""Medians: ``median`` and ``nanmedian``, over all elements or along one axis.

The lower median of ``n`` values is the last of the ``(n - 1) // 2 + 1`` smallest (a TopK). Only values are written
that way: an index of the median would name one of several values that float16 rounding on HTP can make equal
where they differ in float32, so ``median(x, dim)`` declines when its indices are read (unless the axis has one
position). ``nanmedian`` skips NaNs, which HTP does not compute with: it is translated only where there is one value
to take.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, only_first_output_used, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


def _lower_median(t: Translator, value: ir.Value, shape: tuple[int, ...], axis: int, dtype: torch.dtype) -> ir.Value:
    """The lower median along ``axis`` of ``value`` (kept as an axis of size 1)."""
    n = shape[axis]
    k = (n - 1) // 2 + 1
    smallest = (*shape[:axis], k, *shape[axis + 1 :])
    low = t.emit(
        "TopK",
        [value, t.ints([k], "k")],
        {"axis": axis, "largest": 0, "sorted": 1},
        outputs=[(dtype, smallest), (torch.int64, smallest)],
    )[0]
    one = (*shape[:axis], 1, *shape[axis + 1 :])
    return t.emit1(
        "Slice", [low, t.ints([k - 1], "starts"), t.ints([k], "ends"), t.ints([axis], "axes")], dtype=dtype, shape=one
    )


@handles(aten.median.default, aten.nanmedian.default)
def _median_all(t: Translator, node: Node, x: Node) -> ir.Value:
    """``median(x)`` (the lower median of every element) and ``nanmedian(x)`` of one element."""
    val = node.meta["val"]
    count = math.prod(int(s) for s in fake(x).shape)
    if val.dtype not in (torch.float32, torch.float16):
        raise Declined(f"{node.target} of {val.dtype}")
    flat = t.emit1("Reshape", [t.value(x), t.ints([1, count])], dtype=val.dtype, shape=(1, count))
    if count > 1:
        if node.target is aten.nanmedian.default:
            raise Declined("nanmedian of more than one value (HTP does not compute with NaN)")
        flat = _lower_median(t, flat, (1, count), 1, val.dtype)
    return t.out("Reshape", [flat, t.ints([], "shape")])


@handles(aten.median.dim, aten.nanmedian.dim)
def _median_dim(
    t: Translator, node: Node, x: Node, dim: int, keepdim: bool = False
) -> tuple[ir.Value, ir.Value | None]:
    """``median(x, dim)``: its values (the indices only for an axis of one position, where they are 0)."""
    values = node.meta["val"][0]
    dtype = values.dtype
    if dtype not in (torch.float32, torch.float16):
        raise Declined(f"{node.target} of {dtype}")
    shape = tuple(int(s) for s in fake(x).shape) or (1,)
    axis = onnx_axis(dim, len(shape))
    n = shape[axis]
    if n != 1 and not only_first_output_used(node):
        raise Declined(f"{node.target} with its indices (float16 can make distinct values equal on HTP)")
    if n != 1 and node.target is aten.nanmedian.dim:
        raise Declined("nanmedian of more than one value (HTP does not compute with NaN)")
    xv = t.emit1("Reshape", [t.value(x), t.ints(shape)], dtype=dtype, shape=shape)
    kept = xv if n == 1 else _lower_median(t, xv, shape, axis, dtype)
    out = tuple(int(s) for s in values.shape)
    median = t.emit1("Reshape", [kept, t.ints(out)], dtype=dtype, shape=out)
    if n != 1:
        return median, None
    zeros = t.initializer(torch.zeros(out, dtype=torch.int64), "median_index")
    return median, t.emit1("Identity", [zeros], dtype=torch.int64, shape=out)
