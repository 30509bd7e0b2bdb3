"""Unary elementwise ops: math functions, clamps and activations."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, only_first_output_used
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


# ATen op -> (ONNX op, whether only floating-point inputs are taken): ONNX Floor/Ceil are float-only, and
# onnxruntime 1.32's CPU Relu has no int64 kernel.
_SAME_DTYPE = {
    aten.relu.default: ("Relu", True),
    aten.ceil.default: ("Ceil", True),
    aten.neg.default: ("Neg", False),
    aten.abs.default: ("Abs", False),
}
# Ops PyTorch computes in floating point: an integer or bool input is cast to the output's dtype.
_FLOAT = {
    aten.sigmoid.default: "Sigmoid",
    aten.tanh.default: "Tanh",
    aten.exp.default: "Exp",
    aten.log.default: "Log",
    aten.sqrt.default: "Sqrt",
    aten.reciprocal.default: "Reciprocal",
    aten.sin.default: "Sin",
    aten.cos.default: "Cos",
    aten.erf.default: "Erf",
    aten.atan.default: "Atan",
}


@handles(*_SAME_DTYPE)
def _unary(t: Translator, node: Node, x: Node) -> ir.Value:
    op, float_only = _SAME_DTYPE[node.target]  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload
    if node.meta["val"].dtype != fake(x).dtype:
        raise Declined(f"{node.target} changes dtype")
    if float_only and not fake(x).dtype.is_floating_point:
        raise Declined(f"{node.target} on {fake(x).dtype}")
    return t.out(op, [t.value(x)])


@handles(*_FLOAT)
def _float_unary(t: Translator, node: Node, x: Node) -> ir.Value:
    return t.out(_FLOAT[node.target], [t.operand(x, node.meta["val"].dtype)])  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload


@handles(aten.asin.default, aten.acos.default)
def _asin_acos(t: Translator, node: Node, x: Node) -> ir.Value:
    """``asin(x) = 2 atan(x / (1 + sqrt((1 - x)(1 + x))))`` and ``acos(x) = pi/2 - asin(x)`` from Atan, which QNN HTP
    has (it declines Asin and Acos). The half-angle form never divides by zero on [-1, 1], and ``(1 - x)(1 + x)``
    keeps ``1 - x^2`` exact in float16 near +-1, where the square would lose it. NaN outside [-1, 1], as PyTorch."""
    val = node.meta["val"]
    dtype, shape = val.dtype, tuple(val.shape)

    def emit(op: str, *inputs: ir.Value) -> ir.Value:
        return t.emit1(op, list(inputs), dtype=dtype, shape=shape)

    z, one = t.operand(x, dtype), t.scalar(1, dtype)
    root = emit("Sqrt", emit("Mul", emit("Sub", one, z), emit("Add", one, z)))
    half = emit("Atan", emit("Div", z, emit("Add", one, root)))
    angle = emit("Mul", half, t.scalar(2, dtype))
    if node.target == aten.acos.default:
        angle = emit("Sub", t.scalar(math.pi / 2, dtype), angle)
    outside = t.emit1("Greater", [emit("Abs", z), one], dtype=torch.bool, shape=shape)
    return t.out("Where", [outside, t.scalar(math.nan, dtype), angle])


@handles(aten.rsqrt.default)
def _rsqrt(t: Translator, node: Node, x: Node) -> ir.Value:
    val = node.meta["val"]
    root = t.emit1("Sqrt", [t.operand(x, val.dtype)], dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Reciprocal", [root])


@handles(aten.expm1.default)
def _expm1(t: Translator, node: Node, x: Node) -> ir.Value:
    """``exp(x) - 1``, as torch.onnx writes it (ONNX has no Expm1): near 0 the absolute error is fp16's at 1, which
    is what HTP gives for any value of that scale. Apertus' xIELU activation uses it."""
    val = node.meta["val"]
    e = t.emit1("Exp", [t.operand(x, val.dtype)], dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Sub", [e, t.scalar(1, val.dtype)])


@handles(aten.softplus.default)
def _softplus(t: Translator, node: Node, x: Node, beta: float = 1, threshold: float = 20) -> ir.Value:
    """``softplus(x) = log(1 + exp(beta * x)) / beta`` as ONNX Softplus (rewritten later into the overflow-free form
    HTP computes right). PyTorch returns ``x`` itself where ``beta * x > threshold``, which differs from the exact
    value by at most ``exp(-threshold) / beta`` of a value above ``threshold / beta``: below float32's resolution for
    the default threshold, as torch.onnx also leaves it. A threshold under 15 would show, so it declines."""
    if threshold < 15:
        raise Declined(f"softplus with threshold {threshold} (its linear part would show)")
    val = node.meta["val"]
    shape = tuple(val.shape)
    z = t.operand(x, val.dtype)
    if beta == 1:
        return t.out("Softplus", [z])
    scaled = t.emit1("Mul", [z, t.scalar(beta, val.dtype)], dtype=val.dtype, shape=shape)
    soft = t.emit1("Softplus", [scaled], dtype=val.dtype, shape=shape)
    return t.out("Div", [soft, t.scalar(beta, val.dtype)])


@handles(aten.clamp.default)
def _clamp(t: Translator, node: Node, x: Node, lo: float | None = None, hi: float | None = None) -> ir.Value:
    dtype = node.meta["val"].dtype
    if not all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
        raise Declined("clamp with tensor bounds")
    if lo is not None and hi is not None and lo > hi:
        raise Declined("clamp with min > max")
    return t.out(
        "Clip",
        [
            t.operand(x, dtype),
            t.scalar(lo, dtype) if lo is not None else None,
            t.scalar(hi, dtype) if hi is not None else None,
        ],
    )


@handles(aten.clamp_min.default)
def _clamp_min(t: Translator, node: Node, x: Node, lo: float) -> ir.Value:
    return _clamp(t, node, x, lo, None)


@handles(aten.clamp_max.default)
def _clamp_max(t: Translator, node: Node, x: Node, hi: float) -> ir.Value:
    return _clamp(t, node, x, None, hi)


@handles(aten.hardtanh.default)
def _hardtanh(t: Translator, node: Node, x: Node, lo: float = -1.0, hi: float = 1.0) -> ir.Value:
    return _clamp(t, node, x, lo, hi)


@handles(aten.gelu.default)
def _gelu(t: Translator, node: Node, x: Node, approximate: str = "none") -> ir.Value:
    if approximate not in ("none", "tanh"):
        raise Declined(f"gelu approximate={approximate!r}")
    return t.out("Gelu", [t.value(x)], {"approximate": approximate})


@handles(aten.silu.default)
def _silu(t: Translator, node: Node, x: Node) -> ir.Value:
    val = node.meta["val"]
    sig = t.emit1("Sigmoid", [t.value(x)], dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Mul", [t.value(x), sig])


@handles(aten.leaky_relu.default)
def _leaky_relu(t: Translator, node: Node, x: Node, slope: float = 0.01) -> ir.Value:
    return t.out("LeakyRelu", [t.value(x)], {"alpha": float(slope)})


@handles(aten.hardsigmoid.default)
def _hardsigmoid(t: Translator, node: Node, x: Node) -> ir.Value:
    return t.out("HardSigmoid", [t.value(x)], {"alpha": 1.0 / 6.0, "beta": 0.5})


@handles(aten.hardswish.default)
def _hardswish(t: Translator, node: Node, x: Node) -> ir.Value:
    return t.out("HardSwish", [t.value(x)])


@handles(aten.elu.default)
def _elu(
    t: Translator, node: Node, x: Node, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
) -> ir.Value:
    if scale != 1 or input_scale != 1:
        raise Declined("elu with scale")
    return t.out("Elu", [t.value(x)], {"alpha": float(alpha)})


@handles(aten.celu.default)
def _celu(t: Translator, node: Node, x: Node, alpha: float = 1.0) -> ir.Value:
    """``celu(x, a) = a * elu(x / a)``: the QNN EP declines ONNX's Celu and runs Elu, Mul and Div."""
    if alpha == 0:
        raise Declined("celu with alpha 0")  # PyTorch divides by zero here too
    val = node.meta["val"]
    a = t.scalar(float(alpha), val.dtype)
    scaled = t.emit1("Div", [t.value(x), a], dtype=val.dtype, shape=tuple(val.shape))
    elu = t.emit1("Elu", [scaled], {"alpha": 1.0}, dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Mul", [elu, a])


@handles(aten.log_sigmoid_forward.default)
def _log_sigmoid(t: Translator, node: Node, x: Node) -> tuple[ir.Value, None]:
    """``logsigmoid(x) = min(x, 0) - log(1 + exp(-|x|))`` (its output; the buffer is for the backward pass): the
    exponent is at most 0 and the logarithm's argument in (1, 2], so nothing overflows for any input, where
    ``log(sigmoid(x))`` gives -inf below about -90 in float32 (and below -17 in float16)."""
    if not only_first_output_used(node):
        raise Declined("log_sigmoid_forward with its buffer used")
    val = node.meta["val"][0]
    if not val.dtype.is_floating_point or fake(x).dtype != val.dtype:
        raise Declined(f"log_sigmoid_forward of {fake(x).dtype}")
    dtype, shape = val.dtype, tuple(val.shape)
    xv = t.value(x)

    def emit(op: str, *inputs: ir.Value) -> ir.Value:
        return t.emit1(op, list(inputs), dtype=dtype, shape=shape)

    tail = emit("Exp", emit("Neg", emit("Abs", xv)))
    soft = emit("Log", emit("Add", tail, t.scalar(1.0, dtype)))
    return (emit("Sub", emit("Min", xv, t.scalar(0.0, dtype)), soft), None)
