"""Convolutions QNN HTP refuses in one form but takes in an equivalent one."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = ["ConvTransposeDilatedKernel", "ConvTransposeNormalForm"]


def _dilations(node: ir.Node) -> list[int] | None:
    """The dilations of a ConvTranspose with one above 1 whose weight has a static shape, else None."""
    if not _graph.is_op(node, "ConvTranspose") or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    weight = _graph.static_shape(node.inputs[1])
    dilations = node.attributes.get_ints("dilations", None)
    if weight is None or dilations is None or len(dilations) != len(weight) - 2 or all(d == 1 for d in dilations):
        return None
    return [int(d) for d in dilations]


def dilate_kernel(weight: np.ndarray, dilations: list[int]) -> np.ndarray:
    """``weight`` (``[C_in, C_out / groups, k_1, ..., k_n]``) with ``d - 1`` zeros between the taps of each spatial
    axis dilated by ``d``: the kernel of size ``(k - 1) d + 1`` that covers the same inputs at dilation 1."""
    sizes = [(k - 1) * d + 1 for k, d in zip(weight.shape[2:], dilations, strict=True)]
    out = np.zeros((*weight.shape[:2], *sizes), dtype=weight.dtype)
    out[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = weight
    return out


class _Builder:
    """Nodes of one dtype for a replacement: int64 constants, one-output nodes of known shape, and zeros spread
    between the rows of an axis."""

    def __init__(self, graph: ir.Graph, names: UniqueNames, dtype: ir.DataType | None) -> None:
        self.graph, self.names, self.dtype = graph, names, dtype
        self.nodes: list[ir.Node] = []

    def ints(self, values: list[int]) -> ir.Value:
        return _graph.add_initializer(self.graph, self.names("i"), np.array(values, dtype=np.int64))

    def emit(self, op_type: str, inputs: list[ir.Value | None], shape: list[int]) -> ir.Value:
        out = _graph.new_value(self.names(op_type.lower()), self.dtype, shape)
        self.nodes.append(ir.Node("", op_type, inputs, outputs=[out]))
        return out

    def spread(self, value: ir.Value, shape: list[int], axis: int, factor: int) -> ir.Value:
        """``value`` (of ``shape``, updated in place) with ``factor - 1`` zeros between the rows of ``axis``: on the
        rank-4 view ``[outer, n, 1, inner]`` padded to ``[outer, n, factor, inner]``, flattened and cut to
        ``(n - 1) factor + 1`` rows (Pad, Reshape and Slice, which QNN runs exactly)."""
        outer, rows, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
        view = self.emit("Reshape", [value, self.ints([outer, rows, 1, inner])], [outer, rows, 1, inner])
        padded = self.emit("Pad", [view, self.ints([0, 0, 0, 0, 0, 0, factor - 1, 0])], [outer, rows, factor, inner])
        flat = self.emit("Reshape", [padded, self.ints([outer, rows * factor, inner])], [outer, rows * factor, inner])
        size = (rows - 1) * factor + 1
        cut = self.emit("Slice", [flat, self.ints([0]), self.ints([size]), self.ints([1])], [outer, size, inner])
        shape[axis] = size
        return self.emit("Reshape", [cut, self.ints(shape)], list(shape))


@register(order=88)
class ConvTransposeDilatedKernel(QnnPass):
    """Compute a ConvTranspose with a dilation above 1 as a ConvTranspose at dilation 1 of the dilated kernel.

    A transposed convolution at dilation ``d`` adds tap ``j`` of the kernel at offset ``j * d``; the kernel with
    ``d - 1`` zeros between its taps (size ``(k - 1) d + 1``) adds the same products at the same offsets and zeros
    elsewhere, and gives the same output size, so the rewrite is exact. QNN HTP refuses ConvTranspose with a dilation
    above 1 (onnxruntime-qnn 2.7.0, soc 60), so ``conv_transpose*d(..., dilation=2)`` ran on the CPU. A constant
    weight is dilated at export. A weight computed at run time is dilated in the graph, one axis at a time on a
    rank-4 view ``[outer, k, 1, inner]``: padded to ``[outer, k, d, inner]``, flattened and cut to ``(k - 1) d + 1``
    taps (Pad, Reshape and Slice, which QNN runs exactly). ``kernel_shape`` is updated when present.
    """

    name = "convtranspose_dilated_kernel"
    defect = "QNN HTP refuses ConvTranspose with a dilation above 1 (conv_transpose with dilation ran on the CPU)"

    def match(self, node: ir.Node) -> list[int] | None:
        """The dilations of a ConvTranspose with one above 1 and a weight of static shape, or None."""
        return _dilations(node)

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_dilated")
        matched = self.matched(graph)
        for node, dilations in matched:
            weight = node.inputs[1]
            assert weight is not None  # match checked it
            array = _graph.const_array(weight)
            if array is not None:
                dilated = _graph.add_initializer(graph, names("weight"), dilate_kernel(array, dilations))
            else:
                dilated = self._dilate_in_graph(graph, names, node, weight, dilations)
            node.replace_input_with(1, dilated)
            node.attributes["dilations"] = ir.AttrInt64s("dilations", [1] * len(dilations))
            if node.attributes.get_ints("kernel_shape", None) is not None:
                shape = _graph.static_shape(dilated)
                assert shape is not None
                node.attributes["kernel_shape"] = ir.AttrInt64s("kernel_shape", list(shape[2:]))
        return bool(matched)

    @staticmethod
    def _dilate_in_graph(
        graph: ir.Graph, names: UniqueNames, node: ir.Node, weight: ir.Value, dilations: list[int]
    ) -> ir.Value:
        shape = list(_graph.static_shape(weight) or ())
        b = _Builder(graph, names, weight.dtype)
        for axis, d in enumerate(dilations, start=2):
            if d > 1:
                weight = b.spread(weight, shape, axis, d)
        graph.insert_before(node, b.nodes)
        return weight


def _ints(node: ir.Node, name: str, rank: int) -> list[int]:
    values = node.attributes.get_ints(name, None)
    return [int(v) for v in values] if values is not None else [0] * rank


class _Plan(NamedTuple):
    """How :class:`ConvTransposeNormalForm` computes one ConvTranspose: its spatial strides, begin and end pads,
    output_padding, the spatial axes whose input gets zeros between its rows (their stride becomes 1), the groups
    computed as separate convolutions (1: none), and the static shapes of its input and output."""

    strides: list[int]
    begin: list[int]
    end: list[int]
    output_padding: list[int]
    spread: list[int]
    split: int
    x_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


def _plan(node: ir.Node) -> _Plan | None:
    if not _graph.is_op(node, "ConvTranspose") or len(node.inputs) < 2 or node.inputs[0] is None:
        return None
    x_shape, out = _graph.static_shape(node.inputs[0]), _graph.static_shape(node.outputs[0])
    if x_shape is None or out is None or len(x_shape) != len(out) or len(out) < 3:
        return None
    if node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET" or "output_shape" in node.attributes:
        return None
    n = len(out) - 2
    strides = _ints(node, "strides", n)
    strides = [s or 1 for s in strides]
    pads = _ints(node, "pads", 2 * n)
    if len(strides) != n or len(pads) != 2 * n:
        return None
    begin, end, output_padding = pads[:n], pads[n:], _ints(node, "output_padding", n)
    spread = [1, 2] if n == 3 and strides[1] != strides[2] else []
    pads_differ = n == 3 and (begin[0], end[0]) != (begin[1], end[1])
    groups = node.attributes.get_int("group", 1) or 1
    split = groups if n == 3 and groups > 1 else 1
    if split > 1 and _graph.static_shape(node.inputs[1]) is None:
        return None
    if not (spread or pads_differ or split > 1 or any(output_padding)):
        return None
    return _Plan(strides, begin, end, output_padding, spread, split, x_shape, out)


@register(order=89)
class ConvTransposeNormalForm(QnnPass):
    """Compute a ConvTranspose that QNN HTP gets wrong as one it gets right: without pads, output_padding or bias,
    and at stride 1 on the axes whose strides it mishandles, followed by the exact steps those attributes stand for.

    QNN HTP computes these wrongly (onnxruntime-qnn 2.7.0, soc 60; 0.09-3 times the output's scale off): a 3-D
    ConvTranspose whose first two spatial axes are padded differently (``padding=(0, 1, 1)``), a 3-D one whose last
    two spatial axes have different strides (``stride=(2, 2, 1)``), a grouped 3-D one (``groups=2``: 0.8-1.1 off in
    every class measured), and a ConvTranspose with output_padding: always when its strides differ between axes,
    and in classes without a pattern otherwise (kernel 3, 6 or 9 at stride 3 with output_padding 2; kernel 4 at
    stride 2 without pads and output_padding 1). The same convolutions without pads, without output_padding, with
    one group and with equal strides on those two axes are right. The rewrite is exact:

    * a stride ``s`` on an axis is the same as stride 1 on the input with ``s - 1`` zeros between its rows (the
      zero rows add nothing), done on a rank-4 view ``[outer, n, 1, inner]`` padded to ``[outer, n, s, inner]``,
      flattened and cut to ``(n - 1) s + 1`` rows;
    * ``output_padding`` adds rows at the end of the full output that no input reaches: zeros, padded on after the
      convolution, with the bias added after that;
    * pads remove rows from the start and end of the full output: a Slice;
    * a grouped 3-D ConvTranspose is one ConvTranspose per group, on its slice of the input channels and of the
      weight, joined on the channel axis (with the bias added after).

    Nodes with ``auto_pad`` or ``output_shape`` (whose pads ONNX Runtime computes) are left alone.
    """

    name = "convtranspose_normal_form"
    defect = (
        "QNN HTP computes 3-D ConvTranspose with pads differing between its first two spatial axes or strides "
        "between its last two, grouped 3-D ConvTranspose, and ConvTranspose with output_padding, wrongly (silent)"
    )

    def match(self, node: ir.Node) -> _Plan | None:
        """How to compute a ConvTranspose QNN HTP gets wrong, or None."""
        return _plan(node)

    @staticmethod
    def _convolve(
        b: _Builder,
        node: ir.Node,
        x: ir.Value,
        x_shape: list[int],
        plan: _Plan,
        attributes: list[ir.Attr],
        bias: ir.Value | None,
        full: list[int],
    ) -> ir.Value:
        """The ConvTranspose of ``x`` with the node's weight (and ``bias``) into ``full``; with ``plan.split`` groups,
        one ConvTranspose per group (its input channels and weight rows sliced out), joined on the channel axis."""
        weight = node.inputs[1]
        if plan.split == 1:
            out = _graph.new_value(b.names("full"), b.dtype, full)
            inputs = [x, weight] + ([bias] if bias is not None else [])
            b.nodes.append(ir.Node("", "ConvTranspose", inputs, attributes=attributes, outputs=[out]))
            return out
        w_shape = list(_graph.static_shape(weight) or ())
        c_in, c_out = x_shape[1] // plan.split, full[1] // plan.split
        parts = []
        for g in range(plan.split):
            rows = [b.ints([g * c_in]), b.ints([(g + 1) * c_in])]
            xg = b.emit("Slice", [x, *rows, b.ints([1])], [x_shape[0], c_in, *x_shape[2:]])
            wg = b.emit("Slice", [weight, *rows, b.ints([0])], [c_in, *w_shape[1:]])
            part = _graph.new_value(b.names("group"), b.dtype, [full[0], c_out, *full[2:]])
            b.nodes.append(ir.Node("", "ConvTranspose", [xg, wg], attributes=attributes, outputs=[part]))
            parts.append(part)
        out = _graph.new_value(b.names("joined"), b.dtype, full)
        b.nodes.append(ir.Node("", "Concat", parts, attributes=[ir.AttrInt64("axis", 1)], outputs=[out]))
        return out

    def rewrite(self, graph: ir.Graph) -> bool:
        def normal(names: UniqueNames, node: ir.Node, plan: _Plan) -> tuple[list[ir.Node], ir.Value]:
            b = _Builder(graph, names, node.outputs[0].dtype)
            x = node.inputs[0]
            assert x is not None  # the plan read its shape
            shape, strides = list(plan.x_shape), list(plan.strides)
            for a in plan.spread:
                if strides[a] > 1:
                    x = b.spread(x, shape, a + 2, strides[a])
                    strides[a] = 1
            n = len(strides)
            full = [plan.out_shape[2 + a] + plan.begin[a] + plan.end[a] - plan.output_padding[a] for a in range(n)]
            bias = node.inputs[2] if len(node.inputs) > 2 else None
            late_bias = bias is not None and (any(plan.output_padding) or plan.split > 1)
            dropped = ("pads", "output_padding", "strides", *(("group",) if plan.split > 1 else ()))
            kept = [*(a for k, a in node.attributes.items() if k not in dropped), ir.AttrInt64s("strides", strides)]
            whole = [*plan.out_shape[:2], *full]
            out = self._convolve(b, node, x, shape, plan, kept, None if late_bias else bias, whole)
            if any(plan.output_padding):
                full = [f + p for f, p in zip(full, plan.output_padding, strict=True)]
                widths = [0] * (n + 2) + [0, 0, *plan.output_padding]
                out = b.emit("Pad", [out, b.ints(widths)], [*plan.out_shape[:2], *full])
            if late_bias:
                channels = [1, plan.out_shape[1], *([1] * n)]
                per_channel = b.emit("Reshape", [bias, b.ints(channels)], channels)
                out = b.emit("Add", [out, per_channel], [*plan.out_shape[:2], *full])
            if not any(plan.begin) and not any(plan.end):
                return b.nodes, out
            ends = [f - e for f, e in zip(full, plan.end, strict=True)]
            last, value = _graph.one_node_like(
                names, "out", node, "Slice", [out, b.ints(plan.begin), b.ints(ends), b.ints([2 + a for a in range(n)])]
            )
            return [*b.nodes, *last], value

        return self.replace_matched(graph, "qnnx_convt", normal)
