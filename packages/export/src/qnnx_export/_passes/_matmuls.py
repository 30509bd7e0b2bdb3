"""MatMul forms QNN HTP takes in place of what it fails or computes wrongly: Einsum as a MatMul, a flattened
projection into heads, a MatMul of heads merged back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx_ir as ir

from qnnx_clikit import merges_heads
from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "EinsumAsMatMul",
    "EinsumPlan",
    "FlattenMergedHeadsMatMul",
    "LinearIntoHeadsAsMatMul",
    "plan_einsum",
]

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
        if not _graph.is_op(node, "Einsum") or len(node.inputs) != 2:
            return None
        shapes = tuple(_graph.static_shape(v) for v in node.inputs)
        if shapes[0] is None or shapes[1] is None:
            return None
        return plan_einsum(node.attributes.get_string("equation", ""), (shapes[0], shapes[1]))

    def rewrite(self, graph: ir.Graph) -> bool:
        def as_matmul(names: UniqueNames, node: ir.Node, plan: EinsumPlan) -> tuple[list[ir.Node], ir.Value]:
            nodes: list[ir.Node] = []
            dtype = node.outputs[0].dtype

            def emit(op: str, inputs: list[ir.Value], shape: list[int], attrs: list[ir.Attr] | None = None) -> ir.Value:
                out = _graph.new_value(names(op.lower()), dtype, shape)
                nodes.append(ir.Node("", op, inputs, attributes=attrs or [], outputs=[out]))
                return out

            def ints(values: list[int] | tuple[int, ...]) -> ir.Value:
                return _graph.add_initializer(graph, names("ints"), np.array(values, dtype=np.int64))

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
        if not _graph.is_op(node, "Gemm") or len(node.inputs) < 2:
            return None
        attrs = {name: attr.value for name, attr in node.attributes.items()}
        if attrs.get("transA", 0) != 0 or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            return None
        weight = _graph.const_array(node.inputs[1])
        if weight is None or weight.ndim != 2:
            return None
        weight = weight.T if attrs.get("transB", 0) else weight
        k, n = weight.shape
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None and (_graph.static_shape(bias) not in ((n,), (1, n))):
            return None
        flatten = _graph.input_producer(node, 0)
        x = flatten.inputs[0] if _graph.is_op(flatten, "Reshape") and flatten is not None else None
        lead = _graph.static_shape(x)
        if x is None or lead is None or len(lead) != 3 or lead[-1] != k:
            return None
        if _graph.static_shape(node.inputs[0]) != (math.prod(lead[:-1]), k):
            return None
        out = node.outputs[0]
        uses = list(out.uses())
        if out.is_graph_output() or len(uses) != 1 or not _graph.is_op(uses[0].node, "Reshape") or uses[0].idx != 0:
            return None
        last = uses[0].node
        shape = _graph.static_shape(last.outputs[0])
        if shape is None:
            return None
        if shape == (*lead[:-1], n):  # unflattened: one of its uses splits it into heads
            split = any(
                _graph.is_op(u.node, "Reshape") and _splits_heads(lead[:-1], n, _graph.static_shape(u.node.outputs[0]))
                for u in last.outputs[0].uses()
            )
            return (x, weight, bias, last, False) if split else None
        return (x, weight, bias, last, True) if _splits_heads(lead[:-1], n, shape) else None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_heads")
        matched = self.matched(graph)
        for _gemm, (x, weight, bias, last, splits) in matched:
            lead = cast(tuple[int, ...], _graph.static_shape(x))
            shape = (*lead[:-1], weight.shape[1])
            w = _graph.add_initializer(graph, names("weight"), np.ascontiguousarray(weight))
            product = _graph.new_value(names("matmul"), x.dtype, shape)
            nodes = [ir.Node("", "MatMul", [x, w], outputs=[product])]
            result = product
            if bias is not None:
                result = _graph.new_value(names("biased"), x.dtype, shape)
                nodes.append(ir.Node("", "Add", [product, bias], outputs=[result]))
            graph.insert_before(last, nodes)
            if splits:
                last.replace_input_with(0, result)
            else:
                _graph.replace_value(graph, last.outputs[0], result)
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
        if not _graph.is_op(node, "MatMul"):
            return None
        a, b = node.inputs[0], node.inputs[1]
        a_shape, b_shape = _graph.static_shape(a), _graph.static_shape(b)
        if a is None or a_shape is None or b_shape is None or len(b_shape) != 2:
            return None
        # ONNX Runtime merges consecutive Reshapes before QNN sees them: any source up the chain counts.
        merge = _graph.input_producer(node, 0)
        sources: list[tuple[int, ...] | None] = []
        while _graph.is_op(merge, "Reshape") and len(sources) < 16:
            sources.append(_graph.static_shape(cast(ir.Node, merge).inputs[0]))
            merge = _graph.input_producer(cast(ir.Node, merge), 0)
        if not any(merges_heads(source, a_shape) for source in sources):
            return None
        if _graph.static_shape(node.outputs[0]) is None:
            return None
        return a, math.prod(a_shape[:-1]), a_shape[-1]

    def rewrite(self, graph: ir.Graph) -> bool:
        def flat(names: UniqueNames, node: ir.Node, plan: tuple[ir.Value, int, int]) -> tuple[list[ir.Node], ir.Value]:
            a, rows, k = plan
            out = node.outputs[0]
            out_shape = cast(tuple[int, ...], _graph.static_shape(out))
            view = _graph.new_value(names("rows"), a.dtype, (rows, k))
            product = _graph.new_value(names("matmul"), out.dtype, (rows, out_shape[-1]))
            result = _graph.new_value(names("out"), out.dtype, out_shape)
            to_rows = _graph.add_initializer(graph, names("shape"), np.array([rows, k], dtype=np.int64))
            back = _graph.add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            nodes = [
                ir.Node("", "Reshape", [a, to_rows], outputs=[view]),
                ir.Node("", "MatMul", [view, node.inputs[1]], outputs=[product]),
                ir.Node("", "Reshape", [product, back], outputs=[result]),
            ]
            return nodes, result

        return self.replace_matched(graph, "qnnx_flat_mm", flat)
