"""Sines and cosines of integer multiples (rotary and sinusoidal position embeddings), read from exact tables."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = ["AnglesFromTables"]

# Ops through which an angle stays a constant multiple of one integer element per output element (the data input
# is the only runtime one; shape, axes and index inputs are constants).
_LINEAR = frozenset(
    {"Mul", "Div", "MatMul", "Concat", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Slice", "Identity"}
    | {"Cast", "Neg", "Gather", "Flatten", "Tile"}
)
_INTEGERS = frozenset({ir.DataType.INT64, ir.DataType.INT32})
_MAX_SLICE = 48  # nodes between the integer and the angle; a rotary embedding has about 6
_MAX_ELEMENTS = 1 << 20  # angles per Sin/Cos: the constant index map holds one int64 per angle
_MAX_COEFFICIENTS = 4096  # distinct multipliers (a rotary embedding has head_dim / 2)
# The integer n is split as n + 2**23 = 65536 * a + 256 * b + c, each digit in [0, 255]: three tables of 256 rows
# cover n in [-2**23, 2**23) exactly; outside, the digits are clamped (so is the result: documented).
_OFFSET = 1 << 23
_OPSET = 20  # the passes' graphs are opset >= 20 (QnnPass.requires); the ops of a slice mean the same there
_DIGITS = ((65536, -_OFFSET), (256, 0), (1, 0))


def _is_const(value: ir.Value) -> bool:
    return _graph.const_array(value) is not None


def _integer_source(node: ir.Node) -> ir.Value | None:
    """The integer input of a Cast from int32/int64 to float, else None."""
    if not _graph.is_op(node, "Cast") or not node.inputs or node.inputs[0] is None:
        return None
    value = node.inputs[0]
    return value if value.dtype in _INTEGERS and node.outputs[0].dtype in (ir.DataType.FLOAT,) else None


def _runtime(value: ir.Value, memo: dict[int, bool]) -> bool:
    """Whether ``value`` depends on a graph input (else it is a constant, or computed from constants alone)."""
    stack = [value]
    while stack:
        v = stack[-1]
        if id(v) in memo:
            stack.pop()
            continue
        node = None if _is_const(v) else v.producer()
        if node is None:
            memo[id(v)] = not _is_const(v)
            stack.pop()
            continue
        pending = [i for i in node.inputs if i is not None and id(i) not in memo]
        if pending:
            stack.extend(pending)
            continue
        memo[id(v)] = any(memo[id(i)] for i in node.inputs if i is not None)
        stack.pop()
    return memo[id(value)]


def _angle_slice(x: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """(the float Cast of one integer value, the nodes from it to ``x`` and those computing their constant
    operands) when ``x`` is computed from that one runtime value through :data:`_LINEAR` ops whose other operands
    are constants or computed from constants; else None."""
    cast: ir.Value | None = None
    nodes: dict[int, ir.Node] = {}
    memo: dict[int, bool] = {}
    stack = [x]
    folded: list[ir.Value] = []
    while stack:
        value = stack.pop()
        if not _runtime(value, memo):
            folded.append(value)
            continue
        node = value.producer()
        if node is None:
            return None  # a graph input of float type: not a multiple of an integer
        if _integer_source(node) is not None:
            if cast is not None and cast is not value:
                return None
            cast = value
            continue
        if node.op_type not in _LINEAR or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            return None
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        runtime = [v for v in node.inputs if v is not None and _runtime(v, memo)]
        if node.op_type == "Cast" and node.outputs[0].dtype is not ir.DataType.FLOAT:
            return None
        if node.op_type in ("Mul", "MatMul", "Div") and len(runtime) != 1:
            return None
        if node.op_type == "Div" and runtime[0] is not node.inputs[0]:
            return None  # a constant divided by the angle
        if node.op_type not in ("Mul", "MatMul", "Div", "Concat") and any(v is not node.inputs[0] for v in runtime):
            return None  # a runtime shape, index or axis
        if len(nodes) > _MAX_SLICE:
            return None
        stack.extend(v for v in node.inputs if v is not None)
    while folded:  # the nodes computing constant operands, evaluated with the slice
        node = folded.pop().producer()
        if node is None or id(node) in nodes or all(_is_const(o) for o in node.outputs):
            continue
        nodes[id(node)] = node
        if len(nodes) > _MAX_SLICE:
            return None
        folded.extend(v for v in node.inputs if v is not None and not _is_const(v))
    return (cast, list(nodes.values())) if cast is not None else None


def _topological(nodes: list[ir.Node]) -> list[ir.Node]:
    """``nodes`` with every node after the nodes of the list that compute its inputs."""
    members = {id(n) for n in nodes}
    done: set[int] = set()
    ordered: list[ir.Node] = []

    def visit(node: ir.Node) -> None:
        if id(node) in done:
            return
        done.add(id(node))
        for v in node.inputs:
            producer = v.producer() if v is not None else None
            if producer is not None and id(producer) in members:
                visit(producer)
        ordered.append(node)

    for node in nodes:
        visit(node)
    return ordered


def _evaluate(cast: ir.Value, nodes: list[ir.Node], x: ir.Value, feed: np.ndarray) -> np.ndarray:
    """``x`` computed on the CPU from ``feed`` in place of the Cast's output (ONNX's reference evaluator)."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    ordered = _topological(nodes)
    source, result = cast.name, x.name
    if not source or not result or any(not o.name for n in ordered for o in n.outputs):
        raise ValueError("an unnamed value in the angle's computation")
    consts: dict[str, np.ndarray] = {}
    for node in ordered:
        for v in node.inputs:
            if v is not None and v.name and _is_const(v):
                consts[v.name] = np.asarray(_graph.const_array(v))
    protos = [ir.serde.serialize_node(n) for n in ordered]
    graph = onnx.helper.make_graph(
        protos,
        "angles",
        [onnx.helper.make_tensor_value_info(source, onnx.TensorProto.FLOAT, feed.shape)],
        [onnx.helper.make_tensor_value_info(result, onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(a, name) for name, a in consts.items()],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", _OPSET)])
    outputs: Any = ReferenceEvaluator(model).run(None, {source: feed})
    return np.asarray(outputs[0], dtype=np.float64)


def _index_map(cast: ir.Value, nodes: list[ir.Node], x: ir.Value) -> tuple[np.ndarray, np.ndarray] | None:
    """(coefficient, source index) per element of ``x`` such that ``x = coefficient * n.flat[index]`` for every
    integer input ``n``, proven on the CPU on several inputs; None when ``x`` is not of that form."""
    shape = _graph.static_shape(cast)
    out_shape = _graph.static_shape(x)
    if shape is None or out_shape is None or not 0 < math.prod(out_shape) <= _MAX_ELEMENTS:
        return None
    size = math.prod(shape)
    try:
        coeff = _evaluate(cast, nodes, x, np.ones(shape, np.float32))
        ramp = _evaluate(cast, nodes, x, np.arange(1, size + 1, dtype=np.float32).reshape(shape))
    except Exception:
        return None
    if coeff.shape != out_shape or ramp.shape != out_shape or not np.isfinite(coeff).all():
        return None
    nonzero = coeff != 0
    index = np.where(nonzero, np.rint(np.divide(ramp, coeff, out=np.ones_like(ramp), where=nonzero)) - 1, 0)
    if (index < 0).any() or (index >= size).any():
        return None
    index = index.astype(np.int64)
    rng = np.random.default_rng(0)
    for _ in range(2):
        trial = rng.integers(-3000, 3000, size=shape).astype(np.float32)
        try:
            got = _evaluate(cast, nodes, x, trial)
        except Exception:
            return None
        want = coeff * trial.reshape(-1)[index]
        if got.shape != out_shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5 * (np.abs(want).max() + 1)):
            return None
    return coeff, index


class _Tables:
    """The replacement of one angle ``x``: its sine and cosine from digit tables, built once for both."""

    def __init__(self, graph: ir.Graph, names: UniqueNames, integer: ir.Value, x: ir.Value, found: Any) -> None:
        coeff, index = found
        self.graph, self.names, self.x = graph, names, x
        self.shape = _graph.static_shape(x)
        self.nodes: list[ir.Node] = []
        dtype = integer.dtype if integer.dtype is not None else ir.DataType.INT64
        np_int = dtype.numpy()
        units, which = np.unique(coeff.reshape(-1), return_inverse=True)
        flat = self._op("Reshape", [integer, self._init("flat", np.array([-1], np.int64))], dtype, None)
        n = self._op("Gather", [flat, self._init("index", index)], dtype, self.shape)
        shifted = self._op("Add", [n, self._init("offset", np.array(_OFFSET, np_int))], dtype, self.shape)
        # Clamped at 0 (n below -2**23 reads n = -2**23, as the digits' clamp does above the range): the quotients
        # below then divide only values >= 0, which HTP's integer Div rounds as ONNX does (by a power of two it
        # rounds a negative quotient down, ONNX toward zero), and qnnx-opcheck sees that they are >= 0.
        low, high = self._init("low", np.array(0, np_int)), self._init("high", np.array(255, np_int))
        rest = self._op("Max", [shifted, low], dtype, self.shape)
        column = self._init("column", which.reshape(self.shape).astype(np_int))
        width = self._init("width", np.array(len(units), np_int))
        self.pairs: list[tuple[ir.Value, ir.Value]] = []
        for place, shift in _DIGITS:
            if place > 1:
                base = self._init("place", np.array(place, np_int))
                digit = self._op("Div", [rest, base], dtype, self.shape)
                rest = self._op("Sub", [rest, self._op("Mul", [digit, base], dtype, self.shape)], dtype, self.shape)
            else:
                digit = rest
            digit = self._op("Max", [self._op("Min", [digit, high], dtype, self.shape), low], dtype, self.shape)
            row = self._op("Add", [self._op("Mul", [digit, width], dtype, self.shape), column], dtype, self.shape)
            angles = np.outer(np.arange(256, dtype=np.float64) * place + shift, units.astype(np.float64)).reshape(-1)
            sin = self._op("Gather", [self._init("sin", np.sin(angles).astype(np.float32)), row], None, self.shape)
            cos = self._op("Gather", [self._init("cos", np.cos(angles).astype(np.float32)), row], None, self.shape)
            self.pairs.append((sin, cos))
        sin, cos = self.pairs[0]
        for s2, c2 in self.pairs[1:]:
            # sin(a + b) = sin a cos b + cos a sin b; cos(a + b) = cos a cos b - sin a sin b
            sin, cos = (
                self._op("Add", [self._op("Mul", [sin, c2]), self._op("Mul", [cos, s2])]),
                self._op("Sub", [self._op("Mul", [cos, c2]), self._op("Mul", [sin, s2])]),
            )
        self.sin, self.cos = sin, cos

    def _init(self, hint: str, array: np.ndarray) -> ir.Value:
        return _graph.add_initializer(self.graph, self.names(hint), array)

    def _op(
        self,
        op_type: str,
        inputs: list[ir.Value],
        dtype: ir.DataType | None = ir.DataType.FLOAT,
        shape: tuple[int, ...] | None = (),
    ) -> ir.Value:
        out = _graph.new_value(
            self.names(op_type.lower()), dtype or ir.DataType.FLOAT, self.shape if shape == () else shape
        )
        self.nodes.append(ir.Node("", op_type, inputs, outputs=[out]))
        return out


def _prove(x: ir.Value) -> tuple[ir.Value, ir.Value, Any] | None:
    """(the integer, the angle, the index map) when the angle ``x`` is an integer times constants, else None."""
    found = _angle_slice(x)
    if found is None:
        return None
    cast, nodes = found
    producer = cast.producer()
    integer = _integer_source(producer) if producer is not None else None
    mapping = _index_map(cast, nodes, x) if integer is not None else None
    if integer is None or mapping is None or len(np.unique(mapping[0])) > _MAX_COEFFICIENTS:
        return None
    return integer, x, mapping


@register(order=5)
class AnglesFromTables(QnnPass):
    """Compute ``sin``/``cos`` of an integer times constants (rotary and sinusoidal position embeddings:
    ``cos(position * inv_freq)``) from exact tables instead of on the float16 angle.

    HTP computes the angle in float16, whose step is 0.5 at 1000: a rotary cosine of a runtime position was off by
    0.14 at position 1000 and 0.22 at 3000 (HTP simulator), with nothing to warn. The pass matches a Sin or Cos
    whose float32 input is computed from one integer value through a Cast and linear ops with constant operands
    (Mul, MatMul, Div by constants, Concat, Transpose, Reshape, Expand, Gather and the like), and proves on the CPU
    (ONNX's reference evaluator, on a ramp and two random integer inputs) that every angle is a constant times one
    element of the integer. The integer is split in three base-256 digits (int32 Div, Mul and Sub, exact on HTP),
    and each digit reads the sine and cosine of its part of the angle from a table computed in float64; angle
    addition combines them. Exact for integers in [-2**23, 2**23) (beyond, the digits are clamped); the tables
    hold 256 rows per distinct multiplier. Shape classes: any static shape of the integer and of the angle up to
    2**20 angles and 4096 distinct multipliers.
    """

    name = "angles_from_tables"
    defect = (
        "HTP computes Sin and Cos of a float16 angle: the rotary embedding of a runtime position was off by 0.14 "
        "at position 1000"
    )

    def match(self, node: ir.Node) -> Any:
        """(the integer, the angle, the index map) of a Sin/Cos of integer multiples, or None."""
        if not (_graph.is_op(node, "Sin") or _graph.is_op(node, "Cos")) or not node.inputs:
            return None
        x = node.inputs[0]
        if x is None or x.dtype is not ir.DataType.FLOAT:
            return None
        proven: dict[int, Any] | None = getattr(self, "_proven", None)
        if proven is None:
            return _prove(x)
        if id(x) not in proven:  # a Sin and a Cos of one angle are proven once per sweep
            proven[id(x)] = _prove(x)
        return proven[id(x)]

    def matched(self, graph: ir.Graph) -> list[tuple[ir.Node, Any]]:
        self._proven: dict[int, Any] | None = {}
        try:
            return super().matched(graph)
        finally:
            self._proven = None

    def rewrite(self, graph: ir.Graph) -> bool:
        built: dict[int, _Tables] = {}

        def from_tables(names: UniqueNames, node: ir.Node, found: Any) -> tuple[list[ir.Node], ir.Value]:
            integer, x, mapping = found
            tables = built.get(id(x))
            nodes: list[ir.Node] = []
            if tables is None:
                tables = built[id(x)] = _Tables(graph, names, integer, x, mapping)
                nodes = tables.nodes
            result = tables.sin if node.op_type == "Sin" else tables.cos
            out, new = _graph.one_node_like(names, "out", node, "Identity", [result])
            return [*nodes, *out], new

        return self.replace_matched(graph, "qnnx_angle", from_tables)
