"""Numeric-safety rewrites: tests and flags that HTP's fp16 arithmetic would get wrong, made exact."""

from __future__ import annotations

from typing import cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes._base import QnnPass, register
from qnnx_export._passes._graph import (
    add_initializer,
    const_array,
    fresh_names,
    is_op,
    one_node_like,
    op_input,
    replace_value,
    static_shape,
)

__all__ = [
    "AvgPoolDropUnusedCountIncludePad",
    "FoldScaleIntoGatherTable",
    "LogSoftmaxUnitAxis",
    "SafeSoftmaxWithoutInf",
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
        if not is_op(node, "Equal") or len(node.inputs) != 2:
            return None
        for stat, limit in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            value = const_array(limit)
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
            threshold = add_initializer(graph, names("threshold"), np.array(_MASKED_ROW_MAX, dtype=dtype.numpy()))
            return one_node_like(names, "masked", node, "LessOrEqual", [stat, threshold])

        return self.replace_matched(graph, "qnnx_safe_softmax", masked)


# ----------------------------------------------------------------- AveragePool count_include_pad without pads


@register(order=80)
class AvgPoolDropUnusedCountIncludePad(QnnPass):
    """Clear ``count_include_pad`` on an AveragePool that has no padding and no ceil_mode (it changes nothing there).

    PyTorch's ``avg_pool*d`` defaults to ``count_include_pad=True``, and both exporters write the flag even without
    padding. QNN HTP then averages wrongly at rank 5 when a window is left over at the end of an axis
    (``avg_pool3d(x[2, 3, 3, 4, 4], 2)``: 0.45 of the output's scale off; onnxruntime-qnn 2.7.0), while the same
    pool without the flag is right. With zero pads no window ever holds a padded element, so the rewrite is exact.
    """

    name = "avgpool_count_include_pad"
    defect = "AveragePool with count_include_pad=1 is wrong on QNN HTP at rank 5 even without padding"

    @staticmethod
    def _matches(graph: ir.Graph) -> list[ir.Node]:
        found = []
        for n in graph:
            if not is_op(n, "AveragePool"):
                continue
            # mypy binds onnx_ir's TypeVar default from the `or`'s bool context; the int default is right.
            if not n.attributes.get_int("count_include_pad", 0) or n.attributes.get_int("ceil_mode", 0):  # type: ignore[arg-type]
                continue
            if n.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
                continue
            pads = n.attributes.get_ints("pads", None)
            if pads is None or not any(pads):
                found.append(n)
        return found

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "AveragePool" for n in self._matches(graph)]

    def rewrite(self, graph: ir.Graph) -> bool:
        nodes = self._matches(graph)
        for node in nodes:
            node.attributes["count_include_pad"] = ir.AttrInt64("count_include_pad", 0)
        return bool(nodes)


# ------------------------------------------------------------------- LogSoftmax over an axis of one element


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
        x = op_input(node, "LogSoftmax")
        shape = static_shape(x)
        if x is None or shape is None or not shape:
            return None
        axis = node.attributes.get_int("axis", -1)
        if not -len(shape) <= axis < len(shape) or shape[axis] != 1:
            return None
        return x

    def rewrite(self, graph: ir.Graph) -> bool:
        return self.replace_matched(
            graph, "qnnx_logsoftmax", lambda names, node, x: one_node_like(names, "out", node, "Sub", [x, x])
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
        if not is_op(node, "Mul") or len(node.inputs) != 2:
            return None
        for scaled, factor in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            c = const_array(factor)
            shape = static_shape(scaled)
            if scaled is None or c is None or c.size != 1 or shape is None or c.ndim > len(shape):
                continue  # a factor of higher rank would broadcast the output to a new rank
            gather = _gathered_table(scaled)
            table = const_array(gather.inputs[0]) if gather is not None else None
            if gather is not None and table is not None and table.dtype == c.dtype and c.dtype.kind == "f":
                return gather, c, scaled
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = fresh_names(graph, "qnnx_scaled")
        matched = self.matched(graph)
        for mul, (gather, factor, scaled) in matched:
            table = cast(np.ndarray, const_array(gather.inputs[0]))
            folded = add_initializer(graph, names("table"), table * factor.reshape(()))
            gather.replace_input_with(0, folded)
            replace_value(graph, mul.outputs[0], scaled)
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
            if data is None or indices is None or const_array(indices) is not None or const_array(data) is None:
                return None
            return producer
        if producer.op_type not in _MOVES or producer.inputs[0] is None:
            return None
        value = producer.inputs[0]
