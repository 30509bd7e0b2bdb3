"""``histc`` of integers converted to float (a router's tokens per expert: ``histc(ids.float(), bins, lo, hi)``).

Counted exactly, on the integers: the integers each bin holds are a contiguous run (the bin of a value never
decreases as the value grows), found on the host by ``torch.histc`` itself over every integer of ``[min, max]``, so
each count is ``(lo_b <= ids) & (ids <= hi_b)`` summed in int32. No float bin edge is computed on the device,
where float16 would move values between bins. ``bins=1`` with ``min == max`` (the range taken from the data)
counts every element: the element count, a constant. Anything else declines: float inputs that are not converted
integers, a range taken from the data with several bins, bounds beyond the integers a float32 holds, and more
elements than a float16 count holds exactly.
"""

from __future__ import annotations

import builtins
import math
from typing import TYPE_CHECKING, Any

import torch

from qnnx_export._fast._nodes import fake
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

_EXACT_FLOAT_INTS = 2**24  # integers a float32 holds exactly: bounds beyond them are declined
_MAX_INTEGERS = 1 << 20  # integers in [min, max] whose bins are found on the host
_MAX_BINS = 4096  # the comparison is elements x bins
_EXACT_COUNT = 2048  # float16 holds every count up to this exactly (the output is float, float16 on HTP)
_CONVERSIONS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _integer_source(x: Any) -> Any:
    """The integer tensor node ``x`` converts to float (``ids.float()``), else None."""
    if getattr(x, "op", None) != "call_function" or x.target not in _CONVERSIONS or not x.args:
        return None
    source = fake(x.args[0])
    if isinstance(source, torch.Tensor) and source.dtype in (torch.int32, torch.int64, torch.int8, torch.uint8):
        return x.args[0]
    return None


def bin_runs(bins: int, low: int, high: int) -> tuple[list[int], list[int]]:
    """The first and last integer of ``[low, high]`` each of ``torch.histc``'s bins holds (first > last: none).

    Raises:
        Declined: A bin's integers are not one contiguous run (never seen: histc's bin grows with the value).
    """
    every = torch.arange(low, high + 1, dtype=torch.float32)
    counts = [int(c) for c in torch.histc(every, bins=bins, min=low, max=high).tolist()]
    if sum(counts) != high - low + 1:
        raise Declined(f"histc over [{low}, {high}] does not count every integer of its range once")
    firsts, lasts, at = [], [], low
    for c in counts:
        firsts.append(at)
        lasts.append(at + c - 1)
        at += c
    # The runs must be the bins: each integer's own histc is one count in its run's bin.
    for b in range(bins):
        for v in {firsts[b], lasts[b]} if counts[b] else ():
            one = torch.histc(torch.tensor([float(v)]), bins=bins, min=low, max=high)
            if int(one[b]) != 1:
                raise Declined(f"histc's bins over [{low}, {high}] are not contiguous runs of integers")
    return firsts, lasts


@handles(aten.histc.default)
def _histc(
    t: Translator, node: Node, x: Node, bins: int = 100, min: float = 0, max: float = 0
) -> ir.Value | torch.Tensor:
    """``histc`` of integer ids converted to float, counted on the integers."""
    val = node.meta["val"]
    source = _integer_source(x)
    if source is None:
        raise Declined("histc of float values (only converted integers are counted exactly: float16 bin edges move)")
    count = math.prod(int(s) for s in fake(x).shape)
    if min == max:
        if bins != 1:
            raise Declined(f"histc with min == max ({min}) and {bins} bins: the bins' range depends on the data")
        return torch.full((1,), float(count), dtype=val.dtype)  # one bin over the data's range holds every element
    if not all(float(v).is_integer() for v in (min, max)) or not min < max:
        raise Declined(f"histc over [{min}, {max}] (integer bounds, min < max, are counted exactly)")
    low, high = int(min), int(max)
    if builtins.max(abs(low), abs(high)) >= _EXACT_FLOAT_INTS or high - low >= _MAX_INTEGERS or bins > _MAX_BINS:
        raise Declined(
            f"histc with {bins} bins over [{low}, {high}] (up to {_MAX_BINS} bins over {_MAX_INTEGERS} integers "
            f"within +-{_EXACT_FLOAT_INTS})"
        )
    if count > _EXACT_COUNT:
        raise Declined(f"histc of {count} elements (counts up to {_EXACT_COUNT} are exact in float16)")
    firsts, lasts = bin_runs(bins, low, high)
    ids_dtype = fake(source).dtype
    # An int64 id beyond int32 saturates on HTP, which keeps it outside [low, high].
    ids = t.emit1("Reshape", [t.value(source), t.ints([count, 1])], dtype=ids_dtype, shape=(count, 1))
    above = t.emit1(
        "GreaterOrEqual",
        [ids, t.initializer(torch.tensor([firsts], dtype=ids_dtype), "bin_first")],
        dtype=torch.bool,
        shape=(count, bins),
    )
    below = t.emit1(
        "LessOrEqual",
        [ids, t.initializer(torch.tensor([lasts], dtype=ids_dtype), "bin_last")],
        dtype=torch.bool,
        shape=(count, bins),
    )
    inside = t.emit1("And", [above, below], dtype=torch.bool, shape=(count, bins))
    hits = t.emit1("Cast", [inside], {"to": int(ir_dtype(torch.int32))}, dtype=torch.int32, shape=(count, bins))
    counts = t.emit1("ReduceSum", [hits, t.ints([0], "axes")], {"keepdims": 0}, dtype=torch.int32, shape=(bins,))
    return t.out("Cast", [counts], {"to": int(ir_dtype(val.dtype))})
