"""Dtype legalization: int64 graph inputs fed as int32 with a range check instead of QNN's silent saturation,
integer-to-bool and float-to-bool casts written as comparisons with zero, bool-to-int64 casts through int32, and
integer remainders through integer division."""

from __future__ import annotations

import logging
from typing import cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "BoolCastToInt64",
    "BoolWhereAsLogic",
    "FloatCastToBool",
    "Int64InputsToInt32",
    "IntCastToBool",
    "IntegerModByDivision",
]

log = logging.getLogger(__name__)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


# ------------------------------------------------------------------------ integer -> bool as x != 0

# The integer dtypes a Cast to bool is rewritten from: the ones QNN HTP computes Equal and Not on (int8 and int16
# inputs are not taken by the QNN EP's Cast at all, uint8 -> bool is right there).
_SIGNED_INTS = (ir.DataType.INT32, ir.DataType.INT64)


@register(order=165)
class IntCastToBool(QnnPass):
    """Write a ``Cast`` of an int32 or int64 tensor to bool as ``Not(Equal(x, 0))``.

    QNN HTP casts a negative integer to bool as False (ONNX and PyTorch: every nonzero value is True): ``x.bool()``
    of [-1, -2, -256, -70000, -2^31] came back all False, alone and feeding Not or a Cast to float, silently
    (onnxruntime-qnn 2.7.0, soc 60). The comparison with zero is the Cast's definition and is right on HTP for every
    int32 and int64 value measured, so masks built as ``ids.bool()`` or ``(ids - k).bool()`` stay on the NPU with
    the right values. Exact (integers, no rounding). Shape classes: any (elementwise).
    """

    name = "int_cast_to_bool"
    defect = "QNN HTP casts negative integers to bool as False (silent wrong output)"

    sources: tuple[ir.DataType, ...] = _SIGNED_INTS  # the input dtypes whose Casts to bool are rewritten

    def match(self, node: ir.Node) -> ir.Value | None:
        """The input of a Cast to bool from one of ``sources``, or None."""
        x = _graph.op_input(node, "Cast")
        if x is None or x.dtype not in self.sources:
            return None
        return x if node.attributes.get_int("to", 0) == ir.DataType.BOOL else None

    def rewrite(self, graph: ir.Graph) -> bool:
        def compared(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            dtype = cast(ir.DataType, x.dtype)
            zero = _graph.add_initializer(graph, names("zero"), np.array(0, dtype=dtype.numpy()))
            equal = _graph.new_value(names("is_zero"), ir.DataType.BOOL, _graph.static_shape(x))
            not_nodes, out = _graph.one_node_like(names, "out", node, "Not", [equal])
            return [ir.Node("", "Equal", [x, zero], outputs=[equal]), *not_nodes], out

        return self.replace_matched(graph, "qnnx_bool", compared)


# ------------------------------------------------------------- integer Mod as a - trunc(a / b) * b

# The integer dtypes whose Mod is rewritten (the ones the QNN EP computes Div, Mul, Sub and Add on exactly).
_MOD_INTS = (ir.DataType.INT32, ir.DataType.INT64)


@register(order=169)
class IntegerModByDivision(QnnPass):
    """Write an integer ``Mod`` with ``fmod=0`` (Python's ``%``, ``torch.remainder``: the divisor's sign) with integer
    division: ``r = a - Div(a, b) * b``, then the same step on ``r + b``.

    QNN HTP computes an integer Mod as if in float16: ``x % 64`` was wrong for every |x| from 2049 on, ``x % 3`` from
    1537, and with runtime divisors from |x| = 75 (13,048 of 20,000 int32 pairs wrong; ``(ids + 1) * 31 % 64``, a
    character model's hash embedding, sent its whole encoder off by 0.8 of its scale), silently (onnxruntime-qnn
    2.7.0, soc 60). Its integer Mul, Sub and Add are exact there, and so is its Div, except that it floors where ONNX
    truncates when the divisor is a constant power of two. The rewrite is exact with either rounding: ``r`` lies
    strictly between ``-|b|`` and ``|b|``, so ``r + b`` has the divisor's sign and its quotient by ``b`` is not
    negative, where floor and truncation agree (0 of 20,002 pairs wrong on the simulator, int32 extremes included;
    constant divisors 2, 64 and 16384 too). ``r + b`` stays within twice the divisor. ``fmod=1`` on integers is left
    alone: the QNN EP does not take it (it runs on the CPU EP), and a flooring Div would give it the wrong sign.
    Shape classes: any (elementwise, broadcasting as Mod does).
    """

    name = "integer_mod_by_division"
    defect = "QNN HTP computes an integer Mod through float16: wrong for dividends beyond 2048 (silent)"

    def match(self, node: ir.Node) -> tuple[ir.Value, ir.Value] | None:
        """The dividend and divisor of an integer Mod with fmod=0, or None."""
        if not _graph.is_op(node, "Mod") or len(node.inputs) != 2 or node.attributes.get_int("fmod", 0) != 0:
            return None
        a, b = node.inputs
        if a is None or b is None or a.dtype not in _MOD_INTS or b.dtype != a.dtype:
            return None
        return a, b

    def rewrite(self, graph: ir.Graph) -> bool:
        def divided(names: UniqueNames, node: ir.Node, _: tuple[ir.Value, ir.Value]) -> tuple[list[ir.Node], ir.Value]:
            dtype, shape = node.outputs[0].dtype, _graph.static_shape(node.outputs[0])
            # The node's inputs as they are now, not as matched: an earlier rewrite may have replaced one (a % m % n).
            a, b = cast(ir.Value, node.inputs[0]), cast(ir.Value, node.inputs[1])
            nodes: list[ir.Node] = []

            def op(op_type: str, inputs: list[ir.Value], hint: str) -> ir.Value:
                out = _graph.new_value(names(hint), dtype, shape)
                nodes.append(ir.Node("", op_type, inputs, outputs=[out]))
                return out

            def remainder(x: ir.Value, step: str) -> ir.Value:
                multiple = op("Mul", [op("Div", [x, b], f"quotient{step}"), b], f"multiple{step}")
                return op("Sub", [x, multiple], f"remainder{step}")

            return nodes, remainder(op("Add", [remainder(a, ""), b], "shifted"), "_floor")

        return self.replace_matched(graph, "qnnx_mod", divided)


@register(order=166)
class FloatCastToBool(IntCastToBool):
    """Write a ``Cast`` of a float32 or float16 tensor to bool as ``Not(Equal(x, 0))``.

    QNN HTP casts a float beyond float16's range to bool as False: ``Cast(-70000.0)`` gave False (ONNX and
    PyTorch: every nonzero value is True), and qnnx-opcheck refuses the Cast, so a router's mask read as
    ``mask.bool()`` (DeepSeek-V3's group mask) pinned its whole float chain to the CPU EP. The comparison with zero
    is the Cast's definition (NaN is True either way) and is right on HTP for every value measured, +-70000
    included (onnxruntime-qnn 2.7.0, soc 60); like every float comparison on HTP it sees a value below float16's
    smallest subnormal (6e-8) as 0. Shape classes: any (elementwise).
    """

    name = "float_cast_to_bool"
    defect = "QNN HTP casts floats beyond float16's range to bool as False (silent wrong output)"
    sources = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


# ------------------------------------------------------------------------------- Where on bool -> logic


@register(order=164)
class BoolWhereAsLogic(QnnPass):
    """Write a ``Where`` of bool values as ``Or(And(c, x), And(Not(c), y))``.

    The QNN EP declines Where on bool data ("Failed to add node."), and ONNX Runtime's CPU EP has no Where kernel
    for bool either, so a graph holding one could not be built at all and ran wholly in PyTorch: a boolean
    ``scatter`` (DeepSeek-V3.2's sparse-attention indexer marks the picked keys with ``mask.scatter(-1, idx,
    True)``, which the direct translator writes as a Where on bool) sent DeepSeek-V3.2, GLM-MoE-DSA and four more
    families to PyTorch. And, Or and Not on bool run on QNN (onnxruntime-qnn 2.7.0, soc 60). Exact: the same truth
    table, with Where's multidirectional broadcasting (And and Or broadcast the same way). Shape classes: any bool
    Where.
    """

    name = "bool_where_as_logic"
    defect = "Where on bool is declined by the QNN EP and has no CPU EP kernel: the graph could not be built at all"

    def match(self, node: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value] | None:
        """The condition and the two bool values of a Where on bool, or None."""
        if not _graph.is_op(node, "Where") or len(node.inputs) != 3:
            return None
        c, x, y = node.inputs
        if c is None or x is None or y is None or x.dtype != ir.DataType.BOOL or y.dtype != ir.DataType.BOOL:
            return None
        return c, x, y

    def rewrite(self, graph: ir.Graph) -> bool:
        def logic(
            names: UniqueNames, node: ir.Node, found: tuple[ir.Value, ir.Value, ir.Value]
        ) -> tuple[list[ir.Node], ir.Value]:
            c, x, y = found
            bool_ = ir.DataType.BOOL
            out_shape = _graph.static_shape(node.outputs[0])
            picked = _graph.new_value(names("picked"), bool_, None)
            other = _graph.new_value(names("not"), bool_, _graph.static_shape(c))
            rest = _graph.new_value(names("rest"), bool_, None)
            result = _graph.new_value(names("out"), bool_, out_shape)
            return [
                ir.Node("", "And", [c, x], outputs=[picked]),
                ir.Node("", "Not", [c], outputs=[other]),
                ir.Node("", "And", [other, y], outputs=[rest]),
                ir.Node("", "Or", [picked, rest], outputs=[result]),
            ], result

        return self.replace_matched(graph, "qnnx_bool_where", logic)


# ------------------------------------------------------------------------ bool -> int64 through int32

# The dtypes a Cast to int64 is taken from in two steps: their values are exact in int32 (a float is not: a float
# Cast to int32 followed by one to int64 rounds on HTP instead of truncating).
_TO_INT32_FIRST = (ir.DataType.BOOL, ir.DataType.UINT8)


@register(order=167)
class BoolCastToInt64(QnnPass):
    """Write a ``Cast`` of a bool or uint8 tensor to int64 as a ``Cast`` to int32 and one from int32 to int64.

    The QNN EP refuses a Cast to int64 from bool or uint8 ("Failed to create Cast node.") and takes both steps
    (onnxruntime-qnn 2.7.0, soc 60), so ``mask.long()``, ``mask.sum()`` and ``mask.long().cumsum(1)`` (the position
    ids of BART, FlauBERT and XLM; T5Gemma's mask arithmetic) pinned their nodes to the CPU EP. Exact: every bool
    and uint8 value is an int32. Shape classes: static shapes of rank 0-4; a rank-5 Cast is left to the CPU EP (a
    Cast from int32 to int64 at rank 5 stops the process inside QNN HTP, SIGSEGV).
    """

    name = "bool_cast_to_int64"
    defect = "the QNN EP refuses a Cast from bool or uint8 to int64 (the node falls back to the CPU EP)"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The input of a Cast to int64 from bool or uint8, or None."""
        x = _graph.op_input(node, "Cast")
        if x is None or x.dtype not in _TO_INT32_FIRST:
            return None
        shape = _graph.static_shape(x)
        if shape is None or len(shape) > 4:
            return None
        return x if node.attributes.get_int("to", 0) == ir.DataType.INT64 else None

    def rewrite(self, graph: ir.Graph) -> bool:
        def widened(names: UniqueNames, node: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            narrow = _graph.new_value(names("int32"), ir.DataType.INT32, _graph.static_shape(x))
            wide = _graph.new_value(names("out"), ir.DataType.INT64, _graph.static_shape(node.outputs[0]))
            return [
                ir.Node("", "Cast", [x], attributes=[ir.AttrInt64("to", ir.DataType.INT32)], outputs=[narrow]),
                ir.Node("", "Cast", [narrow], attributes=[ir.AttrInt64("to", ir.DataType.INT64)], outputs=[wide]),
            ], wide

        return self.replace_matched(graph, "qnnx_i64", widened)


# ---------------------------------------------------------------------------- int64 inputs -> int32


_INDEX_INPUTS = {("Gather", 1), ("GatherElements", 1)}
# Ops that only move elements (their input 0): int32 indices stay exact through them.
_MOVES_ELEMENTS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Expand", "Identity"})


def _index_chain(value: ir.Value, depth: int = 0) -> list[ir.Value] | None:
    """The values between ``value`` and the Gather indices it feeds when every use reaches those indices through
    ops that only move elements (XLNet's ``input_ids.transpose(0, 1)``), or None: such a chain can carry int32."""
    uses = list(value.uses())
    if not uses or value.is_graph_output() or depth > 16:
        return None
    chain: list[ir.Value] = []
    for use in uses:
        if (use.node.op_type, use.idx) in _INDEX_INPUTS:
            continue
        if use.node.op_type not in _MOVES_ELEMENTS or use.idx != 0 or len(use.node.outputs) != 1:
            return None
        rest = _index_chain(use.node.outputs[0], depth + 1)
        if rest is None:
            return None
        chain += [use.node.outputs[0], *rest]
    return chain


@register(order=170)
class Int64InputsToInt32(QnnPass):
    """Feed int64 graph inputs as int32 where that is exact.

    QNN has no int64: the EP casts int64 inputs and initializers to int32 and SATURATES values that do
    not fit (Add of two 2.0e9 int64 values returned 2147483647, onnxruntime-qnn 2.7.0), silently.
    After this pass the ONNX input is int32 and :meth:`GraphSignature.onnx_inputs` casts the int64
    argument with a range check that raises instead of saturating. An input used only as Gather
    indices (token ids), directly or through ops that only move elements (a transpose, a view, a slice),
    is consumed as int32 directly; otherwise a Cast back to int64 keeps the graph typed as before. int64 initializers are left alone; values outside int32 are reported (logged)
    because QNN would saturate them.
    """

    name = "int64_to_int32"
    defect = "int64 values are silently saturated to int32 by the QNN EP"

    def find_defects(self, graph: ir.Graph) -> list[str]:
        # Graph inputs are always named.
        return [cast(str, v.name) for v in graph.inputs if _int64_tensor_input(v)]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_i32")
        changed = False
        for value in list(graph.inputs):
            if not _int64_tensor_input(value):
                continue
            uses = list(value.uses())
            chain = _index_chain(value)
            value.type = ir.TensorType(ir.DataType.INT32)
            for moved in chain or ():
                moved.type = ir.TensorType(ir.DataType.INT32)
            if chain is None:
                cast_out = _graph.new_value(names(cast(str, value.name)), ir.DataType.INT64, _graph.static_shape(value))
                cast_node = ir.Node(
                    "", "Cast", [value], attributes=[ir.AttrInt64("to", ir.DataType.INT64)], outputs=[cast_out]
                )
                for use in uses:
                    use.node.replace_input_with(use.idx, cast_out)
                graph.append(cast_node)  # QnnPass.call re-sorts the graph topologically
            changed = True
        for name, init in graph.initializers.items():
            arr = _graph.const_array(init)
            if arr is not None and arr.dtype == np.int64 and arr.size and init.uses():
                if any((u.node.op_type, u.idx) in _SHAPE_INPUTS for u in init.uses()):
                    continue
                if arr.min() < _INT32_MIN or arr.max() > _INT32_MAX:
                    log.warning(
                        "int64 initializer %s holds values outside int32 [%d, %d]; QNN will saturate them",
                        name,
                        int(arr.min()),
                        int(arr.max()),
                    )
        return changed


def _int64_tensor_input(value: ir.Value) -> bool:
    """An int64 tensor input that is not also a graph output: an input returned as is keeps its dtype (Dynamo never
    emits that), and a sequence of int64 tensors is not a tensor (QNN takes no sequences)."""
    return value.dtype == ir.DataType.INT64 and isinstance(value.type, ir.TensorType) and not value.is_graph_output()


# Inputs that ONNX requires as int64 and QNN takes as static parameters (never as tensors).
_SHAPE_INPUTS = {
    ("Reshape", 1),
    ("Expand", 1),
    ("Tile", 1),
    ("Slice", 1),
    ("Slice", 2),
    ("Slice", 3),
    ("Slice", 4),
    ("Unsqueeze", 1),
    ("Squeeze", 1),
    ("ReduceMean", 1),
    ("ReduceSum", 1),
    ("ReduceMax", 1),
    ("ReduceMin", 1),
    ("Pad", 1),
    ("Split", 1),
    ("TopK", 1),
    ("ConstantOfShape", 0),
    ("Resize", 3),
    ("Range", 0),
    ("Range", 1),
    ("Range", 2),
    ("CumSum", 1),
    ("OneHot", 1),
}
