"""Binary elementwise ops: arithmetic, comparisons, logic, and the selections where, masked_fill, triu and tril."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis, out_shape
from qnnx_export._fast._ops_rounding import rounded_division
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Operand, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

# clamp_min/clamp_max with a tensor bound are maximum/minimum: the same broadcast, promotion and NaN propagation.
_ARITHMETIC = {
    aten.mul.Tensor: "Mul",
    aten.mul.Scalar: "Mul",
    aten.maximum.default: "Max",
    aten.minimum.default: "Min",
    aten.clamp_min.Tensor: "Max",
    aten.clamp_max.Tensor: "Min",
}
_ADD_SUB = {aten.add.Tensor: "Add", aten.add.Scalar: "Add", aten.sub.Tensor: "Sub", aten.sub.Scalar: "Sub"}
# ATen comparison (its Tensor and Scalar overloads) -> ONNX comparison; ne is Not(Equal).
_COMPARISONS = {
    aten.eq: "Equal",
    aten.ne: "Equal",
    aten.lt: "Less",
    aten.le: "LessOrEqual",
    aten.gt: "Greater",
    aten.ge: "GreaterOrEqual",
}
_LOGICAL = {aten.logical_and.default: "And", aten.logical_or.default: "Or", aten.logical_xor.default: "Xor"}
_BITWISE = {aten.bitwise_and.Tensor: "And", aten.bitwise_or.Tensor: "Or", aten.bitwise_xor.Tensor: "Xor"}


def _no_bool(node: Node, dtype: torch.dtype) -> None:
    """Decline ``node`` when it computes on bool tensors."""
    # ONNX Add/Sub/Mul/Max/Min, Less/Greater and onnxruntime 1.32's CPU Where have no bool kernel: the model
    # would not load, so let torch.onnx (which writes And/Or/casts for some of them) take the graph.
    if dtype == torch.bool:
        raise Declined(f"{node.target} on bool tensors")


@handles(*_ARITHMETIC)
def _arithmetic(t: Translator, node: Node, a: Operand, b: Operand, **kwargs: object) -> ir.Value:
    if kwargs:
        raise Declined(f"{node.target} with {kwargs}")
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    return t.out(_ARITHMETIC[node.target], [t.operand(a, dtype), t.operand(b, dtype)])  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload


def _add_or_sub(op: str, t: Translator, node: Node, a: Operand, b: Operand, alpha: float) -> ir.Value:
    """``a + alpha * b`` (op "Add") or ``a - alpha * b`` (op "Sub")."""
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    rhs = t.operand(b, dtype)
    if alpha != 1:
        if not isinstance(b, (int, float)):
            rhs = t.emit1("Mul", [rhs, t.scalar(alpha, dtype)], dtype=dtype, shape=tuple(fake(b).shape))
        else:
            rhs = t.scalar(b * alpha, dtype)
    return t.out(op, [t.operand(a, dtype), rhs])


@handles(*_ADD_SUB)
def _add_sub(t: Translator, node: Node, a: Operand, b: Operand, alpha: float = 1) -> ir.Value:
    return _add_or_sub(_ADD_SUB[node.target], t, node, a, b, alpha)  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload


@handles(aten.rsub.Scalar)
def _rsub(t: Translator, node: Node, a: Operand, b: Operand, alpha: float = 1) -> ir.Value:
    if alpha != 1:
        raise Declined("rsub alpha")
    return _add_or_sub("Sub", t, node, b, a, 1)


@handles(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode)
def _div(t: Translator, node: Node, a: Operand, b: Operand, *, rounding_mode: str | None = None) -> ir.Value:
    if rounding_mode is not None:
        return rounded_division(t, node, a, b, rounding_mode=rounding_mode)
    dtype = node.meta["val"].dtype
    if not dtype.is_floating_point:
        raise Declined("integer division")
    return t.out("Div", [t.operand(a, dtype), t.operand(b, dtype)])


@handles(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor)
def _pow(t: Translator, node: Node, x: Operand, exponent: Operand) -> ir.Value:
    dtype = node.meta["val"].dtype
    if not dtype.is_floating_point:
        raise Declined("integer pow")
    if isinstance(exponent, (int, float)) and exponent == 2:
        xv = t.operand(x, dtype)
        return t.out("Mul", [xv, xv])
    return t.out("Pow", [t.operand(x, dtype), t.operand(exponent, dtype)])


@handles(*(overload for packet in _COMPARISONS for overload in (packet.Tensor, packet.Scalar)))
def _compare(t: Translator, node: Node, a: Operand, b: Operand) -> ir.Value:
    packet = node.target.overloadpacket  # type: ignore[union-attr]  # fx types Node.target loosely; here it is an OpOverload
    op, negate = _COMPARISONS[packet], packet is aten.ne
    dtype = torch.result_type(fake(a), fake(b))
    if op != "Equal":
        _no_bool(node, dtype)
    inputs = [t.operand(a, dtype), t.operand(b, dtype)]
    if not negate:
        return t.out(op, inputs)
    eq = t.emit1(op, inputs, dtype=torch.bool, shape=out_shape(node))
    return t.out("Not", [eq])


def _truth(t: Translator, x: Operand) -> ir.Value:
    """``x`` as a bool tensor, as PyTorch's logical ops read it: nonzero is true (NaN too). A non-bool tensor is
    ``Not(Equal(x, 0))``: the QNN EP declines a Cast from float to bool (onnxruntime-qnn 2.7.0)."""
    import torch.fx

    if not isinstance(x, torch.fx.Node):
        return t.operand(x, torch.bool)
    val = fake(x)
    if val.dtype == torch.bool:
        return t.value(x)
    zero = t.emit1("Equal", [t.value(x), t.scalar(0, val.dtype)], dtype=torch.bool, shape=tuple(val.shape))
    return t.emit1("Not", [zero], dtype=torch.bool, shape=tuple(val.shape))


@handles(*_LOGICAL, *_BITWISE)
def _logical(t: Translator, node: Node, a: Operand, b: Operand) -> ir.Value:
    """And, or, xor. ``&``, ``|`` and ``^`` only on bool tensors (masks): on integers they are bit operations."""
    if node.target in _BITWISE and (
        any(fake(v).dtype != torch.bool for v in (a, b) if hasattr(v, "meta")) or node.meta["val"].dtype != torch.bool
    ):
        raise Declined(f"{node.target} on non-bool tensors")
    if node.meta["val"].dtype != torch.bool:
        raise Declined(f"{node.target} into {node.meta['val'].dtype}")
    op = _BITWISE[node.target] if node.target in _BITWISE else _LOGICAL[node.target]  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload
    return t.out(op, [_truth(t, a), _truth(t, b)])


@handles(aten.logical_not.default, aten.bitwise_not.default)
def _not(t: Translator, node: Node, x: Node) -> ir.Value:
    """Not. ``~`` only on bool tensors (on integers it is a bit operation); ``logical_not`` of any tensor is
    ``Equal(x, 0)``."""
    if node.meta["val"].dtype != torch.bool:
        raise Declined(f"{node.target} into {node.meta['val'].dtype}")
    if fake(x).dtype == torch.bool:
        return t.out("Not", [t.value(x)])
    if node.target is aten.bitwise_not.default:
        raise Declined("bitwise not on a non-bool tensor")
    return t.out("Equal", [t.value(x), t.scalar(0, fake(x).dtype)])


_ALL_ANY = {
    aten.all.default: "ReduceMin",
    aten.all.dim: "ReduceMin",
    aten.all.dims: "ReduceMin",
    aten.any.default: "ReduceMax",
    aten.any.dim: "ReduceMax",
    aten.any.dims: "ReduceMax",
}


@handles(*_ALL_ANY)
def _all_any(
    t: Translator, node: Node, x: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False
) -> ir.Value:
    """``all`` and ``any``: the least (all) or greatest (any) of the truth values as 0/1 floats, read back as
    ``> 0.5``. Exact: the reductions only pick one of the values 0 and 1 (the QNN EP declines a Cast to bool and
    a bool reduction)."""
    val = node.meta["val"]
    if val.dtype != torch.bool:
        raise Declined(f"{node.target} into {val.dtype}")
    rank = fake(x).dim()
    truth = _truth(t, x)
    if rank == 0:
        return truth
    dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
    axes = sorted(onnx_axis(d, rank) for d in dims) or list(range(rank))
    ones = t.emit1("Cast", [truth], {"to": int(ir_dtype(torch.float32))}, dtype=torch.float32, shape=out_shape(x))
    op = _ALL_ANY[node.target]  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload
    picked = t.emit1(
        op, [ones, t.ints(axes, "axes")], {"keepdims": int(bool(keepdim))}, dtype=torch.float32, shape=out_shape(node)
    )
    return t.out("Greater", [picked, t.scalar(0.5, torch.float32)])


@handles(aten.copysign.Tensor, aten.copysign.Scalar)
def _copysign(t: Translator, node: Node, a: Operand, b: Operand) -> ir.Value:
    """``|a|`` with the sign of ``b``: ``Where(1 / b < 0, -|a|, |a|)``. The reciprocal reads the sign bit of a zero
    (1 / -0.0 is -inf on the CPU EP and HTP's most negative value on the simulator, whose float16 also keeps the
    sign of a value too small for it), which a comparison of ``b`` with 0 would not."""
    val = node.meta["val"]
    if not val.dtype.is_floating_point:
        raise Declined(f"copysign into {val.dtype}")

    def emit(op: str, inputs: list[ir.Value], like: Operand, dtype: torch.dtype = val.dtype) -> ir.Value:
        return t.emit1(op, inputs, dtype=dtype, shape=tuple(fake(like).shape) if hasattr(like, "meta") else ())

    magnitude = emit("Abs", [t.operand(a, val.dtype)], a)
    negated = emit("Mul", [magnitude, t.scalar(-1.0, val.dtype)], a)  # not Neg: the EP declines it at rank 5
    inverse = emit("Reciprocal", [t.operand(b, val.dtype)], b)
    negative = emit("Less", [inverse, t.scalar(0.0, val.dtype)], b, torch.bool)
    return t.out("Where", [negative, negated, magnitude])


@handles(aten.where.self)
def _where(t: Translator, node: Node, cond: Operand, a: Operand, b: Operand) -> ir.Value:
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    return t.out("Where", [t.operand(cond, torch.bool), t.operand(a, dtype), t.operand(b, dtype)])


@handles(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(t: Translator, node: Node, x: Operand, mask: Operand, value: Operand) -> ir.Value:
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    value_v = t.operand(value, dtype) if not isinstance(value, (int, float, bool)) else t.scalar(value, dtype)
    return t.out("Where", [t.operand(mask, torch.bool), value_v, t.operand(x, dtype)])


@handles(aten.triu.default, aten.tril.default)
def _triangle(t: Translator, node: Node, x: Node, diagonal: int = 0) -> ir.Value:
    """``Where(mask, x, 0)`` with the triangle as a constant bool mask over the last two dims.

    The QNN EP declines ONNX's Trilu; a constant mask keeps the op on QNN and is exact: a select, no arithmetic, so
    an inf or NaN outside the triangle still becomes 0 as in PyTorch.
    """
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    shape = out_shape(node)
    if len(shape) < 2:
        raise Declined(f"{node.target} of a rank-{len(shape)} tensor")
    rows, cols = shape[-2:]
    offset = torch.arange(cols)[None, :] - torch.arange(rows)[:, None]  # column index minus row index
    mask = offset >= diagonal if node.target == aten.triu.default else offset <= diagonal
    return t.out("Where", [t.initializer(mask, "triangle"), t.value(x), t.scalar(0, dtype)])


@handles(aten.clamp.Tensor)
def _clamp_tensor(
    t: Translator, node: Node, x: Operand, lo: Operand | None = None, hi: Operand | None = None
) -> ir.Value:
    """``Min(Max(x, lo), hi)``: the QNN EP takes Clip's bounds only as constants. With ``lo > hi`` both give ``hi``."""
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    if lo is None or hi is None:
        op, bound = ("Max", lo) if hi is None else ("Min", hi)
        if bound is None:
            raise Declined("clamp without bounds")
        return t.out(op, [t.operand(x, dtype), t.operand(bound, dtype)])
    shape = tuple(int(d) for d in torch.broadcast_shapes(_shape(x), _shape(lo)))
    low = t.emit1("Max", [t.operand(x, dtype), t.operand(lo, dtype)], dtype=dtype, shape=shape)
    return t.out("Min", [low, t.operand(hi, dtype)])


def _shape(x: Operand) -> tuple[int, ...]:
    v = fake(x)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()
