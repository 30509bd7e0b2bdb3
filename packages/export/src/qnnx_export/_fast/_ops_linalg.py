"""Matrix products: mm, bmm and addmm (a Linear layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Operand, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


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
    attrs = {"transB": trans_b, "alpha": float(alpha), "beta": float(beta)}
    return t.out("Gemm", [t.operand(a, dtype), b_value, t.operand(bias, dtype)], attrs)
