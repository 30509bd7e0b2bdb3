"""Numeric-safety rewrites: tests and flags that HTP's fp16 arithmetic would get wrong, made exact."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "ExpInputFloor",
    "FoldScaleIntoGatherTable",
    "L2NormPrescaled",
    "LogSoftmaxUnitAxis",
    "MishAsSoftplus",
    "SafeSoftmaxWithoutInf",
    "SoftmaxScaleAsVector",
    "StableLogSumExp",
]


# ------------------------------------------------------------- safe softmax: the fully-masked test without -inf

# Rows whose maximum is at or below this are "fully masked". HTP has no infinities: a -inf mask value saturates
# near -65504 and survives the addition of any score of magnitude below 32768; real scores never come near it.
_MASKED_ROW_MAX = -32768.0


@register(order=90)
class SafeSoftmaxWithoutInf(QnnPass):
    """Test for fully-masked rows in a safe softmax with ``ReduceMax(x) <= -32768`` instead of ``== -inf``.

    ``aten._safe_softmax`` (what ``scaled_dot_product_attention`` with a mask uses, so Hugging Face's default
    "sdpa" attention) returns 0 for a row whose inputs are all -inf. It is exported as
    ``Where(Equal(ReduceMax(x), -inf), 0, Softmax(x))``, and on QNN HTP, which has no infinities, the test is never
    true: a fully masked row comes back as a uniform average instead of 0 (onnxruntime-qnn 2.7.0). The threshold
    gives the same answer for every row whose finite values stay above -32768, on HTP and on the CPU.
    """

    name = "safe_softmax_without_inf"
    defect = "Equal(x, -inf) is never true on QNN HTP (no infinities): fully masked attention rows come back wrong"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The -inf operand of an Equal(ReduceMax(x), -inf) that selects between 0 and Softmax(x), or None."""
        if not _graph.is_op(node, "Equal") or len(node.inputs) != 2:
            return None
        for stat, limit in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            value = _graph.const_array(limit)
            producer = stat.producer() if stat is not None else None
            if value is None or value.size != 1 or not np.isneginf(value.reshape(-1)[0]):
                continue
            if producer is None or producer.op_type != "ReduceMax":
                continue
            uses = list(node.outputs[0].uses())
            if uses and all(u.node.op_type == "Where" and u.idx == 0 for u in uses):
                return limit
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        def masked(names: UniqueNames, node: ir.Node, limit: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            stat = node.inputs[1] if node.inputs[0] is limit else node.inputs[0]
            # Equal's operands share a dtype; match found the other one -inf.
            dtype = cast(ir.DataType, cast(ir.Value, stat).dtype)
            threshold = _graph.add_initializer(
                graph, names("threshold"), np.array(_MASKED_ROW_MAX, dtype=dtype.numpy())
            )
            return _graph.one_node_like(names, "masked", node, "LessOrEqual", [stat, threshold])

        return self.replace_matched(graph, "qnnx_safe_softmax", masked)


# ------------------------------------------------------------------- LogSoftmax over an axis of one element


def _unfloored_input(node: ir.Node, op_type: str, floored_prefix: str) -> ir.Value | None:
    """The float input of an ``op_type`` node, unless a floor this module wrote (its output named
    ``floored_prefix...``) already computes it; else None."""
    x = _graph.float_op_input(node, op_type)
    producer = x.producer() if x is not None else None
    if producer is not None and (producer.outputs[0].name or "").startswith(floored_prefix):
        return None
    return x


# Where a Softmax's input is floored: above the band where an additive attention mask (float32's lowest, -3.4e38,
# which fp16 saturates to -65504) plus a score lands on HTP, below every real score.
_SOFTMAX_FLOOR = -32768.0


@register(order=92)
class SoftmaxInputFloor(QnnPass):
    """Compute ``Softmax(x)`` as ``Softmax(Max(x, -32768))``.

    Eager attention adds a mask of float32's lowest value to the masked scores. A row whose every key is masked (a
    padding query of a left-padded prompt) is then uniform in eager PyTorch: ``min + s`` is ``min`` for every score.
    On QNN HTP the mask saturates to float16's -65504 and ``-65504 + s`` rounds to a grid of 32, so the row came
    back as a softmax of rounding noise, 0.125 off on 8 keys (onnxruntime-qnn 2.7.0, soc 60); the padding rows'
    keys and values then differed in every later layer, and the first-call check sent the prefill graphs of
    Gemma-2, VaultGemma, GPT-NeoX-Japanese and Llama with eager attention to PyTorch. With the floor every masked score is exactly
    -32768: a fully masked row is uniform as in eager, a partly masked row gives its masked keys exp(-32768 - max)
    = 0 as before. Scores below -32768 change (they are beyond what float16 adds exactly, and HTP saturates them
    anyway). Shape classes: float Softmax of static rank 1-4, any axis; at rank 5 it is left alone (the QNN EP
    refuses a rank-5 Max).
    """

    name = "softmax_input_floor"
    defect = "fully masked attention rows (an additive float32-min mask) come back as a softmax of fp16 rounding noise"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of a Softmax that is not already floored, or None."""
        x = _unfloored_input(node, "Softmax", "qnnx_softmax_floor")
        shape = _graph.static_shape(x)
        if shape is None or len(shape) > 4:
            return None  # the QNN EP refuses a rank-5 Max (the Softmax alone runs there)
        return x

    def rewrite(self, graph: ir.Graph) -> bool:
        def floored(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            dtype = cast(ir.DataType, x.dtype)
            low = _graph.add_initializer(graph, names("min"), np.array(_SOFTMAX_FLOOR, dtype=dtype.numpy()))
            kept = _graph.new_value(names("floor"), dtype, _graph.static_shape(x))
            axis = node.attributes.get_int("axis", -1)
            out = _graph.new_value(names("out"), node.outputs[0].dtype, _graph.static_shape(node.outputs[0]))
            softmax = ir.Node("", "Softmax", [kept], attributes=[ir.AttrInt64("axis", axis)], outputs=[out])
            return [ir.Node("", "Max", [x, low], outputs=[kept]), softmax], out

        return self.replace_matched(graph, "qnnx_softmax", floored)


@register(order=93)
class SoftmaxScaleAsVector(QnnPass):
    """Give a negative scalar factor of a Softmax's input the shape ``[1]``, so that the QNN EP does not fold it.

    The QNN EP fuses ``Softmax(Mul(x, c))``, with ``c`` a float32 constant of rank 0 and the Mul read by the Softmax
    alone, into one HTP Softmax with ``beta = c``. HTP computes that Softmax wrongly for a negative ``c``:
    ``softmax(x * -0.5)`` over the last axis came back 0.4-1.2 of its scale off, at ranks 1-5 (onnxruntime-qnn
    2.7.0, soc 60); over another axis the fused Softmax fails QNN's graph finalize, whatever ``c``. The same factor
    of shape ``[1]`` is not fused, and the Mul then Softmax are right. A positive factor over the last axis is left
    to the fusion, which is right. At ranks 1-4 ``softmax_input_floor``'s Max already stands between the two; a
    Softmax of rank 5 is left alone by that pass, and ``softmax(-x / t)`` of a rank-5 attention came back 0.81 off.
    Shape classes: a float Mul of any rank >= 1 feeding a Softmax, either operand the constant.
    """

    name = "softmax_scale_as_vector"
    defect = "QNN HTP's Softmax fused with a negative scalar factor (beta < 0) is wrong; with another axis it fails"

    def match(self, node: ir.Node) -> tuple[ir.Node, int, np.ndarray] | None:
        """(the Mul, the index of its rank-0 factor, the factor as shape [1]) for a Softmax the QNN EP would fuse
        wrongly with its Mul, or None."""
        x = _graph.float_op_input(node, "Softmax")
        mul = x.producer() if x is not None else None
        if mul is None or not _graph.is_op(mul, "Mul") or len(mul.inputs) != 2:
            return None
        if len(list(x.uses())) != 1 or x.is_graph_output():  # type: ignore[union-attr]  # x is not None here
            return None
        shape = _graph.static_shape(x)
        if not shape:
            return None  # a factor of shape [1] would change the rank of a rank-0 (or unknown) product
        axis = node.attributes.get_int("axis", -1)
        for index, operand in enumerate(mul.inputs):
            value = _graph.const_array(operand)
            if value is None or value.ndim != 0 or value.dtype.kind != "f":
                continue
            if float(value) < 0 or axis not in (-1, len(shape) - 1):
                return mul, index, value.reshape(1)
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        matches = self.matched(graph)
        names = _graph.fresh_names(graph, "qnnx_softmax_scale")
        for _, (mul, index, vector) in matches:
            mul.replace_input_with(index, _graph.add_initializer(graph, names("factor"), vector))
        return bool(matches)


@register(order=100)
class LogSoftmaxUnitAxis(QnnPass):
    """Rewrite ``LogSoftmax`` over an axis of size 1 as ``Sub(x, x)``, the same function.

    Over one element, ``log_softmax(x) = x - log(exp(x)) = 0`` (NaN where ``x`` is infinite or NaN, in PyTorch and
    in ``x - x`` alike). QNN HTP's LogSoftmax returns values between -4 and -9 there instead of 0, with no error
    (onnxruntime-qnn 2.7.0, soc 60; every rank 2-4 and axis position measured), while over longer axes it is right
    and Softmax over a unit axis is right too. Such axes come from a classifier head with one class, a
    ``log_softmax`` over a singleton heads or batch axis, or a reduction with ``keepdim`` before it.
    """

    name = "logsoftmax_unit_axis"
    defect = "LogSoftmax over an axis of size 1 returns -4..-9 on QNN HTP instead of 0 (silent wrong output)"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The input of a LogSoftmax whose axis has size 1, or None."""
        x = _graph.op_input(node, "LogSoftmax")
        shape = _graph.static_shape(x)
        if x is None or shape is None or not shape:
            return None
        axis = node.attributes.get_int("axis", -1)
        if not -len(shape) <= axis < len(shape) or shape[axis] != 1:
            return None
        return x

    def rewrite(self, graph: ir.Graph) -> bool:
        return self.replace_matched(
            graph, "qnnx_logsoftmax", lambda names, node, x: _graph.one_node_like(names, "out", node, "Sub", [x, x])
        )


# ------------------------------------------------------------------ a constant scale folded into a gathered table

# Ops that only move elements: a scalar factor commutes with them.
_MOVES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})


@register(order=20)
class FoldScaleIntoGatherTable(QnnPass):
    """Fold a constant scalar factor applied to gathered rows into the table: ``Mul(Gather(E, ids), c)`` becomes
    ``Gather(E * c, ids)`` (also with reshapes or transposes between the Gather and the Mul).

    QNN HTP computes ``Mul(Gather(E, ids), c)``, with ``E`` a constant table, ``ids`` runtime int32 indices and
    ``c`` a constant of one element, wrongly for many shapes, silently: indices ``[2, 16]`` into a ``[128, 64]``
    table (Gemma's scaled token embedding, ``embed(ids) * sqrt(hidden)``, at batch > 1) give a right first batch
    row and wrong later rows; 1-D indices along axis 1 of a rank-3 table are wrong too; a Reshape between the two
    does not help. Without the Mul every one of those Gathers is right (onnxruntime-qnn 2.7.0, soc_model 60).
    The folded table holds the same products the Mul computes (exact, in the table's dtype).
    """

    name = "fold_gather_scale"
    defect = "a constant table gathered by runtime indices, then scaled by a constant scalar, is wrong on QNN HTP"

    def match(self, node: ir.Node) -> tuple[ir.Node, np.ndarray, ir.Value] | None:
        """``(gather, factor, scaled)`` for a Mul of gathered rows by a one-element constant, or None."""
        if not _graph.is_op(node, "Mul") or len(node.inputs) != 2:
            return None
        for scaled, factor in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            c = _graph.const_array(factor)
            shape = _graph.static_shape(scaled)
            if scaled is None or c is None or c.size != 1 or shape is None or c.ndim > len(shape):
                continue  # a factor of higher rank would broadcast the output to a new rank
            gather = _gathered_table(scaled)
            table = _graph.const_array(gather.inputs[0]) if gather is not None else None
            if gather is not None and table is not None and table.dtype == c.dtype and c.dtype.kind == "f":
                return gather, c, scaled
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_scaled")
        matched = self.matched(graph)
        for mul, (gather, factor, scaled) in matched:
            table = cast(np.ndarray, _graph.const_array(gather.inputs[0]))
            folded = _graph.add_initializer(graph, names("table"), table * factor.reshape(()))
            gather.replace_input_with(0, folded)
            _graph.replace_value(graph, mul.outputs[0], scaled)
        return bool(matched)


def _gathered_table(value: ir.Value) -> ir.Node | None:
    """The Gather of a constant table by runtime indices that ``value`` comes from through element moves alone,
    every value on the way used once (so folding a factor into the table changes nothing else), or None."""
    while True:
        producer = value.producer()
        if (
            producer is None
            or producer.domain not in ("", "ai.onnx")
            or len(value.uses()) != 1
            or value.is_graph_output()
        ):
            return None
        if producer.op_type == "Gather":
            data, indices = [*producer.inputs, None, None][:2]
            if (
                data is None
                or indices is None
                or _graph.const_array(indices) is not None
                or _graph.const_array(data) is None
            ):
                return None
            return producer
        if producer.op_type not in _MOVES or producer.inputs[0] is None:
            return None
        value = producer.inputs[0]


# ------------------------------------------------------------------- L2 norms computed on a prescaled input

# The divisor's floor: the smallest normal float16. A row of zeros stays zero; smaller rows are scaled less.
_L2_FLOOR = 2.0**-14
_L2_MAX_RANK = 4  # at rank 5 the QNN EP declines the rewrite's ReduceMax (and ReduceL2 with keepdims)
_PRESCALED = "qnnx_l2_scaled"  # the name (prefix) of the prescaled input this pass writes


def _reduced_axes(reduce: ir.Node, rank: int) -> tuple[int, ...] | None:
    """The sorted non-negative axes a Reduce* node of input rank ``rank`` reduces: its constant axes input (opset
    18), else its ``axes`` attribute, else every axis; None for runtime axes or ``noop_with_empty_axes``."""
    if reduce.attributes.get_int("noop_with_empty_axes", 0):
        return None
    axes_input = reduce.inputs[1] if len(reduce.inputs) > 1 else None
    if axes_input is not None:
        found = _graph.const_array(axes_input)
        if found is None:
            return None
        listed = [int(a) for a in found.reshape(-1)]
    else:
        listed = list(reduce.attributes.get_ints("axes", []))
    return tuple(sorted({a % rank for a in listed})) if listed else tuple(range(rank))


@dataclass(frozen=True)
class _L2Norm:
    x: ir.Value
    axes: tuple[int, ...]
    keepdims: bool
    reduce: ir.Node  # ReduceL2, or the ReduceSum/ReduceMean of the squares under a Sqrt
    square: ir.Node | None  # the Mul(x, x) or Pow(x, 2) of a root of squares; None for ReduceL2


# Between a reduction of squares and its Sqrt: ops that only reshape or scale by a constant, which commute with the
# prescaling (std's Bessel correction is Mul(n) then Div(n - 1), with a Reshape for keepdim).
_ROOT_PATH_OPS = frozenset({"Mul", "Div", "Reshape", "Squeeze", "Unsqueeze"})


def _single_use(value: ir.Value) -> bool:
    return len(list(value.uses())) == 1 and not value.is_graph_output()


@register(order=105)
class L2NormPrescaled(QnnPass):
    """Compute an L2 norm, or the root of a mean of squares, of ``x`` on ``x / m``, with ``m`` the largest ``|x|``
    over the reduced axes, and scale the result back by ``m``.

    QNN HTP sums squares in float16 and saturates the sum: ``ReduceL2`` of a row returns at most about 362 (the
    square root of HTP's largest float16), so any row whose norm is larger comes back wrong without an error, e.g.
    362 for a true 1102 (elements of about 300 over 16 values), and rows of elements below about 1e-4 lose their
    squares to underflow (a norm of 2.4e-4 for a true 3.7e-4; onnxruntime-qnn 2.7.0, soc 60). The same holds for a
    root of a mean of squares: ``Tensor.std`` of rows of about 300 came back 0.30 of its scale off. Rewritten: the
    ONNX ``ReduceL2`` (``torch.linalg.vector_norm``, ``F.normalize``, ``Tensor.norm``), and a ``Sqrt`` of a
    ``ReduceSum``/``ReduceMean`` of ``x * x`` or ``x ** 2`` reached through constant scalings and reshapes (a
    hand-written norm or RMS, ``std`` with or without its correction, where ``x`` is ``x - mean``). Divided by its
    largest magnitude, every element lies in [-1, 1] and the sum of squares is at most the number of elements
    reduced, so it neither overflows nor loses the large terms; the result is then scaled back, exact in real
    arithmetic (``m`` has a floor of 2^-14 so that a row of zeros stays zero). Shape classes: ranks 1-4, every axis
    set, keepdims or not, with a static input shape, and fewer than 65504 reduced elements
    (``tests/test_pass_conformance.py``). At rank 5 the QNN EP declines the rewrite's ReduceMax (and ReduceL2 with
    keepdims), so a rank-5 norm is left as it is. A variance itself (no root) is not rewritten: where its squares
    overflow, so does the variance, and the backend's output-range check sees that.
    """

    name = "l2_norm_prescaled"
    defect = "QNN HTP saturates a float16 sum of squares: L2 norms above about 362 (and std, RMS) come back wrong"

    def match(self, node: ir.Node) -> _L2Norm | None:
        """The norm's input, axes, keepdims and nodes, for a float ReduceL2 or a root of a reduction of squares."""
        square: ir.Node | None = None
        reduce: ir.Node | None
        if _graph.is_op(node, "ReduceL2"):
            reduce = node
            x = reduce.inputs[0] if reduce.inputs else None
        elif _graph.is_op(node, "Sqrt"):
            reduce = _graph.input_producer(node)
            while reduce is not None and reduce.op_type in _ROOT_PATH_OPS and reduce.domain in ("", "ai.onnx"):
                if not _single_use(reduce.outputs[0]):
                    return None
                if reduce.op_type in ("Mul", "Div"):
                    scalars = [_graph.const_array(v) for v in reduce.inputs[1:2]]
                    if not scalars or scalars[0] is None or scalars[0].size != 1:
                        return None  # only a constant scalar factor (or divisor) commutes with the prescaling
                reduce = _graph.input_producer(reduce)
            if (
                reduce is None
                or reduce.op_type not in ("ReduceSum", "ReduceMean")
                or reduce.domain not in ("", "ai.onnx")
            ):
                return None
            if not _single_use(reduce.outputs[0]):
                return None
            square = _graph.input_producer(reduce)
            if square is None or not square.inputs or not _single_use(square.outputs[0]):
                return None
            if _graph.is_op(square, "Mul") and square.inputs[0] is square.inputs[1]:
                x = square.inputs[0]
            elif _graph.is_op(square, "Pow") and (exponent := _graph.const_array(square.inputs[1])) is not None:
                if exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
                    return None
                x = square.inputs[0]
            else:
                return None
        else:
            return None
        shape = _graph.static_shape(x)
        if x is None or shape is None or not shape or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return None
        if _graph.static_shape(node.outputs[0]) is None:
            return None
        producer = x.producer()
        if producer is not None and (producer.outputs[0].name or "").startswith(_PRESCALED):
            return None  # already this pass's prescaled input
        rank = len(shape)
        axes = _reduced_axes(reduce, rank)
        if axes is None or rank > _L2_MAX_RANK:
            return None
        if math.prod(shape[a] for a in axes) >= 65504:
            return None
        return _L2Norm(x, axes, bool(reduce.attributes.get_int("keepdims", 1)), reduce, square)

    def rewrite(self, graph: ir.Graph) -> bool:
        def prescaled(names: UniqueNames, node: ir.Node, norm: _L2Norm) -> tuple[list[ir.Node], ir.Value]:
            x, dtype = norm.x, cast(ir.DataType, norm.x.dtype)
            shape = cast(tuple[int, ...], _graph.static_shape(x))
            kept = tuple(1 if i in norm.axes else d for i, d in enumerate(shape))
            out_shape = cast(tuple[int, ...], _graph.static_shape(node.outputs[0]))
            axes = _graph.add_initializer(graph, names("axes"), np.array(norm.axes, dtype=np.int64))
            floor = _graph.add_initializer(graph, names("floor"), np.array(_L2_FLOOR, dtype=dtype.numpy()))
            values = _graph.new_values(
                names, dtype, {"abs": shape, "max": kept, "scale": kept, "scaled": shape, "norm": out_shape}
            )
            nodes = [
                ir.Node("", "Abs", [x], outputs=[values["abs"]]),
                ir.Node(
                    "",
                    "ReduceMax",
                    [values["abs"], axes],
                    attributes=[ir.AttrInt64("keepdims", 1)],
                    outputs=[values["max"]],
                ),
                ir.Node("", "Max", [values["max"], floor], outputs=[values["scale"]]),
                ir.Node("", "Div", [x, values["scale"]], outputs=[values["scaled"]]),
            ]
            if norm.square is None:  # ReduceL2 of the prescaled input
                keep = [ir.AttrInt64("keepdims", int(norm.keepdims))]
                nodes.append(
                    ir.Node("", "ReduceL2", [values["scaled"], axes], attributes=keep, outputs=[values["norm"]])
                )
            else:  # the squares of the prescaled input feed the same reduction; a new Sqrt reads its result
                squares = _graph.new_value(names("squares"), dtype, shape)
                nodes.append(ir.Node("", "Mul", [values["scaled"], values["scaled"]], outputs=[squares]))
                norm.reduce.replace_input_with(0, squares)
                nodes.append(ir.Node("", "Sqrt", [node.inputs[0]], outputs=[values["norm"]]))
            factor = values["scale"]
            if kept != out_shape:
                target = _graph.add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
                factor = _graph.new_value(names("factor"), dtype, out_shape)
                nodes.append(ir.Node("", "Reshape", [values["scale"], target], outputs=[factor]))
            out = _graph.new_value(names("out"), dtype, out_shape)
            nodes.append(ir.Node("", "Mul", [values["norm"], factor], outputs=[out]))
            return nodes, out

        return self.replace_matched(graph, "qnnx_l2", prescaled)


# ------------------------------------------------------------------ Exp of very negative inputs, log-sum-exp forms

# exp(11.0898) = 65503.6, float16's largest value. Above it HTP's Exp returns its overflow value 131008 (up to about
# 88, and garbage beyond), which the ops after it do not treat as a large number: 1 / (1 + 131008) reads 131008.
_EXP_CEILING = 11.0898
_FLOORED = "qnnx_exp_floor"  # the name (prefix) of the floored input this pass writes


@register(order=135)
class ExpInputFloor(QnnPass):
    """Compute ``Exp(x)`` as ``Exp(Clip(x, -87, 11.0898))``: 0 below -87 and float16's largest value (65504)
    above ``log(65504)``, as float16 itself would give.

    QNN HTP's Exp returns garbage outside about [-88, 88]: for very negative inputs -131008 (about -100 to -150),
    -0 near -200 and +131008 at -1000 instead of 0; for large positive ones 0 (100-150, 500, 1000) or -131008 (200)
    (onnxruntime-qnn 2.7.0, soc 60). Between 11.09 and 88 it returns 131008, HTP's overflow value, which the ops
    after it do not read as a large number: ``1 / (1 + exp(12))`` came back 131008 instead of 6e-6.
    Every graph that takes the exponential of a large negative number was silently wrong: a hand-written
    ``1 / (1 + exp(-x))`` read 1 for x = -120 and 0 for x = 120, a hand-written softmax returned +-131008, and the
    overflow-free softplus forms (``log(1 + exp(-|x|))``, which this package writes for softplus, logsigmoid and
    mish) gave -34 at |x| ~ 100-120. ``exp(-87)`` is 1.6e-38, below float16's smallest value, and ``exp(11.0898)``
    float16's largest, so the clip keeps every value float16 can hold and saturates the rest, as float16 does (an
    output beyond 65504 is caught by the backend's output-range check; in float32, values above 65504 and below
    1.6e-38 change). Every float Exp is rewritten (after the passes that write Exp nodes);
    Softmax, Sigmoid and Tanh are ops of their own and are right there. Shape classes: any (elementwise).
    """

    name = "exp_input_floor"
    defect = "Exp on QNN HTP returns its overflow value or garbage beyond log(65504), and +-131008 below -100 (silent)"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of an Exp that is not already floored, or None."""
        return _unfloored_input(node, "Exp", _FLOORED)

    def rewrite(self, graph: ir.Graph) -> bool:
        def floored(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            dtype = cast(ir.DataType, x.dtype)
            low = _graph.add_initializer(graph, names("min"), np.array(_graph.EXP_FLOOR, dtype=dtype.numpy()))
            high = _graph.add_initializer(graph, names("max"), np.array(_EXP_CEILING, dtype=dtype.numpy()))
            clipped = _graph.new_value(names("floor"), dtype, _graph.static_shape(x))
            exp_nodes, out = _graph.one_node_like(names, "out", node, "Exp", [clipped])
            return [ir.Node("", "Clip", [x, low, high], outputs=[clipped]), *exp_nodes], out

        return self.replace_matched(graph, "qnnx_exp", floored)


@register(order=101)
class StableLogSumExp(QnnPass):
    """Write ``LogSoftmax`` and ``ReduceLogSumExp`` out as ``x - m - log(sum(exp(x - m)))`` and
    ``m + log(sum(exp(x - m)))``, with ``m`` the maximum over the axis.

    QNN HTP's own LogSoftmax is wrong when a row spans more than about 100: over [-1000, 1000] the row's maximum
    came back -85 instead of 0 and every value about 86 too low, and ReduceLogSumExp of rows in [100, 300] was 0.11
    of its scale off, silently (onnxruntime-qnn 2.7.0, soc 60). Inside, HTP takes the exponential of numbers far below
    the maximum, where its Exp is wrong (see ``exp_input_floor``, which floors the Exp this pass writes). Written out
    with the maximum subtracted and the floor, every row is right. LogSoftmax over an axis of size 1 is left to
    ``logsoftmax_unit_axis``, which runs first. Shape classes: static shapes, any rank and axis the ops accept.
    """

    name = "stable_log_sum_exp"
    defect = "LogSoftmax and ReduceLogSumExp on QNN HTP are wrong for rows that span more than about 100 (silent)"

    def match(self, node: ir.Node) -> tuple[ir.Value, tuple[int, ...], bool] | None:
        """(x, axes, keepdims) of a float LogSoftmax or ReduceLogSumExp with a static input shape, or None."""
        log_softmax = _graph.is_op(node, "LogSoftmax")
        if not log_softmax and not _graph.is_op(node, "ReduceLogSumExp"):
            return None
        x = node.inputs[0] if node.inputs else None
        shape = _graph.static_shape(x)
        if x is None or not shape or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return None
        if _graph.static_shape(node.outputs[0]) is None:
            return None
        rank = len(shape)
        if log_softmax:
            axis = node.attributes.get_int("axis", -1)
            if not -rank <= axis < rank or shape[axis] == 1:
                return None
            return x, (axis % rank,), True
        axes = _reduced_axes(node, rank)
        return None if axes is None else (x, axes, bool(node.attributes.get_int("keepdims", 1)))

    def rewrite(self, graph: ir.Graph) -> bool:
        def stable(
            names: UniqueNames, node: ir.Node, found: tuple[ir.Value, tuple[int, ...], bool]
        ) -> tuple[list[ir.Node], ir.Value]:
            x, axes, _keepdims = found
            dtype = cast(ir.DataType, x.dtype)
            shape = cast(tuple[int, ...], _graph.static_shape(x))
            kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
            out_shape = cast(tuple[int, ...], _graph.static_shape(node.outputs[0]))
            axes_value = _graph.add_initializer(graph, names("axes"), np.array(axes, dtype=np.int64))
            v = _graph.new_values(
                names, dtype, {"max": kept, "shifted": shape, "exp": shape, "sum": kept, "log": kept, "out": out_shape}
            )
            keep1 = [ir.AttrInt64("keepdims", 1)]
            nodes = [
                ir.Node("", "ReduceMax", [x, axes_value], attributes=keep1, outputs=[v["max"]]),
                ir.Node("", "Sub", [x, v["max"]], outputs=[v["shifted"]]),
                ir.Node("", "Exp", [v["shifted"]], outputs=[v["exp"]]),
                ir.Node("", "ReduceSum", [v["exp"], axes_value], attributes=keep1, outputs=[v["sum"]]),
                ir.Node("", "Log", [v["sum"]], outputs=[v["log"]]),
            ]
            if node.op_type == "LogSoftmax":
                nodes.append(ir.Node("", "Sub", [v["shifted"], v["log"]], outputs=[v["out"]]))
                return nodes, v["out"]
            total = _graph.new_value(names("total"), dtype, kept)
            nodes.append(ir.Node("", "Add", [v["max"], v["log"]], outputs=[total]))
            if kept == out_shape:
                return nodes, total
            target = _graph.add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            nodes.append(ir.Node("", "Reshape", [total, target], outputs=[v["out"]]))
            return nodes, v["out"]

        return self.replace_matched(graph, "qnnx_lse", stable)


@register(order=115)
class MishAsSoftplus(QnnPass):
    """Write ``Mish(x)`` as ``x * tanh(softplus(x))``, its definition, so that the softplus takes the overflow-free
    form (``softplus_stable``) and a clipped Exp (``exp_input_floor``).

    QNN HTP's Mish is wrong for large negative inputs, silently: 100, 120, 150 and 500 for x = -100, -120, -150 and
    -500, and -1000 for x = -1000, where Mish is 0 (onnxruntime-qnn 2.7.0, soc 60). Shape classes: any
    (elementwise).
    """

    name = "mish_as_softplus"
    defect = "Mish on QNN HTP returns about -x instead of 0 for inputs below about -100 (silent wrong output)"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The float input of a Mish node, or None."""
        return _graph.float_op_input(node, "Mish")

    def rewrite(self, graph: ir.Graph) -> bool:
        def decomposed(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            shape = _graph.static_shape(x)
            soft = _graph.new_value(names("softplus"), x.dtype, shape)
            tanh = _graph.new_value(names("tanh"), x.dtype, shape)
            mul_nodes, out = _graph.one_node_like(names, "out", node, "Mul", [x, tanh])
            return [
                ir.Node("", "Softplus", [x], outputs=[soft]),
                ir.Node("", "Tanh", [soft], outputs=[tanh]),
                *mul_nodes,
            ], out

        return self.replace_matched(graph, "qnnx_mish", decomposed)
