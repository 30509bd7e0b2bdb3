"""Binary float ops with rules of their own for special values or range: ``fmax``, ``fmin``, ``hypot``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import out_shape
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
