"""Transcendental functions QNN refuses or computes wrongly (Erf, Sinh, Cosh), written out in ops it computes right."""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "DivByZeroEdges",
    "ErfAsPolynomial",
    "GeluWrittenOut",
    "LogDomainEdges",
    "SigmoidWrittenOut",
    "SinhCoshFromExp",
]


# ------------------------------------------------------------------------------------------ Erf, written out

# Beyond |x| = 4, erf(x) is 1 to float32's precision (erf(4) = 1 - 1.5e-8): the input is clipped there, which also
# keeps exp(-x^2) far from Exp's defect range.
_ERF_CLIP = 4.0
# Below |x| = 0.5 the Maclaurin series to x^9 (2/sqrt(pi) * (x - x^3/3 + x^5/10 - x^7/42 + x^9/216)) is within
# 4.2e-7 of erf; from 0.5 up, Abramowitz & Stegun 7.1.26 (within 1.5e-7), whose 1 - tail form would lose small
# values to cancellation near 0.
_ERF_SERIES_BELOW = 0.5
_ERF_SERIES = tuple(2.0 / math.sqrt(math.pi) * c for c in (1.0, -1.0 / 3, 1.0 / 10, -1.0 / 42, 1.0 / 216))
_ERF_AS_P = 0.3275911
_ERF_AS_COEFFS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


class _Elementwise:
    """Builds an elementwise function of ``x`` out of ONNX nodes, for a pass's :data:`Replacement`: constants in
    ``x``'s dtype, nodes with ``x``'s shape, Horner polynomials and the last node in the output's shape. A rank-5 ``x`` is computed on
    its flat view and reshaped back: QNN fails to finalize these ops at rank 5 (QNN_COMMON_ERROR_MEM_ALLOC)."""

    def __init__(self, graph: ir.Graph, names: UniqueNames, node: ir.Node, x: ir.Value) -> None:
        self.graph, self.names, self.node = graph, names, node
        self.dtype = cast(ir.DataType, x.dtype)
        self.nodes: list[ir.Node] = []
        self.original = _graph.static_shape(x)
        self.flat = self.original is not None and len(self.original) == 5
        self.shape = (math.prod(self.original),) if self.flat and self.original else self.original
        self.x = x
        if self.flat:
            target = _graph.add_initializer(graph, names("flat"), np.array(self.shape, dtype=np.int64))
            self.x = _graph.new_value(names("flat_x"), self.dtype, self.shape)
            self.nodes.append(ir.Node("", "Reshape", [x, target], outputs=[self.x]))

    def const(self, value: float) -> ir.Value:
        return _graph.add_initializer(self.graph, self.names("c"), np.array(value, dtype=self.dtype.numpy()))

    def op(self, op_type: str, *inputs: ir.Value, out_dtype: ir.DataType | None = None) -> ir.Value:
        out = _graph.new_value(self.names(op_type.lower()), out_dtype or self.dtype, self.shape)
        self.nodes.append(ir.Node("", op_type, list(inputs), outputs=[out]))
        return out

    def horner(self, z: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
        """``c0 + z * (c1 + z * (... + z * cn))``."""
        acc = self.op("Mul", z, self.const(coeffs[-1]))
        for c in reversed(coeffs[1:-1]):
            acc = self.op("Mul", z, self.op("Add", acc, self.const(c)))
        return self.op("Add", acc, self.const(coeffs[0]))

    def finish(self, op_type: str, *inputs: ir.Value) -> tuple[list[ir.Node], ir.Value]:
        """The replacement: every node built, the last an ``op_type`` of ``inputs`` in the node's output shape."""
        if not self.flat:
            last, out = _graph.one_node_like(self.names, "out", self.node, op_type, list(inputs))
            return [*self.nodes, *last], out
        result = self.op(op_type, *inputs)
        back = _graph.add_initializer(self.graph, self.names("shape"), np.array(self.original, dtype=np.int64))
        reshaped, out = _graph.one_node_like(self.names, "out", self.node, "Reshape", [result, back])
        return [*self.nodes, *reshaped], out


def _float_input(node: ir.Node, op_type: str) -> ir.Value | None:
    x = _graph.op_input(node, op_type)
    return x if x is not None and x.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16) else None


@register(order=125)
class ErfAsPolynomial(QnnPass):
    """Compute a standalone ``Erf`` (one that ``fuse_erf_gelu`` did not fold into a Gelu) from the ops QNN HTP has:
    its Maclaurin series to x^9 below ``|x| = 0.5`` and ``1 - t * p(t) * exp(-x^2)``, ``t = 1 / (1 + 0.3275911|x|)``
    (Abramowitz & Stegun 7.1.26) with x's sign above, on ``x`` clipped to [-4, 4].

    The QNN EP declines Erf ("Operators of type `Erf` are not supported by QNN EP", onnxruntime-qnn 2.7.0), so
    ``torch.erf``, ``erfc`` and a hand-written normal CDF ran on the CPU. Both forms are within 4.2e-7 of erf in
    float64 (3.5e-7 of the output's scale measured on the CPU EP over [-10, 10]), far below float16's resolution; on
    the simulator the rewrite is within 1.4e-3 of the output's scale on [-10, 10], [-1, 1], [-1e-2, 1e-2] and
    [-1e-4, 1e-4] (each branch keeps its relative precision: neither subtracts nearly equal numbers). Infinite
    inputs give +-1 as erf does; a NaN input gives 1 on HTP (the clip reads it as a number) where PyTorch gives
    NaN. Shape classes: ranks 0-5 (a rank-5 input is computed on its flat view: QNN fails to finalize the ops at
    rank 5 with QNN_COMMON_ERROR_MEM_ALLOC).
    """

    name = "erf_as_polynomial"
    defect = "the QNN EP declines a standalone Erf (torch.erf, erfc, a normal CDF ran on the CPU)"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of an Erf node, or None."""
        return _float_input(node, "Erf")

    def rewrite(self, graph: ir.Graph) -> bool:
        def written_out(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            b = _Elementwise(graph, names, node, x)
            parts = _erf_parts(b, b.x)
            return b.finish("Where", parts.near, parts.series, parts.far)

        return self.replace_matched(graph, "qnnx_erf", written_out)


class _ErfParts(NamedTuple):
    """erf(x) as :class:`ErfAsPolynomial` writes it: ``Where(near, series, far)``; ``tail`` is erfc(|x|) (x clipped
    to [-4, 4]), the value ``far`` takes from 1 (``far = sign(x) * (1 - tail)``)."""

    near: ir.Value
    series: ir.Value
    far: ir.Value
    tail: ir.Value


def _erf_parts(b: _Elementwise, x: ir.Value) -> _ErfParts:
    clipped = b.op("Clip", x, b.const(-_ERF_CLIP), b.const(_ERF_CLIP))
    square = b.op("Mul", clipped, clipped)
    series = b.op("Mul", clipped, b.horner(square, _ERF_SERIES))
    magnitude = b.op("Abs", clipped)
    t = b.op("Reciprocal", b.op("Add", b.op("Mul", magnitude, b.const(_ERF_AS_P)), b.const(1.0)))
    gauss = b.op("Exp", b.op("Mul", square, b.const(-1.0)))  # not Neg: the EP declines it at rank 5
    tail = b.op("Mul", b.op("Mul", t, b.horner(t, _ERF_AS_COEFFS)), gauss)
    far = b.op("Mul", b.op("Sign", clipped), b.op("Sub", b.const(1.0), tail))
    near = b.op("Less", magnitude, b.const(_ERF_SERIES_BELOW), out_dtype=ir.DataType.BOOL)
    return _ErfParts(near, series, far, tail)


# ----------------------------------------------------------------------------------------- Gelu, written out

# Where erf(x / sqrt2) is within the tail branch on the negative side, Phi(x) = erfc(|x| / sqrt2) / 2 is read from the
# tail itself: 1 + erf(x / sqrt2) would cancel there and keep only float16's absolute precision near 1.
_PHI_TAIL_BELOW = -_ERF_SERIES_BELOW
# The tanh form's argument: 2 * sqrt(2 / pi) * (x + 0.044715 x^3), so that gelu_tanh(x) = x * sigmoid(argument).
_TANH_GELU_SCALE = 2.0 * math.sqrt(2.0 / math.pi)
_TANH_GELU_CUBIC = 0.044715
_TANH_GELU_X_CAP = 10.0


@register(order=136)
class GeluWrittenOut(QnnPass):
    """Compute ``Gelu`` from ops HTP computes to float16's precision, in place of HTP's own Gelu.

    - ``approximate="none"``: ``x * Phi(x)``, ``Phi(x) = (1 + erf(x / sqrt2)) / 2`` with erf written as
      :class:`ErfAsPolynomial` writes it, and on the negative side of its tail branch ``Phi(x) = erfc(|x| / sqrt2) /
      2`` from the tail itself (no cancellation, so GELU's small negative values keep their relative precision);
    - ``approximate="tanh"``: ``x * sigmoid(v)``, ``v = 2 sqrt(2/pi) (x + 0.044715 x^3)`` (the same function as
      ``x (1 + tanh(v / 2)) / 2``), the sigmoid as ``e / (1 + e)`` below 0 and ``1 / (1 + e)`` above, ``e =
      exp(-|v|)``, ``|v|`` computed from ``min(|x|, 10)`` (where ``e`` is already 0 in float16).

    HTP's Gelu (both approximations, onnxruntime-qnn 2.7.0, soc 60, x in [-8, 8]) is up to 9.8e-3 off at x = 6
    (float16's step there is 3.9e-3), and 1.5e-3 off on [-4, -2], where GELU is at most 0.045 in magnitude (float16
    rounds it to 1.5e-5); its mean error is 1.8e-3. Written out: 2.4e-3 at most, 1.6e-4 on [-4, -2] and 3.8e-4 on
    average. In a model the difference compounds: the 13 Conv1d + GELU layers of a speech feature encoder (SEW,
    UniSpeech) came out 1.1-2.2% of the output's scale off on HTP with its Gelu, against 0.2-0.25% written out and
    0.2% in float16 on the CPU; a stack of transformer MLPs 0.15% against 0.07% (float16: 0.06%). The cost is about
    25 elementwise ops per GELU (14 for the tanh form) where HTP had one, which it may fuse into the MatMul before it.
    Float graphs only: calibrated QDQ graphs keep one Gelu node, which quantizes as one op (the backend leaves this
    pass out of them). Exact in real arithmetic up to erf's 4.2e-7. A rank-5 input is computed on its flat view."""

    name = "gelu_written_out"
    defect = (
        "HTP's Gelu is up to 9.8e-3 off (x = 6) and 1.5e-3 off where GELU is small (x in [-4, -2]), several float16 "
        "steps: in deep convolution stacks the error compounds to percents of the output"
    )

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of a Gelu node of approximation "none" or "tanh", or None."""
        x = _float_input(node, "Gelu")
        return x if x is not None and _gelu_approximation(node) in ("none", "tanh") else None

    def rewrite(self, graph: ir.Graph) -> bool:
        def written_out(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            b = _Elementwise(graph, names, node, x)
            if _gelu_approximation(node) == "tanh":
                # |v| from |x| capped at 10, where |v| reaches 87: exp(-87) is 0 in float16 and HTP's Exp is right
                # down to -88 (below, it returns +-131008), and the cubic cannot overflow (an overflowed product on
                # HTP does not keep its sign). The sign comes from x, which v's has.
                magnitude = b.op("Min", b.op("Abs", b.x), b.const(_TANH_GELU_X_CAP))
                cubic = b.op("Mul", b.op("Mul", magnitude, magnitude), b.const(_TANH_GELU_SCALE * _TANH_GELU_CUBIC))
                v = b.op("Mul", magnitude, b.op("Add", cubic, b.const(_TANH_GELU_SCALE)))
                decay, above = _logistic_parts(b, v)
                negative = b.op("Less", b.x, b.const(0.0), out_dtype=ir.DataType.BOOL)
                phi = b.op("Where", negative, b.op("Mul", decay, above), above)
                return b.finish("Mul", b.x, phi)
            z = b.op("Mul", b.x, b.const(1.0 / math.sqrt(2.0)))
            parts = _erf_parts(b, z)
            erf = b.op("Where", parts.near, parts.series, parts.far)
            upper = b.op("Add", b.op("Mul", erf, b.const(0.5)), b.const(0.5))
            lower = b.op("Mul", parts.tail, b.const(0.5))
            in_tail = b.op("Less", z, b.const(_PHI_TAIL_BELOW), out_dtype=ir.DataType.BOOL)
            return b.finish("Mul", b.x, b.op("Where", in_tail, lower, upper))

        return self.replace_matched(graph, "qnnx_gelu", written_out)


@register(order=162)
class SigmoidWrittenOut(QnnPass):
    """Compute ``Sigmoid`` as ``e / (1 + e)`` below 0 and ``1 / (1 + e)`` from 0 up, ``e = exp(-min(|x|, 87))``, in
    place of HTP's own Sigmoid (and so SiLU, ``x * sigmoid(x)``, which qnnx-export writes with a Sigmoid).

    HTP's Sigmoid keeps an absolute error of 4e-4 to 8e-4 over the whole line (onnxruntime-qnn 2.7.0, soc 60):
    where the sigmoid is small it is not even the right magnitude (sigmoid(-10) = 4.5e-5 came back 3.6e-4 off, and
    SiLU on [-8, -4], at most 0.07 in magnitude, 3.8e-3 off). Written out, each side keeps float16's relative
    precision (2e-3 of the value at most, 1e-5 absolute below -8). In a model the difference compounds: 8 layers of
    Conv2d + BatchNorm + SiLU came out 1.1% of the output's scale off with HTP's Sigmoid, 0.29% written out (eager
    PyTorch in float16: 0.28%), and a tiny MobileViT-v2 3.7% against 0.62% (float16: 0.89%). It runs after the
    passes that read a Sigmoid's form (``logsigmoid_to_softplus``, the domain-edge passes, which know it to be
    non-negative). The cost is 8 elementwise ops where HTP had one. Float graphs only (the backend leaves it out of
    calibrated QDQ graphs). Exact in real arithmetic; ``min(|x|, 87)`` changes nothing in float16 and keeps the
    Exp where HTP computes it right. A rank-5 input is computed on its flat view."""

    name = "sigmoid_written_out"
    defect = (
        "HTP's Sigmoid is about 6e-4 off everywhere, several times its value where it is small (sigmoid(-10) came "
        "back 3.6e-4 off): SiLU's error compounds through convolution stacks to percents of the output"
    )

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of a Sigmoid node, or None."""
        return _float_input(node, "Sigmoid")

    def rewrite(self, graph: ir.Graph) -> bool:
        def written_out(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            b = _Elementwise(graph, names, node, x)
            decay, above = _logistic_parts(b, b.op("Min", b.op("Abs", b.x), b.const(-_graph.EXP_FLOOR)))
            negative = b.op("Less", b.x, b.const(0.0), out_dtype=ir.DataType.BOOL)
            return b.finish("Where", negative, b.op("Mul", decay, above), above)

        return self.replace_matched(graph, "qnnx_sigmoid", written_out)


def _logistic_parts(b: _Elementwise, magnitude: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(e, 1 / (1 + e))`` with ``e = exp(-magnitude)``, ``magnitude >= 0``: sigmoid(-m) = e / (1 + e) and
    sigmoid(m) = 1 / (1 + e), neither losing a small value to a difference."""
    decay = b.op("Exp", b.op("Mul", magnitude, b.const(-1.0)))
    return decay, b.op("Reciprocal", b.op("Add", decay, b.const(1.0)))


def _gelu_approximation(node: ir.Node) -> str:
    attr = node.attributes.get("approximate")
    return "none" if attr is None else str(attr.as_string())


# Not written out: Asin and Acos (declined by the QNN EP). Through HTP's Atan and Sqrt (asin(x) = 2 atan(x / (1 +
# sqrt((1 - x)(1 + x)))), acos as 2 atan(sqrt(..) / (1 +- x))) they are within 2.4e-3 of the output's scale on
# [-1, 1], but an input outside [-1, 1] gives a number where PyTorch gives NaN (HTP's Sqrt of a negative number
# returned -2e-4 or 131008), asin of [-1e-3, 1e-3] is 0.20 of its scale off (HTP's Atan is about 1e-4 off near 0)
# and acos of [0.99, 1] 0.16 off (onnxruntime-qnn 2.7.0, soc 60). Atanh, Asinh and Acosh lose small values to
# log(1 + ..) in float16 the same way.

# ------------------------------------------------------------------------------------ Sinh and Cosh from Exp

# sinh's Maclaurin series to x^9 is within 1.2e-11 of it below |x| = 0.5; from there up, e^|x|/2 - e^-|x|/2 loses
# at most a factor 2.6 of its precision to the subtraction.
_SINH_SERIES_BELOW = 0.5
_SINH_SERIES = (1.0, 1.0 / 6, 1.0 / 120, 1.0 / 5040, 1.0 / 362880)


@register(order=126)
class SinhCoshFromExp(QnnPass):
    """Compute ``Cosh(x)`` as ``exp(|x| - ln 2) + exp(-|x| - ln 2)`` and ``Sinh(x)`` as ``sign(x)`` times the
    difference of the same two, or as its Maclaurin series to x^9 below ``|x| = 0.5``.

    The QNN EP declines Sinh and Cosh ("Operators of type `Sinh` are not supported by QNN EP", onnxruntime-qnn
    2.7.0). Halving inside the exponential (``- ln 2``) keeps ``e^|x| / 2`` in float16's range wherever the result
    is (cosh(11.5) = 49402 is right; ``(e^x + e^-x) / 2`` would saturate e^x at 65504 first), and the series keeps
    sinh's relative precision near 0, where the difference of two exponentials near 1 would cancel. Exact in real
    arithmetic up to the series' 1.2e-11. Shape classes: ranks 0-5 (a rank-5 input on its flat view).
    """

    name = "sinh_cosh_from_exp"
    defect = "the QNN EP declines Sinh and Cosh (torch.sinh, torch.cosh ran on the CPU)"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of a Sinh or Cosh node, or None."""
        return _float_input(node, "Sinh") or _float_input(node, "Cosh")

    def rewrite(self, graph: ir.Graph) -> bool:
        def written_out(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            b = _Elementwise(graph, names, node, x)
            magnitude = b.op("Abs", b.x)
            half_ln = b.const(math.log(2.0))
            grow = b.op("Exp", b.op("Sub", magnitude, half_ln))
            decay = b.op("Exp", b.op("Sub", b.op("Mul", magnitude, b.const(-1.0)), half_ln))
            if node.op_type == "Cosh":
                return b.finish("Add", grow, decay)
            far = b.op("Mul", b.op("Sign", b.x), b.op("Sub", grow, decay))
            series = b.op("Mul", b.x, b.horner(b.op("Mul", b.x, b.x), _SINH_SERIES))
            near = b.op("Less", magnitude, b.const(_SINH_SERIES_BELOW), out_dtype=ir.DataType.BOOL)
            return b.finish("Where", near, series, far)

        return self.replace_matched(graph, "qnnx_sinh_cosh", written_out)


# ------------------------------------------------------------------- Log and Div at the edges of their domains

# Ops whose output is never negative, for any input.
_NONNEGATIVE = frozenset({"Abs", "Exp", "Relu", "ReduceSumSquare", "Sigmoid", "Softmax", "Softplus", "Sqrt"})


def _const_above(value: ir.Value | None, floor: float) -> bool:
    """A constant whose every element is above ``floor`` in float16 (HTP's arithmetic)."""
    array = _graph.const_array(value)
    return array is not None and array.size > 0 and bool(np.all(array.astype(np.float16) > floor))


def _nonnegative(value: ir.Value | None) -> bool:
    node = value.producer() if value is not None else None
    if node is None:
        array = _graph.const_array(value)
        return array is not None and bool(np.all(array >= 0))
    if node.op_type in _NONNEGATIVE:
        return True
    if node.op_type == "Mul" and len(node.inputs) == 2 and node.inputs[0] is node.inputs[1]:
        return True  # a square
    return node.op_type in ("ReduceMean", "ReduceSum") and _nonnegative(node.inputs[0])


def _above(value: ir.Value | None, floor: float = 0.0) -> bool:
    """Whether ``value`` is above ``floor`` (>= 0) wherever it is computed in float16, by its producer's form alone:
    a constant above it; a non-negative value plus a constant above it (``var + eps``); the square root of a value
    above ``floor**2``; ``max(x, c)`` or ``clip(x, c, ...)`` with ``c`` above it; a softmax denominator
    ``sum(exp(x - max(x)))`` (at least 1). Anything else (a bare ``exp``, which underflows to 0) is not known to be."""
    node = value.producer() if value is not None else None
    if node is None:
        return _const_above(value, floor)
    ins = list(node.inputs)
    if node.op_type == "Add" and len(ins) == 2:
        return any(_const_above(v, floor) for v in ins) and all(_nonnegative(v) for v in ins)
    if node.op_type == "Sqrt":
        return _above(ins[0], floor * floor)
    if node.op_type == "Max":
        return any(_const_above(v, floor) for v in ins)
    if node.op_type == "Clip":
        return len(ins) > 1 and _const_above(ins[1], floor)
    if node.op_type == "ReduceSum" and ins and ins[0] is not None and floor < 1.0:
        exp = ins[0].producer()
        shift = _graph.input_producer(exp) if exp is not None and _graph.is_op(exp, "Exp") else None
        top = _graph.input_producer(shift, 1) if shift is not None and _graph.is_op(shift, "Sub") else None
        return (
            top is not None
            and shift is not None
            and _graph.is_op(top, "ReduceMax")
            and top.inputs[0] is shift.inputs[0]
        )
    return False


_GUARDED = "qnnx_log_edges"  # the prefix of the names this pass writes


@register(order=137)
class LogDomainEdges(QnnPass):
    """Compute ``Log(x)`` as ``Where(x < 0, NaN, Where(x > 0, Log(x), -inf))``: ``-inf`` at 0 and NaN below, as
    IEEE arithmetic (and PyTorch) gives.

    QNN HTP's Log returns ordinary numbers there: ``log(0)`` is -7.625 (``ln 2^-11``), ``log2(0)`` -11, ``log1p(-1)``
    -7.625, and the log of a negative number a finite number such as -9.4 or -19 (onnxruntime-qnn 2.7.0, soc 60).
    A binary cross-entropy with a prediction of 0 came back 7.625 where PyTorch clamps the log to -100 and gives 100,
    and ``p * log(p)`` gave -0 at p = 0 where PyTorch gives NaN; a square that underflows float16 (``(1e-4)^2``) fed
    Log a 0 and read -7.6 for -18.4. HTP keeps an infinite or NaN constant through ``Where``: the edge values are
    exact, later ops treat ``-inf`` as PyTorch does (a clamp to -100 gives -100), and one that reaches an output is
    caught by the backend's per-call check, which recomputes the call in PyTorch. Positive inputs get ``Log(x)``
    itself. A Log read only by a Mul or Div by a positive scalar constant (``log10``, ``log2``) gets its edges after
    that scaling, which would otherwise bring HTP's stand-ins back within float16's range (``log10(0)`` read -28464).
    A Log of a value known to be positive (``1 + exp(..)``, ``sum(exp(x - max))``) is left alone. Shape
    classes: ranks 0-5 (a rank-5 input is computed on its flat view).
    """

    name = "log_domain_edges"
    defect = "QNN HTP's Log gives finite numbers (-7.6 for log(0)) where PyTorch gives -inf or NaN (silent)"

    def match(self, node: ir.Node) -> tuple[ir.Value, str, ir.Value | None] | None:
        """For a Log whose input is not known to be positive and that this pass did not write: its float input and
        how its value is scaled, ``("", None)`` or, when the Log's one reader is a Mul or Div of it by a positive
        scalar constant (``log10``, ``log2``), that node's op and constant, matched on that node instead; or
        None."""
        if node.op_type in ("Mul", "Div") and len(node.inputs) == 2:
            log = node.inputs[0].producer() if node.inputs[0] is not None else None
            if log is None or _scale_of(log) is not node:
                return None
            found = self._unguarded(log)
            return None if found is None else (found, node.op_type, node.inputs[1])
        found = self._unguarded(node)
        if found is None or _scale_of(node) is not None:
            return None
        return found, "", None

    @staticmethod
    def _unguarded(node: ir.Node) -> ir.Value | None:
        x = _float_input(node, "Log")
        if x is None or _above(x) or (node.outputs[0].name or "").startswith(_GUARDED):
            return None
        return x

    def rewrite(self, graph: ir.Graph) -> bool:
        def guarded(
            names: UniqueNames, node: ir.Node, found: tuple[ir.Value, str, ir.Value | None]
        ) -> tuple[list[ir.Node], ir.Value]:
            x, scale_op, scale = found
            b = _Elementwise(graph, names, node, x)
            zero = b.const(0.0)
            positive = b.op("Greater", b.x, zero, out_dtype=ir.DataType.BOOL)
            log = b.op("Log", b.x)
            if scale is not None:
                # The edges go after the scaling: a division by ln(10) would bring HTP's stand-ins for -inf and NaN
                # (65536, 98304) back within float16's range, where no check sees them.
                log = b.op(scale_op, log, scale)
            # Each Where picks between a computed value and one constant: HTP then passes the constant's infinity
            # or NaN through exactly (a Where of two such constants gave 98304 for NaN).
            edge = b.op("Where", positive, log, b.const(-math.inf))
            return b.finish("Where", b.op("Less", b.x, zero, out_dtype=ir.DataType.BOOL), b.const(math.nan), edge)

        return self.replace_matched(graph, _GUARDED, guarded)


def _scale_of(log: ir.Node) -> ir.Node | None:
    """The one reader of ``log``'s output when it is a Mul or Div of it (first operand) by a positive scalar constant
    (the Log stays a graph output otherwise, so the edges cannot move past the scaling)."""
    out = log.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    reader = uses[0].node
    if reader.op_type not in ("Mul", "Div") or len(reader.inputs) != 2 or reader.inputs[0] is not out:
        return None
    c = _graph.const_array(reader.inputs[1])
    return reader if c is not None and c.size == 1 and bool(np.all(c > 0)) else None


_DIV_GUARDED = "qnnx_div_edges"  # the prefix of the names this pass writes
# HTP divides as a * (1 / b), and 1 / b saturates at 65504 below |b| = 1 / 65504: the quotient is then wrong
# (1e-6 / 1e-6 gave 0.066). Below 2^-16 both operands are scaled by 2^14 first, which keeps every float16 divisor
# (down to its smallest subnormal, 6e-8) above 9.8e-4; a dividend that overflows then has a quotient beyond
# float16's range anyway.
_SMALL_DIVISOR = 2.0**-16
_DIVISOR_SCALE = 2.0**14


@register(order=161)
class DivByZeroEdges(QnnPass):
    """Compute ``a / b`` with a divisor that may be 0 or tiny as ``Where(b == 0, e, q)``: ``e`` is NaN for ``a == 0``
    and ``+-inf`` with ``a``'s sign otherwise, as IEEE arithmetic (and PyTorch) gives, and ``q`` is ``a / b``, or
    ``(a * 2^14) / (b * 2^14)`` where ``|b| < 2^-16``.

    QNN HTP divides as ``a * (1 / b)`` with the reciprocal saturated at 65504: ``0 / 0`` gives 0 where PyTorch gives
    NaN (a masked mean over an all-zero mask came back 0), ``a / 0`` about +-65504, and any divisor below
    ``1 / 65504`` in magnitude a wrong quotient (``1e-6 / 1e-6`` gave 0.066, ``1e-3 / 1e-6`` 65.5 for 1000)
    (onnxruntime-qnn 2.7.0, soc 60). HTP keeps an infinite or NaN constant through ``Where`` (or writes it beyond
    float16's range): a NaN or infinity that reaches an output is caught by the backend's per-call check, which
    recomputes the call in PyTorch. A divisor of -0 gives ``a``'s sign, not the opposite one. Divisors known to stay
    at or above ``2^-16`` in magnitude are left alone: such constants, ``sqrt(var + eps)``, ``max(norm, eps)``, a
    softmax denominator; a constant divisor with small but no zero elements is scaled and nothing else. Shape
    classes: ranks 0-4 with broadcasting; a rank-5 Div is left as it is (QNN fails to finalize comparisons at rank
    5).
    """

    name = "div_by_zero_edges"
    defect = "QNN HTP's Div gives 0 for 0 / 0, +-65504 for a / 0 and wrong quotients below |b| = 1/65504 (silent)"

    def match(self, node: ir.Node) -> tuple[ir.Value, ir.Value, bool] | None:
        """The float dividend and divisor of a Div whose divisor may be 0 or below ``2^-16`` in magnitude, that
        this pass did not write, of rank at most 4, and whether the divisor is a constant without zeros; or None."""
        a = _float_input(node, "Div")
        if a is None or len(node.inputs) != 2 or (node.outputs[0].name or "").startswith(_DIV_GUARDED):
            return None
        b = node.inputs[1]
        divisor = _graph.const_array(b)
        if b is None or _above(b, _SMALL_DIVISOR):
            return None
        magnitude = None if divisor is None else np.abs(divisor.astype(np.float16))
        if magnitude is not None and magnitude.size and bool(np.all(magnitude >= _SMALL_DIVISOR)):
            return None
        shape = node.outputs[0].shape
        if shape is None or len(shape) > 4:
            return None
        return a, b, magnitude is not None and bool(np.all(magnitude > 0))

    def rewrite(self, graph: ir.Graph) -> bool:
        def guarded(
            names: UniqueNames, node: ir.Node, found: tuple[ir.Value, ir.Value, bool]
        ) -> tuple[list[ir.Node], ir.Value]:
            a, b, const_nonzero = found
            dtype = cast(ir.DataType, a.dtype)
            nodes: list[ir.Node] = []

            def const(value: float | np.ndarray) -> ir.Value:
                return _graph.add_initializer(graph, names("c"), np.asarray(value, dtype=dtype.numpy()))

            def op(op_type: str, like: ir.Value, *inputs: ir.Value, out_dtype: ir.DataType | None = None) -> ir.Value:
                out = _graph.new_value(names(op_type.lower()), out_dtype or dtype, _graph.static_shape(like))
                nodes.append(ir.Node("", op_type, list(inputs), outputs=[out]))
                return out

            if const_nonzero:  # a constant divisor with small elements: scale both, nothing can be 0
                divisor = cast(np.ndarray, _graph.const_array(b)).astype(np.float64) * _DIVISOR_SCALE
                scaled = op("Mul", a, a, const(_DIVISOR_SCALE))
                last, out = _graph.one_node_like(names, "out", node, "Div", [scaled, const(divisor)])
                return [*nodes, *last], out
            zero, boolean, scale = const(0.0), ir.DataType.BOOL, const(_DIVISOR_SCALE)
            small = op("Less", b, op("Abs", b, b), const(_SMALL_DIVISOR), out_dtype=boolean)
            rescaled = op("Div", node.outputs[0], op("Mul", a, a, scale), op("Mul", b, b, scale))
            quotient = op("Where", node.outputs[0], small, rescaled, op("Div", node.outputs[0], a, b))
            signed = op("Where", a, op("Less", a, a, zero, out_dtype=boolean), const(-math.inf), const(math.inf))
            edge = op("Where", a, op("Equal", a, a, zero, out_dtype=boolean), const(math.nan), signed)
            at_zero = op("Equal", b, b, zero, out_dtype=boolean)
            last, out = _graph.one_node_like(names, "out", node, "Where", [at_zero, edge, quotient])
            return [*nodes, *last], out

        return self.replace_matched(graph, _DIV_GUARDED, guarded)
