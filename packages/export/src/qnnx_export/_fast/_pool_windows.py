"""Max pools written window element by window element: the int64 indices of ``max_pool2d/3d(...,
return_indices=True)``, which QNN does not compute (and ONNX's MaxPool numbers across the batch), and the maxima of
the pools HTP has no MaxPool for (three spatial dims, dilation above 1).

Each kernel offset's element of every window is one strided ``Slice`` of the input, padded so that every slice has
the output's shape. The maxima are the elementwise ``Max`` of these slices. PyTorch's index of a window is the flat
position, within its ``[*spatial]`` plane of the input, of its first maximum in scan order (row-major over the
kernel, which is the order of increasing flat position), the padding excluded: each slice is compared with the
maxima, a hit gives that offset's flat position (a constant per output position) and a miss or a padding position
a number past the plane, and the least of them over the offsets is the first maximum. Exact on ONNX Runtime's CPU
EP; on HTP, which compares float16 values, a window whose two largest values round to the same float16 gives the
first of them, as ``argmax`` does there.

All of it runs on the ``[N * C, *spatial]`` view, of rank 4 at most: HTP fails or crashes on several of these ops
at rank 5, which a three-dimensional pool would otherwise need.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from qnnx_export._fast._translator import Declined

if TYPE_CHECKING:
    import onnx_ir as ir

    from qnnx_export._fast._translator import Translator

__all__ = ["Window", "max_pool_by_windows"]


@attrs.frozen
class Window:
    """A pool's window on each spatial axis: kernel size, stride, leading pad (PyTorch pads both ends alike, the end
    further for ceil_mode) and dilation."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]


def _positions(size: int, out: int, window: Window, axis: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The input position of kernel ``offset`` along ``axis`` in each of the ``out`` windows, and whether it lies
    inside the input (not in the padding)."""
    start = torch.arange(out, dtype=torch.int64) * window.strides[axis] - window.pads[axis]
    at = start + offset * window.dilations[axis]
    return at, (at >= 0) & (at < size)


def max_pool_by_windows(
    t: Translator,
    x: ir.Value,
    pooled: ir.Value | None,
    in_shape: Sequence[int],
    out_shape: Sequence[int],
    window: Window,
    dtype: torch.dtype,
    *,
    indices: bool,
    result_shape: Sequence[int],
) -> tuple[ir.Value, ir.Value | None]:
    """The maxima and (with ``indices``) the int64 indices of the max pool of ``x`` (``[N, C, *spatial]``,
    ``dtype``; ``out_shape`` is ``[N, C, *out]``), both in ``result_shape`` (``out_shape`` or its unbatched form).
    ``pooled`` holds the maxima in ``out_shape`` when a MaxPool computed them; when None they are the elementwise
    ``Max`` of the window elements (a pool HTP has no MaxPool for: three spatial dims, dilation)."""
    lead, spatial, out = math.prod(in_shape[:2]), list(in_shape[2:]), list(out_shape[2:])
    rank = len(spatial)
    flat_in, flat_out = (lead, *spatial), (lead, *out)
    xv = t.emit1("Reshape", [x, t.ints(flat_in)], dtype=dtype, shape=flat_in)
    xv = _padded(t, xv, flat_in, window, out, dtype)
    past = math.prod(spatial)  # past every flat position
    plane = [math.prod(spatial[i + 1 :]) for i in range(rank)]  # the flat step of each axis
    axes = t.ints(list(range(1, rank + 1)), "axes")
    steps = t.ints(list(window.strides), "steps")
    elements: list[tuple[ir.Value, torch.Tensor]] = []
    covered = torch.zeros(out, dtype=torch.bool)
    for offset in itertools.product(*(range(k) for k in window.kernel)):
        flat = torch.zeros(out, dtype=torch.int64)
        inside = torch.ones(out, dtype=torch.bool)
        for axis in range(rank):
            at, ok = _positions(spatial[axis], out[axis], window, axis, offset[axis])
            view = [1] * rank
            view[axis] = out[axis]
            flat = flat + (at * plane[axis]).reshape(view)
            inside = inside & ok.reshape(view)
        covered |= inside
        starts = [o * d for o, d in zip(offset, window.dilations, strict=True)]
        ends = [b + (o - 1) * s + 1 for b, o, s in zip(starts, out, window.strides, strict=True)]
        element = t.emit1(
            "Slice", [xv, t.ints(starts, "starts"), t.ints(ends, "ends"), axes, steps], dtype=dtype, shape=flat_out
        )
        elements.append((element, torch.where(inside, flat, torch.tensor(past)).to(torch.int32)))
    if not bool(covered.all()):
        raise Declined("a dilated max pool window that lies wholly in the padding (PyTorch gives -inf there)")
    result = tuple(result_shape)
    if pooled is None:
        maxima = elements[0][0]
        for element, _ in elements[1:]:
            maxima = t.emit1("Max", [maxima, element], dtype=dtype, shape=flat_out)
        pooled = t.emit1("Reshape", [maxima, t.ints(result)], dtype=dtype, shape=result)
    else:
        maxima = t.emit1("Reshape", [pooled, t.ints(flat_out)], dtype=dtype, shape=flat_out)
        if result != tuple(out_shape):
            pooled = t.emit1("Reshape", [pooled, t.ints(result)], dtype=dtype, shape=result)
    if not indices:
        return pooled, None
    first: ir.Value | None = None
    for element, candidate in elements:
        hit = t.emit1("Equal", [element, maxima], dtype=torch.bool, shape=flat_out)
        position = t.initializer(candidate.unsqueeze(0), "pool_position")
        mark = t.emit1("Where", [hit, position, t.scalar(past, torch.int32)], dtype=torch.int32, shape=flat_out)
        first = mark if first is None else t.emit1("Min", [first, mark], dtype=torch.int32, shape=flat_out)
    assert first is not None
    # No element equals the maximum only where it is NaN (equal to nothing): the window's first position then, not
    # one past the plane, which a later gather or unpool would read out of bounds. PyTorch gives its last NaN's;
    # the first call's check against eager PyTorch sees that difference, as it sees HTP's lack of NaN.
    first_inside = elements[-1][1]
    for _, candidate in reversed(elements[:-1]):
        first_inside = torch.where(candidate != past, candidate, first_inside)
    missed = t.emit1("Equal", [first, t.scalar(past, torch.int32)], dtype=torch.bool, shape=flat_out)
    fallback = t.initializer(first_inside.unsqueeze(0), "pool_first_position")
    found = t.emit1("Where", [missed, fallback, first], dtype=torch.int32, shape=flat_out)
    wide = t.emit1("Cast", [found], {"to": 7}, dtype=torch.int64, shape=flat_out)
    return pooled, t.emit1("Reshape", [wide, t.ints(result)], dtype=torch.int64, shape=result)


def _padded(
    t: Translator, xv: ir.Value, shape: Sequence[int], window: Window, out: Sequence[int], dtype: torch.dtype
) -> ir.Value:
    """``xv`` (``[L, *spatial]``) with copies of its least element joined on before each spatial axis (the padding)
    and after it up to the last window's reach. The least element is no greater than any element of a window, and
    every window holds an input element, so no copy changes a maximum (nor, at a position past the plane, an index);
    unlike -inf or a lowest-value constant, it stays in the input's range, which HTP holds and a quantized model
    calibrates (qnnx-export's maxpool_padded_input pads a MaxPool the same way)."""
    rank = len(shape)
    shape = list(shape)
    least: ir.Value | None = None
    for axis in range(1, rank):
        i = axis - 1
        reach = (out[i] - 1) * window.strides[i] + window.dilations[i] * (window.kernel[i] - 1) + 1
        before, after = window.pads[i], max(0, reach - shape[axis] - window.pads[i])
        if not before and not after:
            continue
        if least is None:
            every = t.ints(list(range(rank)), "axes")
            least = t.emit1("ReduceMin", [xv, every], {"keepdims": 1}, dtype=dtype, shape=(1,) * rank)
        parts = []
        for count in (before, None, after):
            if count is None:
                parts.append(xv)
            elif count:
                block = [count if a == axis else s for a, s in enumerate(shape)]
                parts.append(t.emit1("Expand", [least, t.ints(block)], dtype=dtype, shape=tuple(block)))
        shape[axis] += before + after
        xv = t.emit1("Concat", parts, {"axis": axis}, dtype=dtype, shape=tuple(shape))
    return xv
