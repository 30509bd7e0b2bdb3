"""Transcendental functions QNN refuses or computes wrongly (Erf, Sinh, Cosh), written out in ops it computes right."""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = ["ErfAsPolynomial", "SinhCoshFromExp"]


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
            clipped = b.op("Clip", b.x, b.const(-_ERF_CLIP), b.const(_ERF_CLIP))
            square = b.op("Mul", clipped, clipped)
            series = b.op("Mul", clipped, b.horner(square, _ERF_SERIES))
            magnitude = b.op("Abs", clipped)
            t = b.op("Reciprocal", b.op("Add", b.op("Mul", magnitude, b.const(_ERF_AS_P)), b.const(1.0)))
            gauss = b.op("Exp", b.op("Mul", square, b.const(-1.0)))  # not Neg: the EP declines it at rank 5
            tail = b.op("Mul", b.op("Mul", t, b.horner(t, _ERF_AS_COEFFS)), gauss)
            far = b.op("Mul", b.op("Sign", clipped), b.op("Sub", b.const(1.0), tail))
            near = b.op("Less", magnitude, b.const(_ERF_SERIES_BELOW), out_dtype=ir.DataType.BOOL)
            return b.finish("Where", near, series, far)

        return self.replace_matched(graph, "qnnx_erf", written_out)


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
