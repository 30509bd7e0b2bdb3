"""``floor``, and ``floor(i / n)`` of an integer tensor by a positive integer written as integer floor division.

``torch.floor(position_ids / n)`` (Llama 4's and Ministral 3's attention temperature) divides integers in float:
on HTP that quotient is a float16 number, so ``(n - 1) / n`` rounds up to 1 and its floor comes out one step too
high (qnnx-opcheck refuses a Floor of values HTP computes). The quotient of integers is computed on the integers
instead (non-negative numerators only, see ``_floor``), which gives ``floor(i / n)`` exactly, as PyTorch's
float32 quotient floors to for every ``|i| < 2**24 - 1`` (beyond, float32 rounds ``i`` itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from qnnx_export._fast._nodes import fake
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

_MAX_DIVISOR = 2**24  # a divisor float32 holds exactly


def integer_quotient(x: Any) -> tuple[Any, int] | None:
    """``(i, n)`` when ``x`` is the true division ``i / n`` of an integer tensor by a positive integer, else None."""
    if getattr(x, "op", None) != "call_function" or x.target not in (aten.div.Tensor, aten.div.Scalar):
        return None
    if len(x.args) != 2 or x.kwargs:
        return None
    numerator, divisor = x.args
    value = fake(numerator)
    if not isinstance(value, torch.Tensor) or value.dtype not in (torch.int32, torch.int64):
        return None
    if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or not float(divisor).is_integer():
        return None
    if not 0 < divisor < _MAX_DIVISOR:
        return None
    return numerator, int(divisor)


@handles(aten.floor.default)
def _floor(t: Translator, node: Node, x: Node) -> ir.Value:
    """``floor`` of a float tensor (ONNX Floor), or of an integer quotient, computed on the integers."""
    val = node.meta["val"]
    if val.dtype != fake(x).dtype or not val.dtype.is_floating_point:
        raise Declined(f"{node.target} of {fake(x).dtype} to {val.dtype}")
    found = integer_quotient(x)
    if found is None:
        return t.out("Floor", [t.value(x)])
    numerator, n = found
    dtype = fake(numerator).dtype
    shape = tuple(int(s) for s in fake(numerator).shape)
    i = t.value(numerator)
    if n == 1:
        return t.out("Cast", [i], {"to": int(ir_dtype(val.dtype))})
    # Only non-negative integers are divided: ONNX's integer Div truncates (the CPU EP), HTP's floors (measured
    # with onnxruntime-qnn 2.7: -1 / 16384 gives -1 there), and both agree on them. A negative i's floor is
    # -((n - 1 - i) / n).
    negative = t.emit1("Less", [i, t.scalar(0, dtype)], dtype=torch.bool, shape=shape)
    flipped = t.emit1("Sub", [t.scalar(n - 1, dtype), i], dtype=dtype, shape=shape)
    magnitude = t.emit1("Where", [negative, flipped, i], dtype=dtype, shape=shape)
    quotient = t.emit1("Div", [magnitude, t.scalar(n, dtype)], dtype=dtype, shape=shape)
    negated = t.emit1("Sub", [t.scalar(0, dtype), quotient], dtype=dtype, shape=shape)  # HTP has no integer Neg
    floored = t.emit1("Where", [negative, negated, quotient], dtype=dtype, shape=shape)
    return t.out("Cast", [floored], {"to": int(ir_dtype(val.dtype))})
