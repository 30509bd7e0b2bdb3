"""Shape and layout rewrites: batch tiling, rank <= 5 transposes, GatherND, Gather by runtime indices, int64
Unsqueeze, empty Concat inputs, Einsum as MatMul, a flattened projection into heads, a MatMul of heads merged back."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes._base import QnnPass, register
from qnnx_export._passes._graph import (
    add_initializer,
    const_array,
    fresh_names,
    input_producer,
    is_op,
    new_value,
    replace_value,
    static_shape,
)

__all__ = [
    "DropEmptyConcatInputs",
    "EinsumAsMatMul",
    "FlattenMergedHeadsMatMul",
    "FoldHighRankTranspose",
    "GatherNDToGather",
    "GatherRuntimeIndicesAsRows",
    "LinearIntoHeadsAsMatMul",
    "TileLayerNormBroadcast",
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
            if not is_op(node, "LayerNormalization"):
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
        out_shape = static_shape(node.outputs[0])
        if out_shape is None or len(out_shape) < 2 or out_shape[0] <= 1:
            return []
        bad = []
        for i, inp in enumerate(node.inputs):
            shape = static_shape(inp)
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
        names = fresh_names(graph, "qnnx_tile")
        changed = False
        for node in self._feeding_nodes(graph):
            for i, shape, out_shape in self._bad_operands(node):
                value = cast(ir.Value, node.inputs[i])  # an operand with a static shape: never a missing input
                batch = out_shape[0]
                aligned = (1,) * (len(out_shape) - len(shape)) + shape
                array = const_array(value)
                if array is not None:
                    tiled = np.ascontiguousarray(np.broadcast_to(array.reshape(aligned), (batch, *aligned[1:])))
                    new = add_initializer(graph, names(value.name or "const"), tiled)
                else:
                    if len(shape) != len(out_shape):
                        reshaped = new_value(names("reshaped"), value.dtype, aligned)
                        target = add_initializer(graph, names("shape"), np.array(aligned, dtype=np.int64))
                        graph.insert_before(node, ir.Node("", "Reshape", [value, target], outputs=[reshaped]))
                        value = reshaped
                    repeats = add_initializer(
                        graph, names("repeats"), np.array([batch] + [1] * (len(out_shape) - 1), dtype=np.int64)
                    )
                    new = new_value(names("tiled"), value.dtype, (batch, *aligned[1:]))
                    graph.insert_before(node, ir.Node("", "Tile", [value, repeats], outputs=[new]))
                node.replace_input_with(i, new)
                changed = True
        return changed


# ------------------------------------------------------------- rank > 5 Reshape/Transpose/Reshape -> rank <= 5

_MAX_HTP_RANK = 5


def _coalesce(shape: tuple[int, ...], perm: list[int]) -> tuple[list[int], list[int]]:
    """Merge input axes that stay next to each other, in order, after the transpose.

    Returns the merged input shape and the permutation of the merged axes; transposing the merged tensor moves
    the same elements to the same places as the original transpose.
    """
    groups: list[list[int]] = []
    for axis in perm:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # merged axes in input order
    merged_shape = [math.prod(shape[a] for a in groups[g]) for g in order]
    position = {g: i for i, g in enumerate(order)}
    return merged_shape, [position[g] for g in range(len(groups))]


@register(order=60)
class FoldHighRankTranspose(QnnPass):
    """Rewrite ``Reshape -> Transpose -> Reshape`` through a rank-6+ tensor with the same chain at rank <= 5.

    QNN HTP takes tensors of rank <= 5 only. Swin's window partition and reverse (``view(B, H/w, w, W/w, w, C)
    .permute(0, 1, 3, 2, 4, 5)``) go through rank 6, but the axes that the permutation keeps together can be
    merged first: the merged transpose moves the same elements to the same places, so the rewrite is exact.
    """

    name = "fold_high_rank_transpose"
    defect = "rank-6 tensors are refused by QNN HTP (Swin window partition)"

    def match(self, node: ir.Node) -> tuple[ir.Node, list[int], list[int]] | None:
        if not is_op(node, "Transpose"):
            return None
        src = node.inputs[0]
        first = src.producer() if src is not None else None
        shape = static_shape(src)
        if first is None or first.op_type != "Reshape" or shape is None or len(shape) <= _MAX_HTP_RANK:
            return None
        uses = list(node.outputs[0].uses())
        if (
            node.outputs[0].is_graph_output()
            or not uses
            or any(u.node.op_type != "Reshape" or u.idx != 0 for u in uses)
        ):
            return None
        perm_attr = node.attributes.get("perm")
        perm = list(perm_attr.as_ints()) if perm_attr is not None else list(reversed(range(len(shape))))
        merged_shape, merged_perm = _coalesce(shape, perm)
        if len(merged_shape) > _MAX_HTP_RANK:
            return None
        return first, merged_shape, merged_perm

    def rewrite(self, graph: ir.Graph) -> bool:
        names = fresh_names(graph, "qnnx_rank")
        changed = False
        for node, (first, merged_shape, merged_perm) in self.matched(graph):
            x = cast(ir.Value, first.inputs[0])  # match read its shape
            target = add_initializer(graph, names("shape"), np.array(merged_shape, dtype=np.int64))
            flat = new_value(names("merged"), x.dtype, merged_shape)
            moved_shape = [merged_shape[a] for a in merged_perm]
            moved = new_value(names("moved"), x.dtype, moved_shape)
            new_nodes = [
                ir.Node("", "Reshape", [x, target], outputs=[flat]),
                ir.Node("", "Transpose", [flat], attributes=[ir.AttrInt64s("perm", merged_perm)], outputs=[moved]),
            ]
            graph.insert_after(node, new_nodes)
            for use in list(node.outputs[0].uses()):
                use.node.replace_input_with(0, moved)
            changed = True
        return changed


# ---------------------------------------------------------------------- zero-width Concat inputs dropped


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
        shape = static_shape(value)
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
            names = fresh_names(graph, "qnnx_concat")
            out = node.outputs[0]
            new = new_value(names("out"), out.dtype, static_shape(out))
            axis = node.attributes.get_int("axis", 0)
            replacement = (
                ir.Node("", "Identity", kept, outputs=[new])
                if len(kept) == 1
                else ir.Node("", "Concat", kept, attributes=[ir.AttrInt64("axis", axis)], outputs=[new])
            )
            graph.insert_after(node, replacement)
            replace_value(graph, out, new)
        return bool(nodes)


# ----------------------------------------------------------------------------- GatherND -> Gather


@register(order=10)
class GatherNDToGather(QnnPass):
    """Rewrite ``GatherND`` (``batch_dims=0``) into ``Reshape`` + ``Gather`` (or a bare ``Reshape``).

    Two QNN HTP defects (onnxruntime-qnn 2.7.0, soc_model 60):

    - GatherND on bool, int64 and uint8 data is rejected ("Failed to create GatherND node"), and Hugging Face's
      attention-mask code emits it on a bool mask (``padding_mask[batch_idx, kv_idx]``).
    - GatherND by *runtime* indices is silently wrong when the indices hold more than 8 tuples along their
      second-to-last axis and each tuple selects a slice of rank 2: output row ``k`` is the slice of index tuple
      ``k % 8``. Data ``[4, 16, 32]`` by indices ``[32, 1]`` (an MoE layer picking expert weights, ``w[ids]``
      in PyTorch), ``[4, 5, 6]`` by ``[9, 1]``, ``[4, 3, 5, 6]`` by ``[16, 2]``: wrong; by ``[8, 1]``, ``[4, 8, 1]``
      or with rank-1 or rank-3 slices: right.

    With constant indices the gather is a plain Gather of flattened row indices. With runtime indices whose last
    dim is 1 it is a Gather along axis 0 by the indices without their last axis (right on HTP for runtime indices,
    negative ones included). Both are exact: the same elements are selected.
    """

    name = "gathernd_to_gather"
    defect = "GatherND is rejected on bool data and wrong by runtime indices with more than 8 rank-2 slices on QNN HTP"

    @staticmethod
    def _plan(node: ir.Node) -> tuple[np.ndarray | None, tuple[int, ...], tuple[int, ...]] | None:
        if node.op_type != "GatherND":
            return None
        batch_dims = node.attributes.get("batch_dims")
        if batch_dims is not None and batch_dims.as_int() != 0:
            return None
        data_shape = static_shape(node.inputs[0])
        indices = const_array(node.inputs[1])
        if data_shape is None or indices is None or indices.ndim < 1:
            return GatherNDToGather._runtime_plan(node, data_shape)
        m = indices.shape[-1]
        if m > len(data_shape) or m == 0:
            return None
        dims = np.array(data_shape[:m], dtype=np.int64)
        idx = indices.astype(np.int64)
        idx = np.where(idx < 0, idx + dims, idx)
        if (idx < 0).any() or (idx >= dims).any():
            return None  # out of range: leave the node, ORT will report it
        # Row-major strides of the indexed leading block: strides[k] = prod(dims[k + 1 :]).
        strides = np.ones(m, dtype=np.int64)
        for k in range(m - 2, -1, -1):
            strides[k] = strides[k + 1] * dims[k + 1]
        flat = (idx * strides).sum(axis=-1)
        rows = int(np.prod(dims))
        return flat, (rows, *data_shape[m:]), tuple(indices.shape[:-1]) + tuple(data_shape[m:])

    @staticmethod
    def _runtime_plan(
        node: ir.Node, data_shape: tuple[int, ...] | None
    ) -> tuple[None, tuple[int, ...], tuple[int, ...]] | None:
        """For runtime indices of static shape ``[..., 1]``: the indices' shape without their last axis, and the
        output's shape."""
        index_shape = static_shape(node.inputs[1])
        if data_shape is None or not data_shape or index_shape is None or not index_shape or index_shape[-1] != 1:
            return None
        if const_array(node.inputs[1]) is not None:
            return None  # constant indices of another form: out of range or empty, left to ORT
        return None, index_shape[:-1], (*index_shape[:-1], *data_shape[1:])

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "GatherND" for n in graph if self._plan(n) is not None]

    @staticmethod
    def _rewrite_runtime(
        graph: ir.Graph, node: ir.Node, rows_shape: tuple[int, ...], out_shape: tuple[int, ...], names: UniqueNames
    ) -> None:
        data, indices, out = (cast(ir.Value, v) for v in (*node.inputs, node.outputs[0]))
        target = add_initializer(graph, names("index_shape"), np.array(rows_shape, dtype=np.int64))
        rows = new_value(names("index"), indices.dtype, rows_shape)
        result = new_value(names("out"), out.dtype, out_shape)
        graph.insert_before(node, ir.Node("", "Reshape", [indices, target], outputs=[rows]))
        graph.insert_before(
            node, ir.Node("", "Gather", [data, rows], attributes=[ir.AttrInt64("axis", 0)], outputs=[result])
        )
        replace_value(graph, out, result)

    def rewrite(self, graph: ir.Graph) -> bool:
        names = fresh_names(graph, "qnnx_gathernd")
        changed = False
        for node in list(graph):
            plan = self._plan(node)
            if plan is None:
                continue
            flat, flat_shape, out_shape = plan
            if flat is None:
                self._rewrite_runtime(graph, node, flat_shape, out_shape, names)
                changed = True
                continue
            data, out = cast(ir.Value, node.inputs[0]), node.outputs[0]  # _plan read its shape
            rows = add_initializer(graph, names("rows_shape"), np.array(flat_shape, dtype=np.int64))
            flat_data = new_value(names("rows"), data.dtype, flat_shape)
            new_nodes = [ir.Node("", "Reshape", [data, rows], outputs=[flat_data])]
            if flat.size == flat_shape[0] and np.array_equal(flat.reshape(-1), np.arange(flat_shape[0])):
                # The gather selects every row in order: only a reshape.
                final_shape = add_initializer(graph, names("out_shape"), np.array(out_shape, dtype=np.int64))
                result = new_value(names("out"), out.dtype, out_shape)
                new_nodes.append(ir.Node("", "Reshape", [flat_data, final_shape], outputs=[result]))
            else:
                index = add_initializer(graph, names("index"), flat.astype(np.int32))
                result = new_value(names("out"), out.dtype, out_shape)
                new_nodes.append(
                    ir.Node("", "Gather", [flat_data, index], attributes=[ir.AttrInt64("axis", 0)], outputs=[result])
                )
            for n in new_nodes:
                graph.insert_before(node, n)
            replace_value(graph, out, result)
            changed = True
        return changed


# ------------------------------------------------------------------------------ Gather by runtime indices


@register(order=30)
class GatherRuntimeIndicesAsRows(QnnPass):
    """Gather by runtime indices along an inner axis as a gather of rows: data ``[A, N, B]`` (``A`` and ``B`` the
    products of the dims before and after the axis) is transposed to ``[N, A*B]``, gathered along axis 0 by the
    flattened indices and brought back to the output's shape.

    QNN HTP's Gather by runtime indices is wrong, silently, along an inner axis when a dim before it is larger
    than 1: ``[2, 16, 64]`` along axis 1 by 4 indices, ``[3, 3, 5]`` along axis 1, ``[2, 5, 8, 3]`` along axis 2 by a
    scalar index, ``[3, 1, 1]`` along axis 1; also along the last axis by indices of rank >= 2 when the output
    reaches rank 5. Along axis 0 (any index rank) and along the last axis by 0-D or 1-D indices it is right, and so
    is every Gather by constant indices (onnxruntime-qnn 2.7.0, soc_model 60). The rewrite only moves elements
    (exact); it needs static shapes, and leaves the node alone without them.
    """

    name = "gather_runtime_indices_as_rows"
    defect = "Gather by runtime indices along an inner axis is wrong on QNN HTP when a dim before the axis is > 1"

    def match(self, node: ir.Node) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
        if not is_op(node, "Gather") or len(node.inputs) != 2:
            return None
        data, indices = node.inputs
        if data is None or indices is None or const_array(indices) is not None:
            return None
        data_shape, index_shape = static_shape(data), static_shape(indices)
        if data_shape is None or index_shape is None or not data_shape:
            return None
        attr = node.attributes.get("axis")
        axis = attr.as_int() if attr is not None else 0
        axis = axis + len(data_shape) if axis < 0 else axis
        if not 0 <= axis < len(data_shape) or math.prod(data_shape[:axis]) == 1:
            return None  # along the leading axis (or after unit dims only): right as it is
        if axis == len(data_shape) - 1 and len(index_shape) <= 1:
            return None  # along the last axis by 0-D or 1-D indices: right as it is
        return axis, data_shape, index_shape

    def rewrite(self, graph: ir.Graph) -> bool:
        names = fresh_names(graph, "qnnx_gather_rows")
        matched = self.matched(graph)
        for node, (axis, data_shape, index_shape) in matched:
            _Rows(graph, node, names).gather(axis, data_shape, index_shape)
        return bool(matched)


class _Rows:
    """Writes the row-gather form of one Gather node, each new node inserted before it."""

    def __init__(self, graph: ir.Graph, node: ir.Node, names: UniqueNames) -> None:
        self.graph, self.node, self.names = graph, node, names
        self.dtype = cast(ir.Value, node.inputs[0]).dtype

    def _emit(self, op: str, inputs: list[ir.Value], shape: tuple[int, ...], **attrs: Any) -> ir.Value:
        result = new_value(self.names(op.lower()), self.dtype, shape)
        attributes = [ir.AttrInt64s(k, v) if isinstance(v, list) else ir.AttrInt64(k, v) for k, v in attrs.items()]
        self.graph.insert_before(self.node, ir.Node("", op, inputs, attributes=attributes, outputs=[result]))
        return result

    def _reshape(self, source: ir.Value, shape: tuple[int, ...]) -> ir.Value:
        target = add_initializer(self.graph, self.names("shape"), np.array(shape, dtype=np.int64))
        return self._emit("Reshape", [source, target], shape)

    def gather(self, axis: int, data_shape: tuple[int, ...], index_shape: tuple[int, ...]) -> None:
        data, indices, out = (cast(ir.Value, v) for v in (*self.node.inputs, self.node.outputs[0]))
        before, size, after = math.prod(data_shape[:axis]), data_shape[axis], math.prod(data_shape[axis + 1 :])
        count = math.prod(index_shape)
        blocks = self._emit(
            "Transpose", [self._reshape(data, (before, size, after))], (size, before, after), perm=[1, 0, 2]
        )
        rows = self._reshape(blocks, (size, before * after))
        flat_shape = add_initializer(self.graph, self.names("flat_shape"), np.array([count], dtype=np.int64))
        flat = new_value(self.names("flat_indices"), indices.dtype, (count,))
        self.graph.insert_before(self.node, ir.Node("", "Reshape", [indices, flat_shape], outputs=[flat]))
        picked = self._emit("Gather", [rows, flat], (count, before * after), axis=0)
        picked = self._reshape(picked, (count, before, after))
        back = self._emit("Transpose", [picked], (before, count, after), perm=[1, 0, 2])
        result = self._reshape(back, (*data_shape[:axis], *index_shape, *data_shape[axis + 1 :]))
        replace_value(self.graph, out, result)


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
        names = fresh_names(graph, "qnnx_unsqueeze")
        changed = False
        unknown: list[str] = []
        for node in self._targets(graph):
            out_shape = static_shape(node.outputs[0])
            if out_shape is None:
                unknown.append(node.name or "Unsqueeze")
                continue
            target = add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            result = new_value(names("out"), node.outputs[0].dtype, out_shape)
            graph.insert_before(node, ir.Node("", "Reshape", [node.inputs[0], target], outputs=[result]))
            replace_value(graph, node.outputs[0], result)
            changed = True
        if unknown:
            log.warning("unsqueeze_int64_to_reshape: output shape unknown for %s; left unchanged", unknown)
        return changed


# ------------------------------------------------------------------------------------ Einsum as a MatMul


@dataclass(frozen=True)
class EinsumPlan:
    """How :class:`EinsumAsMatMul` writes one two-operand Einsum: the axes each operand sums away alone (letters
    in neither the other operand nor the output), the letters left in each operand, and the output's letters split
    into batch (in both operands), free (in one) and contracted (in both operands, not in the output)."""

    sums: tuple[tuple[int, ...], tuple[int, ...]]
    terms: tuple[str, str]
    batch: str
    left: str
    right: str
    contracted: str
    output: str
    sizes: dict[str, int]


def plan_einsum(equation: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> EinsumPlan | None:
    """The matmul form of ``equation`` over operands of static ``shapes``, or None for what it does not take:
    ellipses, an implicit output, a letter repeated within a term (a diagonal), a letter whose sizes differ."""
    text = equation.replace(" ", "")
    if "..." in text or "->" not in text:
        return None
    lhs, out = text.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not all(t.isalpha() for t in terms) or not (out.isalpha() or not out):
        return None
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)) or any(len(t) != len(s) for t, s in zip(terms, shapes)):
        return None
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for letter, size in zip(term, shape):
            if sizes.setdefault(letter, size) != size:
                return None
    if any(c not in sizes for c in out):
        return None
    kept = (set(out) | set(b), set(out) | set(a))
    sums = tuple(tuple(i for i, c in enumerate(t) if c not in keep) for t, keep in zip(terms, kept))
    reduced = tuple("".join(c for c in t if c in keep) for t, keep in zip(terms, kept))
    return EinsumPlan(
        sums=(sums[0], sums[1]),
        terms=(reduced[0], reduced[1]),
        batch="".join(c for c in out if c in a and c in b),
        left="".join(c for c in out if c in a and c not in b),
        right="".join(c for c in out if c in b and c not in a),
        contracted="".join(c for c in a if c in b and c not in out),
        output=out,
        sizes=sizes,
    )


@register(order=75)
class EinsumAsMatMul(QnnPass):
    """Write a two-operand ``Einsum`` as ``ReduceSum`` of the letters only one operand has, ``Transpose`` +
    ``Reshape`` of each operand to ``[batch, M, K]`` and ``[batch, K, N]``, one ``MatMul`` and the way back to the
    output's layout.

    The QNN EP takes an Einsum only when its equation is already a MatMul (optionally with the right operand
    transposed, or one 4-D form transposed throughout); any other equation, such as XLNet's and Funnel's relative
    attention (``bind,bjnd->bnij``, ``binh,tnh->bnit``), made it decline the node and the graph could not run wholly
    on QNN. The rewrite computes the same sums of products in another order of operations: exact up to float
    rounding. Static shapes only; ellipses, diagonals and broadcast letters are left as they are.
    """

    name = "einsum_as_matmul"
    defect = "the QNN EP declines an Einsum whose equation is not already a MatMul (XLNet, Funnel relative attention)"

    def match(self, node: ir.Node) -> EinsumPlan | None:
        if not is_op(node, "Einsum") or len(node.inputs) != 2:
            return None
        shapes = tuple(static_shape(v) for v in node.inputs)
        if shapes[0] is None or shapes[1] is None:
            return None
        return plan_einsum(node.attributes.get_string("equation", ""), (shapes[0], shapes[1]))

    def rewrite(self, graph: ir.Graph) -> bool:
        def as_matmul(names: UniqueNames, node: ir.Node, plan: EinsumPlan) -> tuple[list[ir.Node], ir.Value]:
            nodes: list[ir.Node] = []
            dtype = node.outputs[0].dtype

            def emit(op: str, inputs: list[ir.Value], shape: list[int], attrs: list[ir.Attr] | None = None) -> ir.Value:
                out = new_value(names(op.lower()), dtype, shape)
                nodes.append(ir.Node("", op, inputs, attributes=attrs or [], outputs=[out]))
                return out

            def ints(values: list[int] | tuple[int, ...]) -> ir.Value:
                return add_initializer(graph, names("ints"), np.array(values, dtype=np.int64))

            def dims(letters: str) -> list[int]:
                return [plan.sizes[c] for c in letters]

            def laid_out(x: ir.Value, have: str, want: str) -> ir.Value:
                if have == want:
                    return x
                return emit("Transpose", [x], dims(want), [ir.AttrInt64s("perm", [have.index(c) for c in want])])

            def flat(x: ir.Value, *groups: str) -> ir.Value:
                return emit(
                    "Reshape", [x, ints([math.prod(dims(g)) for g in groups])], [math.prod(dims(g)) for g in groups]
                )

            layouts = (plan.batch + plan.left + plan.contracted, plan.batch + plan.contracted + plan.right)
            operands = []
            for k in (0, 1):
                x = cast(ir.Value, node.inputs[k])
                if plan.sums[k]:
                    keep = [ir.AttrInt64("keepdims", 0)]
                    x = emit("ReduceSum", [x, ints(plan.sums[k])], dims(plan.terms[k]), keep)
                operands.append(laid_out(x, plan.terms[k], layouts[k]))
            lhs = flat(operands[0], plan.batch, plan.left, plan.contracted)
            rhs = flat(operands[1], plan.batch, plan.contracted, plan.right)
            sizes = [math.prod(dims(g)) for g in (plan.batch, plan.left, plan.right)]
            product = emit("MatMul", [lhs, rhs], sizes)
            order = plan.batch + plan.left + plan.right
            result = emit("Reshape", [product, ints(dims(order))], dims(order))
            return nodes, laid_out(result, order, plan.output)

        return self.replace_matched(graph, "qnnx_einsum", as_matmul)


# ----------------------------------------------------------------- a flattened projection split into heads


@register(order=35)
class LinearIntoHeadsAsMatMul(QnnPass):
    """Compute a projection split into as many heads as its input's two leading dims at the input's rank:
    ``Reshape(x[A, A, K] -> [A*A, K]) -> Gemm(W, b) -> Reshape -> [A, A, N]`` reshaped into ``[A, A, A, N/A]``
    becomes ``MatMul(x, W) + b`` on ``x`` as it is.

    That flattened form is how a Linear on a rank-3 input is exported (``view -> addmm -> view``). QNN HTP fails to
    finalize it (``QNN_COMMON_ERROR_MEM_ALLOC``) when the split output is ``[A, A, A, D]``: measured for A = 2, 3,
    4, 8 and D = 4 to 32, with or without the bias, with a MatMul in place of the Gemm too, as in a tiny MobileViT
    (``x[4, 4, 24]`` into 4 heads of 6); ``[4, 4, 8, 4]``, ``[4, 4, 3, 8]``, ``[2, 4, 4, 6]``, ``[4, 8, 4, 6]``,
    ``[1, 16, 4, 6]`` and ``[4, 4, 4, 1]`` build (onnxruntime-qnn 2.7.0, soc_model 60). The MatMul at the input's
    rank (as torch.onnx exports a Linear) builds for all of them, and the whole MobileViT then builds. Same
    products and sums, so the result is the Gemm's to float rounding.
    """

    name = "linear_heads_as_matmul"
    defect = (
        "Reshape -> Gemm -> Reshape of a Linear on x[A, A, K] split into [A, A, A, D] fails QNN graph finalize with "
        "QNN_COMMON_ERROR_MEM_ALLOC (a tiny MobileViT)"
    )

    def match(self, node: ir.Node) -> tuple[ir.Value, np.ndarray, ir.Value | None, ir.Node, bool] | None:
        """``(x, weight [K, N], bias, last reshape, whether that reshape splits the heads itself)``, or None."""
        if not is_op(node, "Gemm") or len(node.inputs) < 2:
            return None
        attrs = {name: attr.value for name, attr in node.attributes.items()}
        if attrs.get("transA", 0) != 0 or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            return None
        weight = const_array(node.inputs[1])
        if weight is None or weight.ndim != 2:
            return None
        weight = weight.T if attrs.get("transB", 0) else weight
        k, n = weight.shape
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None and (static_shape(bias) not in ((n,), (1, n))):
            return None
        flatten = input_producer(node, 0)
        x = flatten.inputs[0] if is_op(flatten, "Reshape") and flatten is not None else None
        lead = static_shape(x)
        if x is None or lead is None or len(lead) != 3 or lead[-1] != k:
            return None
        if static_shape(node.inputs[0]) != (math.prod(lead[:-1]), k):
            return None
        out = node.outputs[0]
        uses = list(out.uses())
        if out.is_graph_output() or len(uses) != 1 or not is_op(uses[0].node, "Reshape") or uses[0].idx != 0:
            return None
        last = uses[0].node
        shape = static_shape(last.outputs[0])
        if shape is None:
            return None
        if shape == (*lead[:-1], n):  # unflattened: one of its uses splits it into heads
            split = any(
                is_op(u.node, "Reshape") and _splits_heads(lead[:-1], n, static_shape(u.node.outputs[0]))
                for u in last.outputs[0].uses()
            )
            return (x, weight, bias, last, False) if split else None
        return (x, weight, bias, last, True) if _splits_heads(lead[:-1], n, shape) else None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = fresh_names(graph, "qnnx_heads")
        matched = self.matched(graph)
        for _gemm, (x, weight, bias, last, splits) in matched:
            lead = cast(tuple[int, ...], static_shape(x))
            shape = (*lead[:-1], weight.shape[1])
            w = add_initializer(graph, names("weight"), np.ascontiguousarray(weight))
            product = new_value(names("matmul"), x.dtype, shape)
            nodes = [ir.Node("", "MatMul", [x, w], outputs=[product])]
            result = product
            if bias is not None:
                result = new_value(names("biased"), x.dtype, shape)
                nodes.append(ir.Node("", "Add", [product, bias], outputs=[result]))
            graph.insert_before(last, nodes)
            if splits:
                last.replace_input_with(0, result)
            else:
                replace_value(graph, last.outputs[0], result)
        return bool(matched)


def _splits_heads(lead: tuple[int, ...], n: int, shape: tuple[int, ...] | None) -> bool:
    """``shape`` is ``[A, A, A, n / A]`` for ``lead == (A, A)``, ``A > 1``, with more than one channel per head (the
    class QNN HTP fails to finalize)."""
    return (
        shape is not None
        and len(lead) == 2
        and shape == (*lead, lead[0], n // lead[0])
        and lead[0] == lead[1] > 1
        and n % lead[0] == 0
        and n // lead[0] > 1
    )


# ------------------------------------------------------------- a MatMul of heads merged back, made rank 2


def merged_heads_matmul(a_shape: tuple[int, ...] | None, source: tuple[int, ...] | None) -> bool:
    """Whether a MatMul's left operand of static shape ``a_shape``, reshaped straight from ``source``, is in the
    class QNN HTP computes wrongly (with a rank-2 right operand): ``source`` is ``[A, A, A, D]`` (A > 1) and the
    operand is ``[A, A, A*D]``, with leading 1s or not. qnnx-opcheck's ``merged_heads_matmul`` refuses the same class
    (the packages cannot import each other; integration-tests' test_merged_heads.py holds the two together)."""
    if source is None or a_shape is None or len(source) != 4 or not source[0] == source[1] == source[2] > 1:
        return False
    rows = list(a_shape[:-1])
    while rows and rows[0] == 1:
        rows.pop(0)
    return rows == [source[0], source[1]] and a_shape[-1] == source[2] * source[3]


@register(order=36)
class FlattenMergedHeadsMatMul(QnnPass):
    """Compute ``MatMul(Reshape(x[A, A, A, D] -> [A, A, A*D]), W)`` on the rank-2 view ``[A*A, A*D]`` and reshape the
    product back.

    That is how attention's output projection follows the heads merged back (``context.view(B, N, A*D)`` with as
    many heads as the two leading dims, a tiny MobileViT through torch.onnx): QNN HTP computes the MatMul silently
    wrong there, off by 1.0-2.2 of the output's max (up to 9e3 for ``[3, 3, 3, 5]``) for A = 2, 3, 4, 5, 8 and D = 1
    to 8, also with a leading 1 (``[1, A, A, A*D]``), while an Add or Relu in place of the MatMul, an Add between the
    Reshape and the MatMul, ``[4, 4, 5, 6]``, ``[2, 4, 4, 6]`` and the rank-2 view are right (onnxruntime-qnn
    2.7.0, soc_model 60). The same products and sums, so the result is the MatMul's to float rounding. Only a
    rank-2 right operand (a projection's weight) is taken.
    """

    name = "flatten_merged_heads_matmul"
    defect = (
        "MatMul(Reshape(x[A, A, A, D] -> [A, A, A*D]), W) is silently wrong on QNN HTP (attention's output "
        "projection in a tiny MobileViT through torch.onnx)"
    )

    def match(self, node: ir.Node) -> tuple[ir.Value, int, int] | None:
        """``(left operand, rows, K)`` of a MatMul in the class, or None."""
        if not is_op(node, "MatMul"):
            return None
        a, b = node.inputs[0], node.inputs[1]
        a_shape, b_shape = static_shape(a), static_shape(b)
        if a is None or a_shape is None or b_shape is None or len(b_shape) != 2:
            return None
        # ONNX Runtime merges consecutive Reshapes before QNN sees them: any source up the chain counts.
        merge = input_producer(node, 0)
        sources: list[tuple[int, ...] | None] = []
        while is_op(merge, "Reshape") and len(sources) < 16:
            sources.append(static_shape(cast(ir.Node, merge).inputs[0]))
            merge = input_producer(cast(ir.Node, merge), 0)
        if not any(merged_heads_matmul(a_shape, source) for source in sources):
            return None
        if static_shape(node.outputs[0]) is None:
            return None
        return a, math.prod(a_shape[:-1]), a_shape[-1]

    def rewrite(self, graph: ir.Graph) -> bool:
        def flat(names: UniqueNames, node: ir.Node, plan: tuple[ir.Value, int, int]) -> tuple[list[ir.Node], ir.Value]:
            a, rows, k = plan
            out = node.outputs[0]
            out_shape = cast(tuple[int, ...], static_shape(out))
            view = new_value(names("rows"), a.dtype, (rows, k))
            product = new_value(names("matmul"), out.dtype, (rows, out_shape[-1]))
            result = new_value(names("out"), out.dtype, out_shape)
            to_rows = add_initializer(graph, names("shape"), np.array([rows, k], dtype=np.int64))
            back = add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            nodes = [
                ir.Node("", "Reshape", [a, to_rows], outputs=[view]),
                ir.Node("", "MatMul", [view, node.inputs[1]], outputs=[product]),
                ir.Node("", "Reshape", [product, back], outputs=[result]),
            ]
            return nodes, result

        return self.replace_matched(graph, "qnnx_flat_mm", flat)
