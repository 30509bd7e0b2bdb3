"""Shape and layout rewrites: batch tiling, rank <= 5 transposes, empty Concat inputs, int64 Unsqueeze."""

from __future__ import annotations

import logging
import math
from typing import Any, cast

import numpy as np
import onnx_ir as ir

from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "ComposeHighRankTransposes",
    "DropEmptyConcatInputs",
    "FoldHighRankTranspose",
    "ReshapeOfHighRankReshape",
    "SoftmaxBeforeReshape",
    "TileLayerNormBroadcast",
    "TransposeOfUnitDimsAsReshape",
    "UnsqueezeInt64ToReshape",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- LayerNorm batch tiling


_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})


@register(order=160)
class TileLayerNormBroadcast(QnnPass):
    """Tile operands broadcast along the batch axis in Add/Sub/Mul/Div chains that feed LayerNormalization.

    QNN HTP computes ``LayerNormalization(Add(x[N,S,H], c[1,S,H]))`` (also ``c[S,H]``, Mul, and a
    computed ``c``) right for batch row 0 and wrong for rows >= 1 (errors ~2.4 on unit-scale data),
    silently. This is BERT/DistilBERT's ``embeddings + position_embeddings -> LayerNorm`` at batch > 1.
    Reproduced with onnxruntime-qnn 2.4.0-2.7.0 and soc_model 36/60/69. Operands that already have
    the batch size, or only broadcast along other axes (``[N,1,H]``, ``[1,1,H]``, ``[H]``), are right.

    Fix: a constant operand is replaced by an initializer tiled to the batch size (exact); a computed
    one gets a ``Tile`` node (an ``Expand`` is not enough: QNN folds it back into a broadcast).
    """

    name = "tile_layernorm_broadcast"
    defect = (
        "Add/Mul(x[N,...], c[1,...]) feeding LayerNormalization is silently wrong for batch rows >= 1 "
        "(onnxruntime-qnn 2.4.0-2.7.0)"
    )
    max_depth = 4

    def _feeding_nodes(self, graph: ir.Graph) -> list[ir.Node]:
        found: list[ir.Node] = []
        seen: set[int] = set()
        for node in graph:
            if not _graph.is_op(node, "LayerNormalization"):
                continue
            frontier = [(node.inputs[0], 0)]
            while frontier:
                value, depth = frontier.pop()
                prod = value.producer() if value is not None else None
                if prod is None or prod.op_type not in _ELEMENTWISE or depth >= self.max_depth:
                    continue
                if id(prod) not in seen:
                    seen.add(id(prod))
                    found.append(prod)
                frontier.extend((inp, depth + 1) for inp in prod.inputs)
        return found

    @staticmethod
    def _bad_operands(node: ir.Node) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
        out_shape = _graph.static_shape(node.outputs[0])
        if out_shape is None or len(out_shape) < 2 or out_shape[0] <= 1:
            return []
        bad = []
        for i, inp in enumerate(node.inputs):
            shape = _graph.static_shape(inp)
            if shape is None:
                continue
            aligned = (1,) * (len(out_shape) - len(shape)) + shape
            # Only operands that broadcast along the batch axis while covering a non-trivial
            # trailing block trigger the defect; [.., 1, H] / [H] do not (measured).
            if aligned[0] == 1 and any(d > 1 for d in aligned[1:-1]):
                bad.append((i, shape, out_shape))
        return bad

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [
            f"{n.name or n.op_type} input {i} {list(s)} -> {list(o)}"
            for n in self._feeding_nodes(graph)
            for i, s, o in self._bad_operands(n)
        ]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_tile")
        changed = False
        for node in self._feeding_nodes(graph):
            for i, shape, out_shape in self._bad_operands(node):
                value = cast(ir.Value, node.inputs[i])  # an operand with a static shape: never a missing input
                batch = out_shape[0]
                aligned = (1,) * (len(out_shape) - len(shape)) + shape
                array = _graph.const_array(value)
                if array is not None:
                    tiled = np.ascontiguousarray(np.broadcast_to(array.reshape(aligned), (batch, *aligned[1:])))
                    new = _graph.add_initializer(graph, names(value.name or "const"), tiled)
                else:
                    if len(shape) != len(out_shape):
                        reshaped = _graph.new_value(names("reshaped"), value.dtype, aligned)
                        target = _graph.add_initializer(graph, names("shape"), np.array(aligned, dtype=np.int64))
                        graph.insert_before(node, ir.Node("", "Reshape", [value, target], outputs=[reshaped]))
                        value = reshaped
                    repeats = _graph.add_initializer(
                        graph, names("repeats"), np.array([batch] + [1] * (len(out_shape) - 1), dtype=np.int64)
                    )
                    new = _graph.new_value(names("tiled"), value.dtype, (batch, *aligned[1:]))
                    graph.insert_before(node, ir.Node("", "Tile", [value, repeats], outputs=[new]))
                node.replace_input_with(i, new)
                changed = True
        return changed


# ------------------------------------------------------------- rank > 5 Reshape/Transpose/Reshape -> rank <= 5

_MAX_HTP_RANK = _graph.MAX_HTP_RANK
# The least size of an innermost axis kept as an axis of its own (see FoldHighRankTranspose): the classes measured
# kept apart start at 4 channels. Nor is it kept when the axis before it would have its size: a MatMul's [..., N]
# product reshaped to rank 5 [..., N, k] stops the process (SIGSEGV) inside QNN HTP (2x2 windows of 2 channels).
_MIN_OWN_AXIS = 4


def _coalesce(shape: tuple[int, ...], perm: list[int]) -> tuple[list[int], list[int]]:
    """Merge input axes that stay next to each other, in order, after the transpose.

    The innermost axis stays an axis of its own when it stays innermost and the merged rank allows it (see
    :class:`FoldHighRankTranspose`). Returns the merged input shape and the permutation of the merged axes;
    transposing the merged tensor moves the same elements to the same places as the original transpose.
    """
    groups: list[list[int]] = []
    for axis in perm:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    last = len(shape) - 1
    if len(groups[-1]) > 1 and groups[-1][-1] == last and len(groups) < _MAX_HTP_RANK:
        before = math.prod(shape[a] for a in groups[-1][:-1])
        if shape[last] >= _MIN_OWN_AXIS and before != shape[last]:
            groups[-1:] = [groups[-1][:-1], groups[-1][-1:]]
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # merged axes in input order
    merged_shape = [math.prod(shape[a] for a in groups[g]) for g in order]
    position = {g: i for i, g in enumerate(order)}
    return merged_shape, [position[g] for g in range(len(groups))]


def coalesce_axes(
    shape: tuple[int, ...], perm: list[int], *, drop_unit_axes: bool = False
) -> tuple[list[int], list[int]]:
    """:func:`_coalesce` of ``shape`` and ``perm``, first without the axes of size 1 when ``drop_unit_axes``."""
    return _coalesce(*_without_unit_axes(shape, perm)) if drop_unit_axes else _coalesce(shape, perm)


def _without_unit_axes(shape: tuple[int, ...], perm: list[int]) -> tuple[tuple[int, ...], list[int]]:
    """``shape`` without its axes of size 1 and ``perm`` on the axes left: a Transpose moves the same elements to the
    same places without them (an axis of size 1 orders nothing). At least one axis is kept."""
    kept = [a for a in range(len(shape)) if shape[a] != 1] or [0]
    number = {a: i for i, a in enumerate(kept)}
    return tuple(shape[a] for a in kept), [number[a] for a in perm if a in number]


@register(order=58)
class ComposeHighRankTransposes(QnnPass):
    """Make two Transposes in a row through a rank-6+ tensor one Transpose of the first one's input.

    ``Transpose(Transpose(x, p), q)`` moves every element where ``Transpose(x, p[q])`` does, so the rewrite is exact.
    PyTorch's ``einsum`` lowers to such pairs around its batched products (Pegasus-X's and ProphetNet's local
    attention: ``Reshape`` to rank 6, two permutes, ``Reshape``). qnnx-opcheck refuses the rank-6 tensor between the
    two (QNN HTP takes rank <= 5) and pins Transpose to the CPU EP, but ONNX Runtime fuses the pair before
    placement, so the refused node could not be kept off QNN and the whole graph ran in PyTorch. Made one, the chain
    is ``Reshape -> Transpose -> Reshape``, which :class:`FoldHighRankTranspose` brings to rank <= 5.
    """

    name = "compose_high_rank_transposes"
    defect = (
        "two rank-6 Transposes in a row (einsum's lowering) are refused by QNN HTP, and ONNX Runtime fuses them "
        "before placement, so they cannot be pinned to the CPU EP: the graph left QNN (Pegasus-X, ProphetNet)"
    )

    def match(self, node: ir.Node) -> tuple[ir.Node, list[int]] | None:
        if not _graph.is_op(node, "Transpose"):
            return None
        src = node.inputs[0]
        first = src.producer() if src is not None else None
        if first is None or not _graph.is_op(first, "Transpose") or src is None:
            return None
        shape = _graph.static_shape(src)
        if shape is None or len(shape) <= _MAX_HTP_RANK or src.is_graph_output() or len(list(src.uses())) != 1:
            return None
        outer, inner = _graph.transpose_perm(node, len(shape)), _graph.transpose_perm(first, len(shape))
        return first, [inner[k] for k in outer]

    def rewrite(self, graph: ir.Graph) -> bool:
        changed = False
        for node, (first, perm) in self.matched(graph):
            node.replace_input_with(0, first.inputs[0])
            node.attributes["perm"] = ir.AttrInt64s("perm", perm)
            graph.remove(first, safe=True)
            changed = True
        return changed


@register(order=60)
class FoldHighRankTranspose(QnnPass):
    """Rewrite ``Reshape -> Transpose -> Reshape`` through a rank-6+ tensor with the same chain at rank <= 5.

    QNN HTP takes tensors of rank <= 5 only. Swin's window partition and reverse (``view(B, H/w, w, W/w, w, C)
    .permute(0, 1, 3, 2, 4, 5)``) go through rank 6, but the axes that the permutation keeps together can be
    merged first: the merged transpose moves the same elements to the same places, so the rewrite is exact. The
    innermost axis (Swin's channels) stays an axis of its own whenever it stays innermost and rank 5 allows it:
    merging it too gives the window reverse a Reshape ``[B*nW, w*w, C] -> [B*H/w, W/w, w, w*C]`` after the output
    projection, which QNN HTP fails to finalize (``QNN_COMMON_ERROR_MEM_ALLOC``) for 2x2 windows on an 8x8 grid
    (C = 8, 16, batch 1 and 2: a tiny Swin's first stage), while ``[B*H/w, W/w, w, w, C]`` builds and is right for
    every class measured (windows 2-8, grids 2-4, C 4-32; onnxruntime-qnn 2.7.0, soc_model 60). Channels fewer
    than 4, or as many as the window's side, are merged as before: a MatMul's ``[..., C]`` product reshaped to
    rank 5 ``[..., C, k]`` kills the process (SIGSEGV), and ``[..., w, C]`` is that form when ``w == C``.
    """

    name = "fold_high_rank_transpose"
    defect = (
        "rank-6 tensors are refused by QNN HTP (Swin window partition), and a window reverse that merges the "
        "channels into the window's columns after the output projection fails graph finalize (tiny Swin)"
    )

    def match(self, node: ir.Node) -> tuple[ir.Node, list[int], list[int]] | None:
        if not _graph.is_op(node, "Transpose"):
            return None
        src = node.inputs[0]
        first = src.producer() if src is not None else None
        shape = _graph.static_shape(src)
        if first is None or first.op_type != "Reshape" or shape is None or len(shape) <= _MAX_HTP_RANK:
            return None
        if not _graph.read_only_by_reshapes(node.outputs[0]):
            return None
        perm = _graph.transpose_perm(node, len(shape))
        merged_shape, merged_perm = coalesce_axes(shape, perm)
        if len(merged_shape) > _MAX_HTP_RANK:
            merged_shape, merged_perm = coalesce_axes(shape, perm, drop_unit_axes=True)
        if len(merged_shape) > _MAX_HTP_RANK:
            return None
        return first, merged_shape, merged_perm

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_rank")
        changed = False
        for node, (first, merged_shape, merged_perm) in self.matched(graph):
            x = cast(ir.Value, first.inputs[0])  # match read its shape
            target = _graph.add_initializer(graph, names("shape"), np.array(merged_shape, dtype=np.int64))
            flat = _graph.new_value(names("merged"), x.dtype, merged_shape)
            moved_shape = [merged_shape[a] for a in merged_perm]
            moved = _graph.new_value(names("moved"), x.dtype, moved_shape)
            new_nodes = [
                ir.Node("", "Reshape", [x, target], outputs=[flat]),
                ir.Node("", "Transpose", [flat], attributes=[ir.AttrInt64s("perm", merged_perm)], outputs=[moved]),
            ]
            graph.insert_after(node, new_nodes)
            for use in list(node.outputs[0].uses()):
                use.node.replace_input_with(0, moved)
            changed = True
        return changed


# ------------------------------------------------------------- transposes that only move unit dims


def _moves_only_unit_dims(node: ir.Node) -> tuple[int, ...] | None:
    """The output shape of a Transpose whose non-unit axes keep their order (it moves no element), else None."""
    if not _graph.is_op(node, "Transpose") or not node.inputs or node.inputs[0] is None:
        return None
    shape, out = _graph.static_shape(node.inputs[0]), _graph.static_shape(node.outputs[0])
    if shape is None or out is None:
        return None
    perm_attr = node.attributes.get("perm")
    perm = list(perm_attr.as_ints()) if perm_attr is not None else list(reversed(range(len(shape))))
    kept = [axis for axis in perm if shape[axis] != 1]
    return out if kept == sorted(kept) else None


def _reshape_to_constant(use: Any) -> bool:
    """Whether ``use`` is the data input of a Reshape to a constant shape without 0s (a 0 copies the input's dim,
    which a bypass would change)."""
    if use.idx != 0 or not _graph.is_op(use.node, "Reshape") or len(use.node.inputs) < 2:
        return False
    target = _graph.const_array(use.node.inputs[1])
    return target is not None and bool((target != 0).all())


@register(order=33)
class TransposeOfUnitDimsAsReshape(QnnPass):
    """Drop a rank-5 Transpose that only moves axes of size 1 (``[4, 16, 1, 1, 32]`` by ``(3, 0, 1, 4, 2)``) and is
    read only by Reshapes to constant shapes: it moves no element, so the Reshapes read its input instead.

    PyTorch's ``einsum`` lowers to such permutes around its batched products at rank 5 (XLNet's and Funnel's
    relative attention), and QNN HTP fails to finalize a rank-5 Transpose of unit dims followed by Reshapes
    (``QNN_COMMON_ERROR_MEM_ALLOC``): the whole graph ran in PyTorch. Lower ranks are left as they are: they build,
    and the same rewrite at rank 4 (into a Reshape) gave a tiny MobileViT through torch.onnx a graph that QNN
    computes wrongly (1.14 of the output's scale, exact on the CPU EP). A rank-5 result read by anything but a
    Reshape is left too: HTP has failed on Reshapes to rank 5 after a MatMul. Shape classes: rank 5, any unit
    dims.
    """

    name = "transpose_of_unit_dims_as_reshape"
    defect = (
        "a rank-5 Transpose of unit dims followed by Reshapes fails QNN graph finalize (QNN_COMMON_ERROR_MEM_ALLOC; "
        "tiny XLNet and Funnel, whose graphs then ran in PyTorch)"
    )

    def match(self, node: ir.Node) -> tuple[int, ...] | None:
        out = _moves_only_unit_dims(node)
        if out is None:
            return None
        if len(out) < 5:
            return None  # lower ranks build; a rank-4 one turned into a Reshape made a tiny MobileViT wrong on QNN
        uses = list(node.outputs[0].uses())
        bypass = bool(uses) and not node.outputs[0].is_graph_output() and all(map(_reshape_to_constant, uses))
        return out if bypass else None

    def rewrite(self, graph: ir.Graph) -> bool:
        changed = False
        # Dropping one can make another match (a Transpose read by the one just dropped): until none is left.
        while matched := self.matched(graph):
            for node, _ in matched:
                x = cast(ir.Value, node.inputs[0])
                for use in list(node.outputs[0].uses()):
                    use.node.replace_input_with(0, x)
                graph.remove(node, safe=True)
            changed = True
        return changed


# ---------------------------------------------------------------------- a softmax taken before a reshape


@register(order=66)
class SoftmaxBeforeReshape(QnnPass):
    """Take a softmax over the last axis before the ``Reshape`` that feeds it, when that Reshape keeps the last axis.

    A Reshape that keeps the last axis keeps its rows, and a softmax over the last axis is taken row by row, so the
    two commute: exact. Attention computed at rank 3 and normalized on a rank-5 view (Hiera's mask units:
    ``bmm -> [49, 64, 64] -> view [1, 1, 49, 64, 64] -> softmax``) is a Reshape to rank 5 ``[..., N, k]`` of a
    MatMul's ``[..., N]`` product, which qnnx-opcheck refuses (that form stops the process in QNN HTP), and the
    pinned Reshape type took the graph below half on QNN. Taken first, the softmax reads the product and the Reshape
    reads the softmax. Only that refused form is rewritten: other graphs keep theirs.
    """

    name = "softmax_before_reshape"
    defect = (
        "a Reshape to rank 5 of a MatMul's product stops the process in QNN HTP and is refused: attention "
        "normalized on a rank-5 view of its rank-3 scores (Hiera) had every Reshape pinned to the CPU EP"
    )

    def match(self, node: ir.Node) -> ir.Node | None:
        if not _graph.is_op(node, "Softmax"):
            return None
        src = node.inputs[0]
        view = src.producer() if src is not None else None
        if view is None or not _graph.is_op(view, "Reshape") or src is None or len(list(src.uses())) != 1:
            return None
        product = _graph.product_viewed_at_rank5(view)
        before, after = _graph.static_shape(product), _graph.static_shape(src)
        if before is None or after is None or before[-1] != after[-1]:
            return None  # only the refused form, keeping the last axis: other graphs keep theirs
        attr = node.attributes.get("axis")
        axis = attr.as_int() if attr is not None else -1
        if axis % len(after) != len(after) - 1 or src.is_graph_output():
            return None
        return view

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_softmax_first")
        changed = False
        for node, view in self.matched(graph):
            x = cast(ir.Value, view.inputs[0])
            normalized = _graph.new_value(names("rows"), x.dtype, _graph.static_shape(x))
            attrs = [ir.AttrInt64("axis", -1)]
            graph.insert_before(view, ir.Node("", "Softmax", [x], attributes=attrs, outputs=[normalized]))
            view.replace_input_with(0, normalized)
            _graph.replace_value(graph, node.outputs[0], view.outputs[0])
            graph.remove(node, safe=True)
            changed = True
        return changed


# ---------------------------------------------------------------------- zero-width Concat inputs dropped


@register(order=65)
class ReshapeOfHighRankReshape(QnnPass):
    """Make a ``Reshape`` of a rank-6+ ``Reshape``'s output reshape that Reshape's input instead.

    A Reshape keeps the elements in order, so two in a row are one: the rank-6+ tensor between them (a window
    partition whose permute only moved axes of size 1 and was dropped, as in a tiny MaskFormer-Swin: ``[1, 4, 4, C]
    -> [1, 1, 4, 1, 4, C] -> [1, 4, 4, C]``) is not computed when nothing else reads it. qnnx-opcheck refuses the
    rank-6 view (QNN HTP takes rank <= 5), and ONNX Runtime fuses the two Reshapes before placement, so the refused
    node could not be kept off QNN and the graph ran in PyTorch (tiny MaskFormer-Swin and Swinv2). Exact (no
    arithmetic). The rewritten Reshape takes its static output shape as its target, so that a 0 (copy the input's
    dim) in the old target cannot read the new input's dim.
    """

    name = "reshape_of_high_rank_reshape"
    defect = (
        "a rank-6 view between two Reshapes is refused for QNN HTP but fused by ONNX Runtime before placement, so "
        "the graph ran in PyTorch (tiny MaskFormer-Swin, Swinv2)"
    )

    def match(self, node: ir.Node) -> ir.Value | None:
        """The input of the first of the rank-6+ Reshapes ``node`` (a Reshape to a static shape) reads, or None."""
        if not _graph.is_op(node, "Reshape") or _graph.static_shape(node.outputs[0]) is None:
            return None
        src = node.inputs[0]
        found = None
        while src is not None and (first := src.producer()) is not None and first.op_type == "Reshape":
            shape = _graph.static_shape(src)
            if shape is None or len(shape) <= _MAX_HTP_RANK:
                break
            found = src = first.inputs[0]
        return found

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_reshape")
        matched = self.matched(graph)
        for node, x in matched:
            shape = cast(tuple[int, ...], _graph.static_shape(node.outputs[0]))  # match read it
            target = _graph.add_initializer(graph, names("shape"), np.array(shape, dtype=np.int64))
            node.replace_input_with(0, x)
            node.replace_input_with(1, target)
        return bool(matched)


@register(order=70)
class DropEmptyConcatInputs(QnnPass):
    """Drop the Concat inputs that have no elements (a zero-width slice concatenated back).

    QNN HTP stops the process (SIGFPE) on a zero-element tensor (onnxruntime-qnn 2.7.0). Phi-3's partial rotary
    embedding writes ``cat([rotated, x[..., rotary_dim:]])``, whose second part is empty when the rotary covers the
    whole head. Concatenating nothing changes nothing, so the rewrite is exact; the slice feeding it then has no use
    and goes too.
    """

    name = "drop_empty_concat_inputs"
    defect = "zero-element tensors stop the process inside QNN HTP (SIGFPE)"

    @staticmethod
    def _empty(value: ir.Value | None) -> bool:
        shape = _graph.static_shape(value)
        return shape is not None and 0 in shape

    def _matches(self, graph: ir.Graph) -> list[ir.Node]:
        return [
            n
            for n in graph
            if n.op_type == "Concat"
            and n.domain in ("", "ai.onnx")
            and any(self._empty(v) for v in n.inputs)
            and not all(self._empty(v) for v in n.inputs)
        ]

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "Concat" for n in self._matches(graph)]

    def rewrite(self, graph: ir.Graph) -> bool:
        nodes = self._matches(graph)
        for node in nodes:
            kept = [v for v in node.inputs if not self._empty(v)]
            names = _graph.fresh_names(graph, "qnnx_concat")
            out = node.outputs[0]
            new = _graph.new_value(names("out"), out.dtype, _graph.static_shape(out))
            axis = node.attributes.get_int("axis", 0)
            replacement = (
                ir.Node("", "Identity", kept, outputs=[new])
                if len(kept) == 1
                else ir.Node("", "Concat", kept, attributes=[ir.AttrInt64("axis", axis)], outputs=[new])
            )
            graph.insert_after(node, replacement)
            _graph.replace_value(graph, out, new)
        return bool(nodes)


# ------------------------------------------------------------------------- Unsqueeze on int64 data


@register(order=40)
class UnsqueezeInt64ToReshape(QnnPass):
    """Replace ``Unsqueeze`` on int64 data by an equivalent ``Reshape`` to the static output shape.

    ``Unsqueeze`` with int64 data SEGFAULTS the process in QNN HTP graph construction (onnxruntime-qnn
    2.7.0, with or without CPU fallback), taking the Python interpreter down; Reshape on int64 works.
    Unsqueeze only inserts size-1 axes, so a Reshape to its output shape is exact.
    """

    name = "unsqueeze_int64_to_reshape"
    defect = "Unsqueeze on int64 data segfaults the process"

    @staticmethod
    def _targets(graph: ir.Graph) -> list[ir.Node]:
        return [
            n
            for n in graph
            if n.op_type == "Unsqueeze"
            and n.domain in ("", "ai.onnx")
            and n.inputs[0] is not None
            and n.inputs[0].dtype == ir.DataType.INT64
        ]

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "Unsqueeze" for n in self._targets(graph)]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_unsqueeze")
        changed = False
        unknown: list[str] = []
        for node in self._targets(graph):
            out_shape = _graph.static_shape(node.outputs[0])
            if out_shape is None:
                unknown.append(node.name or "Unsqueeze")
                continue
            target = _graph.add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            result = _graph.new_value(names("out"), node.outputs[0].dtype, out_shape)
            graph.insert_before(node, ir.Node("", "Reshape", [node.inputs[0], target], outputs=[result]))
            _graph.replace_value(graph, node.outputs[0], result)
            changed = True
        if unknown:
            log.warning("unsqueeze_int64_to_reshape: output shape unknown for %s; left unchanged", unknown)
        return changed
