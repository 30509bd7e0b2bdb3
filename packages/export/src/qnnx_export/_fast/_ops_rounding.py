"""``floor``, ``floor(i / n)`` of an integer tensor by a positive integer written as integer floor division, and
integer division with a rounding mode (``//``, ``torch.div(..., rounding_mode=...)``).

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
    floored = t.emit1("Where", _divide_magnitudes(t, i, shape, shape, dtype, n, "floor"), dtype=dtype, shape=shape)
    return t.out("Cast", [floored], {"to": int(ir_dtype(val.dtype))})


def _divide_magnitudes(
    t: Translator, a: ir.Value, a_shape: tuple[int, ...], shape: tuple[int, ...], dtype: torch.dtype, b: Any, mode: str
) -> list[ir.Value]:
    """The inputs of ``Where(differ, -q, q)``, the integer quotient ``a / b`` rounded by ``mode`` ("trunc" or
    "floor"), ``b`` a nonzero Python integer or a tensor (its fx node), computed by dividing values >= 0 only.

    ONNX's integer Div truncates (the CPU EP); HTP's rounds a negative quotient down when the divisor is a constant
    power of two (onnxruntime-qnn 2.7.0: ``-1 / 16384`` gives -1), and both agree on dividends >= 0. So ``|a|`` is
    divided (the sign-select ``Where(a < 0, k - a, a)``, which qnnx-opcheck proves >= 0; HTP has no integer Neg),
    plus ``|b| - 1`` where the signs differ and the quotient rounds down, and the sign is put back.
    """
    zero = t.scalar(0, dtype)
    negative_a = t.emit1("Less", [a, zero], dtype=torch.bool, shape=a_shape)
    if isinstance(b, int) and b > 0 and mode == "floor":
        # A negative a's floor is -((b - 1 - a) / b): one select gives the dividend.
        flipped = t.emit1("Sub", [t.scalar(b - 1, dtype), a], dtype=dtype, shape=a_shape)
        dividend = t.emit1("Where", [negative_a, flipped, a], dtype=dtype, shape=a_shape)
        magnitude_b, differ = t.scalar(b, dtype), negative_a
    else:
        flipped_a = t.emit1("Sub", [zero, a], dtype=dtype, shape=a_shape)
        dividend = t.emit1("Where", [negative_a, flipped_a, a], dtype=dtype, shape=a_shape)
        if isinstance(b, int):
            magnitude_b = t.scalar(abs(b), dtype)
            differ = negative_a if b > 0 else t.emit1("Not", [negative_a], dtype=torch.bool, shape=a_shape)
            round_up = t.scalar(abs(b) - 1, dtype)
        else:
            b_shape = tuple(int(s) for s in fake(b).shape)
            bv = t.operand(b, dtype)
            negative_b = t.emit1("Less", [bv, zero], dtype=torch.bool, shape=b_shape)
            flipped_b = t.emit1("Sub", [zero, bv], dtype=dtype, shape=b_shape)
            magnitude_b = t.emit1("Where", [negative_b, flipped_b, bv], dtype=dtype, shape=b_shape)
            differ = t.emit1("Xor", [negative_a, negative_b], dtype=torch.bool, shape=shape)
            round_up = t.emit1("Sub", [magnitude_b, t.scalar(1, dtype)], dtype=dtype, shape=b_shape)
        if mode == "floor":
            raised = t.emit1("Add", [dividend, round_up], dtype=dtype, shape=shape)
            dividend = t.emit1("Where", [differ, raised, dividend], dtype=dtype, shape=shape)
    quotient = t.emit1("Div", [dividend, magnitude_b], dtype=dtype, shape=shape)
    negated = t.emit1("Sub", [zero, quotient], dtype=dtype, shape=shape)
    return [differ, negated, quotient]


_DIVIDED_INTS = (torch.int32, torch.int64)


@handles(aten.floor_divide.default)
def _floor_divide(t: Translator, node: Node, a: Any, b: Any) -> ir.Value:
    """``a // b``: :func:`rounded_division` rounding down."""
    return rounded_division(t, node, a, b, rounding_mode="floor")


def rounded_division(t: Translator, node: Node, a: Any, b: Any, *, rounding_mode: str) -> ir.Value:
    """Integer ``a // b`` and ``torch.div(a, b, rounding_mode="trunc" | "floor")``, exact on HTP.

    Only magnitudes are divided (see :func:`_divide_magnitudes`). Float division with a rounding mode is declined:
    PyTorch's float floor division is not ``floor(a / b)`` (``1 // 0.1`` is 9), and HTP's float16 quotient would
    move values across integers anyway.
    """
    dtype = node.meta["val"].dtype
    if rounding_mode not in ("trunc", "floor"):
        raise Declined(f"{node.target} with rounding_mode={rounding_mode!r}")
    if dtype not in _DIVIDED_INTS:
        raise Declined(f"{node.target} on {dtype} (int32 and int64 are translated)")
    if not isinstance(fake(a), torch.Tensor) or isinstance(b, (bool, float)):
        raise Declined(f"{node.target} of a {type(a).__name__} by a {type(b).__name__}")
    if isinstance(b, int) and b == 0:
        raise Declined(f"{node.target} by 0")
    shape = tuple(int(s) for s in node.meta["val"].shape)
    a_shape = tuple(int(s) for s in fake(a).shape)
    return t.out("Where", _divide_magnitudes(t, t.operand(a, dtype), a_shape, shape, dtype, b, rounding_mode))
