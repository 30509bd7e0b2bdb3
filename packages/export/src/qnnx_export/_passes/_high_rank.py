"""Rank-6+ tensors brought to rank <= 5 (QNN HTP's limit) by merging axes: any Transpose as a chain of rank-4 moves,
reductions, arg-reductions and splits on merged axes; and the rank-5 views of a product that stop QNN, moved behind
the op that reads them. Data movement and the same reductions: exact."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register
from qnnx_export._passes._layout import FoldHighRankTranspose, coalesce_axes

__all__ = [
    "BroadcastAtRank5Expanded",
    "ConcatBeforeProductView",
    "DecomposeHighRankTranspose",
    "HighRankReduceOnMergedAxes",
    "HighRankSplitOnMergedAxes",
    "ProductViewTransposedAtRank4",
]

_MAX_HTP_RANK = _graph.MAX_HTP_RANK
_REDUCE_OPS = frozenset({"ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd"})
_ARG_OPS = frozenset({"ArgMax", "ArgMin"})


def _high_rank_input(node: ir.Node) -> tuple[int, ...] | None:
    """The static shape of ``node``'s first input when it has rank 6 or more, else None."""
    shape = _graph.static_shape(node.inputs[0]) if node.inputs else None
    return shape if shape is not None and len(shape) > _MAX_HTP_RANK else None


def _merged(shape: Sequence[int], marked: set[int]) -> tuple[list[int], list[int]]:
    """``shape`` with each run of neighbouring axes that are all marked, or all not, merged into one axis (an axis
    of size 1 joins the run before it): the merged shape and the merged axes that hold the marked ones."""
    sizes: list[int] = []
    flags: list[bool] = []
    for axis, size in enumerate(shape):
        mark = axis in marked
        if sizes and (flags[-1] == mark or size == 1):
            sizes[-1] *= size
        else:
            sizes.append(size)
            flags.append(mark)
    return sizes, [i for i, f in enumerate(flags) if f]


def _reshape(graph: ir.Graph, names: Any, before: ir.Node, x: ir.Value, shape: Sequence[int]) -> ir.Value:
    """``x`` reshaped to ``shape`` by a new Reshape inserted before ``before``."""
    target = _graph.add_initializer(graph, names("shape"), np.array(list(shape), dtype=np.int64))
    out = _graph.new_value(names("view"), x.dtype, shape)
    graph.insert_before(before, ir.Node("", "Reshape", [x, target], outputs=[out]))
    return out


def _replaced(graph: ir.Graph, node: ir.Node, value: ir.Value) -> None:
    """``value`` takes over the uses of ``node``'s output, and ``node`` is removed."""
    _graph.replace_value(graph, node.outputs[0], value)
    graph.remove(node, safe=True)


@register(order=62)
class DecomposeHighRankTranspose(QnnPass):
    """Compute a rank-6+ Transpose as rank-4 Transposes, each moving one axis to its place.

    Moving the axis at position ``p`` to position ``i < p`` is, on the view ``[prod(before i), prod(i..p-1), size
    of p, prod(after p)]``, the Transpose ``(0, 2, 1, 3)``; at most one move per axis, none where the moved block or
    the axis has size 1 (moving it orders nothing). Only the output is rank 6 again, a Reshape its readers see
    (a Reshape after it folds into one, see ``reshape_of_high_rank_reshape``; splits and reductions are merged too).
    What ``fold_high_rank_transpose`` (which runs first) leaves: Hiera's mask-unit unroll, ``[B, 14, 2, 14, 2, C]``
    by ``(0, 2, 4, 1, 3, 5)``, whose six axes all move apart. Data movement only: exact.
    """

    name = "decompose_high_rank_transpose"
    defect = (
        "rank-6 tensors are refused by QNN HTP: a Transpose whose axes all move apart (Hiera's mask units) had its "
        "op type pinned to the CPU EP, with every other Transpose of the graph"
    )

    def match(self, node: ir.Node) -> tuple[tuple[int, ...], list[int]] | None:
        if not _graph.is_op(node, "Transpose"):
            return None
        shape = _high_rank_input(node)
        if shape is None or _graph.static_shape(node.outputs[0]) is None:
            return None
        return shape, _graph.transpose_perm(node, len(shape))

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_moves")
        changed = False
        for node, (shape, perm) in self.matched(graph):
            value = cast(ir.Value, node.inputs[0])
            order, sizes = list(range(len(shape))), list(shape)
            for i, axis in enumerate(perm):
                p = order.index(axis)
                block = math.prod(sizes[i:p])
                if p == i or block == 1 or sizes[p] == 1:
                    order.insert(i, order.pop(p))
                    sizes.insert(i, sizes.pop(p))
                    continue
                view = [math.prod(sizes[:i]), block, sizes[p], math.prod(sizes[p + 1 :])]
                value = _reshape(graph, names, node, value, view)
                moved = _graph.new_value(names("moved"), value.dtype, [view[0], view[2], view[1], view[3]])
                graph.insert_before(
                    node,
                    ir.Node(
                        "", "Transpose", [value], attributes=[ir.AttrInt64s("perm", [0, 2, 1, 3])], outputs=[moved]
                    ),
                )
                value = moved
                order.insert(i, order.pop(p))
                sizes.insert(i, sizes.pop(p))
            _replaced(graph, node, _reshape(graph, names, node, value, sizes))
            changed = True
        return changed


@register(order=63)
class HighRankReduceOnMergedAxes(QnnPass):
    """Compute a reduction (ReduceMax/Min/Sum/Mean/Prod, ArgMax/ArgMin) of a rank-6+ tensor on a view that merges
    neighbouring axes, reduced with reduced and kept with kept, then reshape to the node's output.

    Hiera's mask-unit attention takes the maximum over a rank-6 view ``[1, H, 49, 4, 16, C]``; the merged view has
    rank 5 or less whenever the reduced axes form at most two runs. The same elements are reduced (an arg-reduction
    counts positions along one axis, unchanged by merging the others), so the result is PyTorch's.
    """

    name = "high_rank_reduce_on_merged_axes"
    defect = (
        "rank-6 tensors are refused by QNN HTP: a reduction over a rank-6 view (Hiera's mask-unit maximum) had its op "
        "type pinned to the CPU EP"
    )

    def match(self, node: ir.Node) -> tuple[list[int], list[int], tuple[int, ...]] | None:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _REDUCE_OPS | _ARG_OPS:
            return None
        shape = _high_rank_input(node)
        out = _graph.static_shape(node.outputs[0])
        if shape is None or out is None:
            return None
        rank = len(shape)
        if node.op_type in _ARG_OPS:
            attr = node.attributes.get("axis")
            axes = [attr.as_int() if attr is not None else 0]
        else:
            given = _graph.const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            attr = node.attributes.get("axes")
            if given is not None:
                axes = [int(a) for a in given.reshape(-1)]
            elif attr is not None:
                axes = list(attr.as_ints())
            else:
                axes = []
            noop = node.attributes.get("noop_with_empty_axes")
            if not axes and noop is not None and noop.as_int():
                return None
            axes = axes or list(range(rank))
        merged, reduced = _merged(shape, {a % rank for a in axes})
        if len(merged) > _MAX_HTP_RANK or not reduced or (node.op_type in _ARG_OPS and len(reduced) != 1):
            return None  # more than rank 5 still, or only axes of size 1 reduced (left as they are)
        return merged, reduced, out

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_reduce")
        changed = False
        for node, (merged, reduced, out_shape) in self.matched(graph):
            x = _reshape(graph, names, node, cast(ir.Value, node.inputs[0]), merged)
            kept = [1 if i in reduced else s for i, s in enumerate(merged)]
            result = _graph.new_value(names("reduced"), node.outputs[0].dtype, kept)
            attrs = [a for name, a in node.attributes.items() if name not in ("axes", "axis", "keepdims")]
            attrs.append(ir.AttrInt64("keepdims", 1))
            inputs: list[ir.Value | None] = [x]
            if node.op_type in _ARG_OPS:
                attrs.append(ir.AttrInt64("axis", reduced[0]))
            elif "axes" in node.attributes:  # an opset that takes the axes as an attribute
                attrs.append(ir.AttrInt64s("axes", reduced))
            else:
                inputs.append(_graph.add_initializer(graph, names("axes"), np.array(reduced, dtype=np.int64)))
            graph.insert_before(node, ir.Node("", node.op_type, inputs, attributes=attrs, outputs=[result]))
            _replaced(graph, node, _reshape(graph, names, node, result, out_shape))
            changed = True
        return changed


@register(order=64)
class HighRankSplitOnMergedAxes(QnnPass):
    """Split a rank-6+ tensor on the view ``[prod(before), size, prod(after)]`` of its axis, and reshape each part
    to its output's shape (``torch.unbind`` of Hiera's rank-6 ``qkv``). The same elements in each part: exact."""

    name = "high_rank_split_on_merged_axes"
    defect = (
        "rank-6 tensors are refused by QNN HTP: splitting a rank-6 tensor (Hiera's query, key and value) had its op "
        "type pinned to the CPU EP"
    )

    def match(self, node: ir.Node) -> tuple[list[int], list[tuple[int, ...]]] | None:
        if not _graph.is_op(node, "Split"):
            return None
        shape = _high_rank_input(node)
        outs = [_graph.static_shape(o) for o in node.outputs]
        if shape is None or any(o is None for o in outs):
            return None
        attr = node.attributes.get("axis")
        axis = (attr.as_int() if attr is not None else 0) % len(shape)
        view = [math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])]
        return view, [cast(tuple[int, ...], o) for o in outs]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_split")
        changed = False
        for node, (view, outs) in self.matched(graph):
            x = _reshape(graph, names, node, cast(ir.Value, node.inputs[0]), view)
            sizes = [math.prod(o) // (view[0] * view[2]) for o in outs]
            split = _graph.add_initializer(graph, names("sizes"), np.array(sizes, dtype=np.int64))
            parts = [_graph.new_value(names("part"), x.dtype, [view[0], s, view[2]]) for s in sizes]
            attrs = [ir.AttrInt64("axis", 1)]
            graph.insert_before(node, ir.Node("", "Split", [x, split], attributes=attrs, outputs=parts))
            for old, part, shape in zip(node.outputs, parts, outs, strict=True):
                _graph.replace_value(graph, old, _reshape(graph, names, node, part, shape))
            graph.remove(node, safe=True)
            changed = True
        return changed


@register(order=67)
class ProductViewTransposedAtRank4(FoldHighRankTranspose):
    """Rewrite ``MatMul -> Reshape to rank 5 -> Transpose -> Reshape`` at rank 4 when the permutation allows.

    Attention's ``probs @ v`` at rank 3, ``[8, 16, 16]``, viewed as ``[1, 2, 4, 16, 16]`` to move its heads
    (Hiera's mask units) is a Reshape to rank 5 ``[..., N, k]`` of a MatMul's ``[..., N]`` product, a form that stops
    the process in QNN HTP and that qnnx-opcheck refuses. Merging the axes the Transpose keeps together and dropping
    the axes of size 1 (which order nothing) moves the same elements to the same places through a rank-4 view,
    which that refusal does not cover: :class:`FoldHighRankTranspose`'s rewrite, on another match. Exact (data
    movement only). Only that refused form is rewritten: other rank-5 chains run as they are.
    """

    name = "product_view_transposed_at_rank4"
    defect = (
        "a Reshape to rank 5 [..., N, k] of a MatMul's product stops the process in QNN HTP and is refused: "
        "attention's product viewed at rank 5 to move its heads (Hiera) had every Reshape pinned to the CPU EP"
    )

    def match(self, node: ir.Node) -> tuple[ir.Node, list[int], list[int]] | None:
        """The refused view, the merged shape and permutation (the fold's rewrite then makes them), or None."""
        if not _graph.is_op(node, "Transpose"):
            return None
        view_out = node.inputs[0]
        view = view_out.producer() if view_out is not None else None
        if view is None or view_out is None or len(list(view_out.uses())) != 1:
            return None
        product, shape = _graph.product_viewed_at_rank5(view), _graph.static_shape(view_out)
        if product is None or shape is None or not _graph.read_only_by_reshapes(node.outputs[0]):
            return None  # not the refused form
        perm = _graph.transpose_perm(node, len(shape))
        merged, merged_perm = coalesce_axes(shape, perm, drop_unit_axes=True)
        if len(merged) >= _MAX_HTP_RANK:
            return None
        return view, merged, merged_perm


@register(order=68)
class ConcatBeforeProductView(QnnPass):
    """Join rank-5 views on their last axis before viewing them, when one of them is a refused view of a product.

    Global-local attention (Pegasus-X) computes its two score blocks at rank 3 and views each at rank 5, ``bmm ->
    [2, 512, 512] -> view [1, 2, 1, 512, 512]``, then joins them on the last axis: a Reshape to rank 5 ``[..., N,
    k]`` of a MatMul's ``[..., N]`` product, the form that stops the process in QNN HTP and that qnnx-opcheck
    refuses, and the pinned Reshape type took the graph below half on QNN. Views that keep the last axis keep their
    rows, so each input is taken as ``[rows, last]`` (its view's source, reshaped), the rows are joined at rank 2
    and one Reshape gives the joined rank-5 shape: the same elements in the same places, exact. Only a Concat with
    such a view among its inputs is rewritten: other graphs keep theirs.
    """

    name = "concat_before_product_view"
    defect = (
        "a Reshape to rank 5 [..., N, k] of a MatMul's product stops the process in QNN HTP and is refused: "
        "global-local attention (Pegasus-X) joined such views and had every Reshape pinned to the CPU EP"
    )

    def match(self, node: ir.Node) -> list[tuple[ir.Value, int]] | None:
        """Each input's row source and its last dim, or None when the node is not the refused form."""
        if not _graph.is_op(node, "Concat"):
            return None
        out = _graph.static_shape(node.outputs[0])
        if out is None or len(out) != _MAX_HTP_RANK or node.attributes.get_int("axis", 0) % len(out) != len(out) - 1:
            return None
        sources: list[tuple[ir.Value, int]] = []
        refused = False
        for x in node.inputs:
            shape = _graph.static_shape(x)
            if x is None or shape is None or len(shape) != len(out):
                return None
            view = x.producer()
            source = view.inputs[0] if view is not None and _graph.is_op(view, "Reshape") else None
            kept = _graph.static_shape(source)
            if view is not None and source is not None and kept and kept[-1] == shape[-1] and len(list(x.uses())) == 1:
                refused = refused or _graph.product_viewed_at_rank5(view) is not None
                sources.append((source, shape[-1]))
            else:
                sources.append((x, shape[-1]))
        return sources if refused else None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_concat_first")
        changed = False
        for node, sources in self.matched(graph):
            out = cast(tuple[int, ...], _graph.static_shape(node.outputs[0]))
            rows = math.prod(out[:-1])
            parts = [_reshape(graph, names, node, x, (rows, last)) for x, last in sources]
            joined = _graph.new_value(names("rows"), parts[0].dtype, (rows, out[-1]))
            graph.insert_before(
                node, ir.Node("", "Concat", parts, attributes=[ir.AttrInt64("axis", 1)], outputs=[joined])
            )
            _replaced(graph, node, _reshape(graph, names, node, joined, out))
            changed = True
        return changed


# ------------------------------------------------------------- rank-5 broadcasting that QNN HTP gets wrong

# Ops whose rank-5 broadcasting of a rank-5 operand QNN HTP mishandles (measured: Where wrong, Pow a crash; Add, Sub,
# Mul and Div right).
_RANK5_BROADCAST_OPS = frozenset({"Where", "Pow"})


def _without_leading_ones(shape: tuple[int, ...]) -> list[int]:
    """``shape`` without its leading 1s (``[1]`` for a shape of 1s only): the same broadcast, at a lower rank."""
    first = next((i for i, d in enumerate(shape) if d != 1), len(shape) - 1)
    return list(shape[first:])


def _fix(op_type: str, value: ir.Value | None, shape: tuple[int, ...], out: tuple[int, ...]) -> str | None:
    """How a rank-5 operand of a Where or Pow that broadcasts to ``out`` is made safe: ``"expand"`` (to ``out``), or
    for a bool one, which the QNN EP does not expand, ``"squeeze"`` (its leading 1s dropped: a lower-rank operand;
    lower-rank float operands can fail QNN's graph finalize); None when there is nothing to do or nothing possible."""
    if value is None or len(shape) != _MAX_HTP_RANK or shape == out:
        return None
    if value.dtype != ir.DataType.BOOL:
        return "expand"
    return "squeeze" if op_type == "Where" and shape[0] == 1 else None


@register(order=163)
class BroadcastAtRank5Expanded(QnnPass):
    """Give a rank-5 Where or Pow no rank-5 operand that broadcasts (a rank-5 shape other than the output's): expand
    such an operand to the output's shape, or for a bool condition, which the QNN EP does not expand, drop its
    leading 1s (a Reshape to a lower rank).

    QNN HTP computes such a Where wrongly (``x.masked_fill(mask, v)`` with ``x[2, 3, 4, 2, 3]`` and
    ``mask[1, 3, 1, 2, 3]`` came back 1.07 of the output's scale off; 45 of 120 random classes of rank-5 operands
    wrong) and stops the process on such a Pow (SIGSEGV at the first run, ``x ** e`` with ``e[1, 3, 1, 1, 3]``),
    while operands of the output's shape, scalars and conditions of lower rank are right in every class measured,
    and so is Expand (onnxruntime-qnn 2.7.0, soc 60). ONNX broadcasting aligns shapes on the right, so dropping
    leading 1s changes no element's place: exact. A bool condition whose first axis is not 1 is left as it is:
    qnnx-opcheck refuses that node.
    """

    name = "rank5_broadcast_expanded"
    defect = "QNN HTP computes Where wrongly, and stops the process on Pow, when a rank-5 operand broadcasts"

    def match(self, node: ir.Node) -> tuple[tuple[int, ...], list[str | None]] | None:
        """The static rank-5 output shape of a Where or Pow and, per input, how it is made safe (None: as it is);
        None when no input needs it."""
        if node.op_type not in _RANK5_BROADCAST_OPS or node.domain not in ("", "ai.onnx"):
            return None
        out = _graph.static_shape(node.outputs[0])
        if out is None or len(out) != _MAX_HTP_RANK:
            return None
        fixes = [
            _fix(node.op_type, v, s, out) if (s := _graph.static_shape(v)) is not None else None for v in node.inputs
        ]
        return (out, fixes) if any(fixes) else None

    def rewrite(self, graph: ir.Graph) -> bool:
        def computed(
            names: UniqueNames, node: ir.Node, found: tuple[tuple[int, ...], list[str | None]]
        ) -> tuple[list[ir.Node], ir.Value]:
            out, fixes = found
            nodes: list[ir.Node] = []
            inputs: list[ir.Value | None] = []
            for v, fix in zip(node.inputs, fixes, strict=True):
                if fix is None or v is None:
                    inputs.append(v)
                    continue
                shape = cast(tuple[int, ...], _graph.static_shape(v))
                target = list(out) if fix == "expand" else _without_leading_ones(shape)
                const = _graph.add_initializer(graph, names("shape"), np.array(target, dtype=np.int64))
                new = _graph.new_value(names(fix), v.dtype, target)
                nodes.append(ir.Node("", "Expand" if fix == "expand" else "Reshape", [v, const], outputs=[new]))
                inputs.append(new)
            last, value = _graph.one_node_like(names, "out", node, node.op_type, inputs)
            return [*nodes, *last], value

        return self.replace_matched(graph, "qnnx_rank5", computed)
