"""Matrix products: mm, bmm, addmm (a Linear layer) and baddbmm (BLOOM's attention scores with ALiBi)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Operand, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


def _shape_of(x: Operand) -> tuple[int, ...]:
    return tuple(x.meta["val"].shape) if isinstance(x, torch.fx.Node) else ()


@handles(aten.mm.default, aten.bmm.default)
def _mm(t: Translator, node: Node, a: Node, b: Node) -> ir.Value:
    if node.meta["val"].dtype not in (torch.float32, torch.float16, torch.int32, torch.int64):
        raise Declined(f"{node.target} on {node.meta['val'].dtype} (no ONNX MatMul for it)")
    return t.out("MatMul", [t.value(a), t.value(b)])


@handles(aten.addmm.default)
def _addmm(
    t: Translator, node: Node, bias: Operand, a: Operand, b: Node, *, beta: float = 1, alpha: float = 1
) -> ir.Value:
    rhs = t.constant_of(b)
    trans_b = 0
    if rhs is not None and rhs.dim() == 2 and not rhs.is_contiguous() and rhs.t().is_contiguous():
        # The weight of a Linear arrives as t(weight): keep the weight as it is and let Gemm transpose.
        b_value = t.initializer(rhs.t(), f"{b.name}_t")
        trans_b = 1
    else:
        b_value = t.value(b)
    dtype = node.meta["val"].dtype
    if alpha == 1 and beta == 1:
        return t.out("Gemm", [t.operand(a, dtype), b_value, t.operand(bias, dtype)], {"transB": trans_b})
    # The QNN EP takes Gemm with alpha 1 and beta 0 or 1 only, so the scales are Muls.
    return _scaled_sum(t, node, "Gemm", [t.operand(a, dtype), b_value], {"transB": trans_b}, bias, beta, alpha)


@handles(aten.baddbmm.default)
def _baddbmm(
    t: Translator, node: Node, bias: Operand, a: Node, b: Node, *, beta: float = 1, alpha: float = 1
) -> ir.Value:
    dtype = node.meta["val"].dtype
    if dtype not in (torch.float32, torch.float16):
        raise Declined(f"baddbmm on {dtype} (only float is translated)")
    return _scaled_sum(t, node, "MatMul", [t.value(a), t.value(b)], {}, bias, beta, alpha)


def _scaled_sum(
    t: Translator,
    node: Node,
    op: str,
    inputs: list[ir.Value],
    attrs: dict[str, int],
    bias: Operand,
    beta: float,
    alpha: float,
) -> ir.Value:
    """``beta * bias + alpha * op(inputs)`` as PyTorch defines it for addmm/baddbmm: with beta 0 the bias is
    ignored, NaN and inf in it included, so it is left out."""
    dtype = node.meta["val"].dtype
    shape = tuple(node.meta["val"].shape)
    if beta == 0 and alpha == 1:
        return t.out(op, inputs, attrs)
    product = t.emit1(op, inputs, attrs, dtype=dtype, shape=shape)
    if beta == 0:
        return t.out("Mul", [product, t.scalar(alpha, dtype)])
    if alpha != 1:
        product = t.emit1("Mul", [product, t.scalar(alpha, dtype)], dtype=dtype, shape=shape)
    if beta == 1:
        return t.out("Add", [product, t.operand(bias, dtype)])
    scaled = t.emit1("Mul", [t.operand(bias, dtype), t.scalar(beta, dtype)], dtype=dtype, shape=_shape_of(bias))
    return t.out("Add", [product, scaled])
