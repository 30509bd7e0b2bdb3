"""Pooling that HTP computes wrongly (average pools, padded max pools), rewritten into windows it computes right; and
constant padding of integers, which HTP refuses, as the same blocks joined on."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx_ir as ir

from qnnx_clikit import htp_averages_wrongly, htp_pads_wrongly
from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "AvgPoolDropUnusedCountIncludePad",
    "AvgPoolWholeWindows",
    "FloatPadEndsAsConcat",
    "IntegerPadAsConcat",
    "MaxPoolPaddedInput",
]


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
            if not _graph.is_op(n, "AveragePool"):
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


# ----------------------------------------------------- AveragePool windows HTP averages wrongly, made whole


@dataclass(frozen=True)
class PoolWindows:
    """How :class:`AvgPoolWholeWindows` writes one AveragePool: the zero padding before and after each spatial axis
    (after: the node's end pad plus the ceil overhang), and ``scale``, kernel area / the node's divisor at each
    output position (float64, the output's spatial shape)."""

    begin: tuple[int, ...]
    end: tuple[int, ...]
    scale: np.ndarray


def _pool_axis(size: int, k: int, s: int, before: int, after: int, ceil: bool, count_pad: bool) -> np.ndarray | None:
    """kernel / divisor for each window along one axis, with ONNX Runtime's windows: under ceil_mode a last window
    that would start in the end padding (or past it) is dropped, as PyTorch does; the divisor counts the window's
    input elements, or with ``count_pad`` its elements inside the padded axis (not the ceil overhang past it).
    None when the node is invalid there (a pad of the kernel or more, or a padded axis shorter than the kernel),
    which ONNX Runtime refuses: left alone."""
    span = size + before + after - k
    if span < 0 or before >= k or after >= k:
        return None
    count = (-(-span // s) if ceil else span // s) + 1
    if ceil and (count - 1) * s >= size + before:
        count -= 1
    starts = np.arange(count) * s - before
    ends = starts + k
    # A window starts at or after -before and (dropped windows aside) before the end of the input.
    high = np.minimum(ends, size + after if count_pad else size)
    low = starts if count_pad else np.maximum(starts, 0)
    return k / (high - low).astype(np.float64)


def _joined_on(
    graph: ir.Graph,
    names: UniqueNames,
    x: ir.Value,
    begin: tuple[int, ...],
    end: tuple[int, ...],
    fill: ir.Value | None = None,
    first_axis: int = 2,
    value: float | int | bool = 0,
) -> tuple[list[ir.Node], ir.Value, tuple[int, ...]]:
    """``x`` (static shape ``[N, C, *spatial]``) with ``begin``/``end`` elements joined on before and after each
    spatial axis (each axis from ``first_axis``) by ``Concat``, axis by axis: blocks of ``value`` (zeros), or
    ``fill`` (a value of one element, broadcast) added to them. The nodes, the padded value and its shape."""
    shape = cast(tuple[int, ...], _graph.static_shape(x))
    dtype = x.dtype
    np_dtype = cast(ir.DataType, dtype).numpy()
    nodes: list[ir.Node] = []

    def block(size: int, axis: int) -> ir.Value:
        block_shape = [size if d == axis else n for d, n in enumerate(shape)]
        zeros = _graph.add_initializer(graph, names("zeros"), np.full(block_shape, value, np_dtype))
        if fill is None:
            return zeros
        filled = _graph.new_value(names("filled"), dtype, block_shape)
        nodes.append(ir.Node("", "Add", [zeros, fill], outputs=[filled]))
        return filled

    for axis, (before, after) in enumerate(zip(begin, end, strict=True), start=first_axis):
        if not before and not after:
            continue
        inputs = [*([block(before, axis)] if before else []), x, *([block(after, axis)] if after else [])]
        shape = tuple(n + before + after if d == axis else n for d, n in enumerate(shape))
        padded = _graph.new_value(names("padded"), dtype, shape)
        nodes.append(ir.Node("", "Concat", inputs, attributes=[ir.AttrInt64("axis", axis)], outputs=[padded]))
        x = padded
    return nodes, x, shape


def _static_window(node: ir.Node, op_type: str) -> tuple[tuple[int, ...], list[int], list[int], list[int], bool] | None:
    """A pool node's input shape, kernel, strides, pads and ceil_mode, when its input's shape is static and it has
    explicit pads (no auto_pad) and no dilation; else None."""
    x = _graph.op_input(node, op_type)
    shape = _graph.static_shape(x)
    kernel = list(node.attributes.get_ints("kernel_shape", ()))
    spatial = len(kernel)
    if x is None or shape is None or spatial == 0 or len(shape) != spatial + 2:
        return None
    if node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
        return None
    if any(d != 1 for d in node.attributes.get_ints("dilations", ())):
        return None
    strides = list(node.attributes.get_ints("strides", ()) or [1] * spatial)
    pads = list(node.attributes.get_ints("pads", ()) or [0] * (2 * spatial))
    if len(strides) != spatial or len(pads) != 2 * spatial or min(strides) < 1 or min(pads) < 0:
        return None
    return shape, kernel, strides, pads, bool(node.attributes.get_int("ceil_mode", 0))


@register(order=85)
class AvgPoolWholeWindows(QnnPass):
    """Write an AveragePool that QNN HTP averages wrongly (a ceil_mode window hanging over the end, count_include_pad
    with padding or at rank 5, a pad of half the kernel or more) as zeros joined on with ``Concat``, an AveragePool
    whose windows are all whole (no pads, no ceil_mode, count_include_pad=0) and a ``Mul`` by kernel area / the
    node's divisor.

    The zeros are the node's pads and, at the end, the ceil overhang, so every output window lies inside the padded
    tensor and the pool divides by the kernel area; the constant factor (``[1, 1, *output spatial shape]``, in the
    input's dtype) turns that into the node's own divisor: the input elements in the window, or with
    count_include_pad those inside the padded input. Under ceil_mode a window that would start in the end padding
    is dropped, as ONNX Runtime and PyTorch do. Not a ``Pad``: ONNX Runtime's optimizer folds a zero Pad into the
    pool as pads with count_include_pad=1, a defect again (wrong on HTP in 39 of 220 measured shapes, up to 1.7e5
    of the scale). EfficientNet-style ``AvgPool2d(3, 2, padding=1, ceil_mode=True)`` then runs wholly on HTP
    (1.0 of the scale off before, 6.2e-4 after). Exact on the CPU EP up to the factor's rounding (float32: 1.1e-7
    of the scale measured; fp16: one rounding). Static shapes only; dilations and auto_pad are left as they are.
    """

    name = "avgpool_whole_windows"
    defect = (
        "QNN HTP averages wrongly over a ceil_mode window hanging over the end, with count_include_pad and padding "
        "(or at rank 5), and with a pad of half the kernel or more (0.21-1.1 of the output's scale off, or a wrong "
        "shape)"
    )

    def match(self, node: ir.Node) -> PoolWindows | None:
        """How to write an AveragePool HTP gets wrong (static shapes, no dilation, explicit pads), or None."""
        window = _static_window(node, "AveragePool")
        if window is None:
            return None
        shape, kernel, strides, pads, ceil = window
        spatial = len(kernel)
        count_pad = bool(node.attributes.get_int("count_include_pad", 0))
        if not htp_averages_wrongly(shape, kernel, strides, pads, ceil=ceil, count_pad=count_pad):
            return None
        axes = []
        for a in range(spatial):
            ratio = _pool_axis(shape[a + 2], kernel[a], strides[a], pads[a], pads[a + spatial], ceil, count_pad)
            if ratio is None:
                return None
            axes.append(ratio)
        out = tuple(len(r) for r in axes)
        declared = _graph.static_shape(node.outputs[0])
        if declared is not None and declared != shape[:2] + out:
            return None  # a declared shape that is not ONNX Runtime's: leave the node to the checker
        scale = functools.reduce(np.multiply.outer, axes)
        # The last window ends where the padded axis ends (or before, when the stride skips elements at the end).
        end = tuple(
            max(pads[a + spatial], (out[a] - 1) * strides[a] + kernel[a] - shape[a + 2] - pads[a])
            for a in range(spatial)
        )
        return PoolWindows(tuple(pads[:spatial]), end, scale)

    def rewrite(self, graph: ir.Graph) -> bool:
        def whole(names: UniqueNames, node: ir.Node, plan: PoolWindows) -> tuple[list[ir.Node], ir.Value]:
            x = cast(ir.Value, node.inputs[0])
            dtype = x.dtype
            np_dtype = cast(ir.DataType, dtype).numpy()
            # Zeros joined on with Concat: ONNX Runtime's PadFusion would fold a Pad back into the pool as pads with
            # count_include_pad=1 (a defect again), and HTP folds nothing into a Concat.
            nodes, x, shape = _joined_on(graph, names, x, plan.begin, plan.end)
            kernel = node.attributes.get_ints("kernel_shape", ())
            strides = node.attributes.get_ints("strides", ()) or [1] * len(kernel)
            pooled = _graph.new_value(names("pooled"), dtype, shape[:2] + plan.scale.shape)
            attrs = [ir.AttrInt64s("kernel_shape", list(kernel)), ir.AttrInt64s("strides", list(strides))]
            nodes.append(ir.Node("", "AveragePool", [x], attributes=attrs, outputs=[pooled]))
            if np.all(plan.scale == 1.0):
                return nodes, pooled
            factor = _graph.add_initializer(graph, names("divisor"), plan.scale.astype(np_dtype)[None, None])
            out = _graph.new_value(names("out"), dtype, shape[:2] + plan.scale.shape)
            nodes.append(ir.Node("", "Mul", [pooled, factor], outputs=[out]))
            return nodes, out

        return self.replace_matched(graph, "qnnx_avgpool", whole)


# ------------------------------------------------ MaxPool padding, joined on as the input's least element


@register(order=86)
class MaxPoolPaddedInput(QnnPass):
    """Write a MaxPool with pads (or ceil_mode) as copies of the input's least element joined on with ``Concat`` and
    a MaxPool of whole windows (no pads, no ceil_mode).

    QNN HTP gets a padded MaxPool wrong: with a 2-wide, 2-stride window, padding on both sides of the width and a
    height over 1, the last column comes out 0 where every element of its window is negative
    (``max_pool2d(x, 2, 2, padding=1)`` of an all-negative ``[1, 2, 4, 4]``: 3 of 9 outputs off by up to 1.3 of the
    output's scale; onnxruntime-qnn 2.7.0, soc 60), silently. The pads mean ``-inf``; the input's least element
    (``ReduceMin`` over every axis) is no greater than any element of a window, and every window holds at least one
    input element, so every window keeps its maximum: exact. Unlike an infinite or lowest-value constant (HTP holds
    no infinity), it keeps the padded tensor in the input's range, which a quantized model calibrates. The end
    elements are the node's end pad and the ceil overhang, so a ceil_mode window that would start in the end
    padding is dropped, as ONNX Runtime and PyTorch do. Static shapes, one output (no indices), no dilation, pads
    smaller than the kernel, no auto_pad.
    """

    name = "maxpool_padded_input"
    defect = "QNN HTP's padded MaxPool gives 0 for some windows of negative values (silent wrong output)"

    def match(self, node: ir.Node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The elements to join on before and after each spatial axis of a padded (or ceil_mode) MaxPool, or
        None."""
        window = _static_window(node, "MaxPool")
        if window is None or len(node.outputs) != 1 or node.attributes.get_int("storage_order"):
            return None
        shape, kernel, strides, pads, ceil = window
        spatial = len(kernel)
        if not any(pads) and not ceil:
            return None
        end = []
        for a in range(spatial):
            size, k, s, before, after = shape[a + 2], kernel[a], strides[a], pads[a], pads[a + spatial]
            if before >= k or after >= k or size + before + after < k:
                return None
            count = ((size + before + after - k + (s - 1 if ceil else 0)) // s) + 1
            if ceil and (count - 1) * s >= size + before:
                count -= 1  # a last window starting in the end padding is dropped
            end.append(max(after, (count - 1) * s + k - size - before))
        return tuple(pads[:spatial]), tuple(end)

    def rewrite(self, graph: ir.Graph) -> bool:
        def whole(
            names: UniqueNames, node: ir.Node, plan: tuple[tuple[int, ...], tuple[int, ...]]
        ) -> tuple[list[ir.Node], ir.Value]:
            x = cast(ir.Value, node.inputs[0])
            rank = len(cast(tuple[int, ...], _graph.static_shape(x)))
            least = _graph.new_value(names("least"), x.dtype, (1,) * rank)
            axes = _graph.add_initializer(graph, names("axes"), np.arange(rank, dtype=np.int64))
            reduce = ir.Node("", "ReduceMin", [x, axes], attributes=[ir.AttrInt64("keepdims", 1)], outputs=[least])
            nodes, padded, _ = _joined_on(graph, names, x, plan[0], plan[1], least)
            nodes.insert(0, reduce)
            kernel = list(node.attributes.get_ints("kernel_shape", ()))
            strides = list(node.attributes.get_ints("strides", ()) or [1] * len(kernel))
            attrs = [ir.AttrInt64s("kernel_shape", kernel), ir.AttrInt64s("strides", strides)]
            out = _graph.new_value(names("out"), x.dtype, _graph.static_shape(node.outputs[0]))
            return [*nodes, ir.Node("", "MaxPool", [padded], attributes=attrs, outputs=[out])], out

        return self.replace_matched(graph, "qnnx_maxpool", whole)


# ------------------------------------------------ constant Pad of integers (and float Pads HTP fills wrongly) as Concat

# Integer and bool Pad: the QNN EP refuses all of them (int32, int64, bool, uint8; onnxruntime-qnn 2.7.0), and
# Concat takes each but uint8.
_JOINED_PAD_DTYPES = frozenset({ir.DataType.INT32, ir.DataType.INT64, ir.DataType.BOOL})
# Float Pad, which HTP computes, but not every pattern right (FloatPadEndsAsConcat).
_FLOAT_PAD_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


@dataclass(frozen=True)
class PadBlocks:
    begin: tuple[int, ...]
    end: tuple[int, ...]
    value: int | float | bool


@register(order=87)
class IntegerPadAsConcat(QnnPass):
    """Write a constant-mode ``Pad`` of int32, int64 or bool as blocks of its pad value joined on with ``Concat``.

    The QNN EP refuses Pad of every integer type and of bool ("Failed to add node"), and a model pads its token ids
    and attention mask to a multiple of a window (Longformer, LED) or a block: one such node put the graph's
    integer nodes on the CPU EP, and with them most of a small graph. Concat of the same types runs on HTP. Exact:
    data movement only. Static shapes, constant pads of 0 or more and a constant pad value only.
    """

    name = "integer_pad_as_concat"
    defect = "the QNN EP refuses Pad of int32, int64 and bool (the node falls to the CPU EP)"

    prefix = "qnnx_intpad"
    dtypes = _JOINED_PAD_DTYPES

    def match(self, node: ir.Node) -> PadBlocks | None:
        """The blocks to join on, for a constant Pad of one of :attr:`dtypes`; or None."""
        x = _graph.op_input(node, "Pad")
        if x is None or x.dtype not in self.dtypes:
            return None
        return _constant_pad_blocks(node, x)

    def rewrite(self, graph: ir.Graph) -> bool:
        def joined(names: UniqueNames, node: ir.Node, plan: PadBlocks) -> tuple[list[ir.Node], ir.Value]:
            x = cast(ir.Value, node.inputs[0])
            nodes, padded, _shape = _joined_on(graph, names, x, plan.begin, plan.end, first_axis=0, value=plan.value)
            return nodes, padded

        return self.replace_matched(graph, self.prefix, joined)


@register(order=91)
class FloatPadEndsAsConcat(IntegerPadAsConcat):
    """Write a constant-mode float ``Pad`` that pads the end of the last axis (or any float16 Pad of rank 5) as
    blocks of its pad value joined on with ``Concat``.

    QNN HTP computes such Pads wrongly, silently (onnxruntime-qnn 2.7.0, soc 60; pad values 0 and not). The op a
    Pad of the last axis's end feeds reads 0, or memory the Pad never wrote, in place of the padding:
    ``F.pad(x[4, 6], (0, 3), value=2.5)`` then Relu gave 0 where 2.5 was due, and a MatMul was 518 off (526 for a
    pad value of 0); a scatter-reduce along dim 0 with narrower indices, which the translator writes as a Pad of the
    indices with -1 and an Equal, summed into row 0 what belonged nowhere (0.95 of its scale off). As the graph's
    output, a Pad of that end and another axis's end left padding unwritten (``F.pad(x[1, 3], (0, 2, 0, 1),
    value=0.5)`` read 0 in two of its new columns), depending on the last dim, so the first-call check sees it only
    where what it reads differs enough from the pad value. At rank 5 in float16 a pad of the second or third axis
    was wrong whatever the others. Begin pads and pads of the other axes were right as outputs and into each of 16
    ops. Concat of the same blocks is data movement: exact, and right on HTP in every pattern and op measured. Runs
    after the convolution rewrites, which write Pads of their own. Static shapes, constant pads of 0 or more and a
    constant pad value only (the condition is ``qnnx_clikit.htp_pads_wrongly``, which qnnx-opcheck refuses).
    """

    name = "float_pad_ends_as_concat"
    defect = "the ops a Pad of the last axis's end feeds read 0 or unwritten memory for its padding on QNN HTP (silent)"
    prefix = "qnnx_floatpad"
    dtypes = _FLOAT_PAD_DTYPES

    def match(self, node: ir.Node) -> PadBlocks | None:
        """The blocks to join on, for a float constant Pad HTP computes wrongly; or None."""
        plan = super().match(node)
        if plan is None:  # not a constant Pad (a node without inputs, such as a Constant, included)
            return None
        half = cast(ir.Value, node.inputs[0]).dtype == ir.DataType.FLOAT16
        return plan if htp_pads_wrongly(plan.begin, plan.end, half=half) else None


def _constant_pad_blocks(node: ir.Node, x: ir.Value) -> PadBlocks | None:
    """The elements a constant-mode Pad adds before and after each axis of ``x`` and its value, when its input's
    shape, its pads (all >= 0, some > 0), its value and its axes are static; else None."""
    shape = _graph.static_shape(x)
    if shape is None:
        return None
    if node.attributes.get_string("mode", "constant") != "constant" or len(node.inputs) < 2:
        return None
    pads = _graph.const_array(node.inputs[1])
    fill = _graph.const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    if pads is None or (len(node.inputs) > 2 and node.inputs[2] is not None and fill is None):
        return None
    rank = len(shape)
    axes: list[int] = list(range(rank))
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        given = _graph.const_array(node.inputs[3])
        if given is None:
            return None
        axes = [int(a) % rank for a in given.reshape(-1)] if rank else []
    pads = pads.reshape(-1)
    if len(pads) != 2 * len(axes) or (pads < 0).any() or not pads.any():
        return None
    begin, end = [0] * rank, [0] * rank
    for k, axis in enumerate(axes):
        begin[axis], end[axis] = int(pads[k]), int(pads[k + len(axes)])
    value = fill.reshape(-1)[0].item() if fill is not None and fill.size else 0
    return PadBlocks(tuple(begin), tuple(end), value)
