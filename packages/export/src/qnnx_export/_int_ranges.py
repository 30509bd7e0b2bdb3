"""How large an exported graph's integer inputs may be before HTP computes its integers wrongly (interval analysis).

HTP computes integers in int32 and saturates where PyTorch (int64) does not overflow at all: ``x * 1000003 % 65521``
of an x near 10**6 came back 32872 for every element on the simulator, and ``(2**31 - 1) + 5`` came back
2147483647. Its integer ReduceSum, CumSum and ScatterND add add up in float32, exact only up to 2**24, and an integer
cast to a float is a float16 value, which saturates beyond 65504 (``x.float() < 16777217.0`` was False for 65537).
The first call's accuracy guard sees that only when the first call's values already leave those ranges; a later
call with larger integers would be silently wrong. So the export bounds, for each integer input, the magnitude up to
which no value of the graph can leave them (intervals propagated through the graph), and the caller checks each
call's integer inputs against those bounds (a call beyond them is computed elsewhere).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from qnnx_export._passes._graph import const_array, static_shape

__all__ = ["IntegerOverflow", "integer_input_bounds"]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_FP16_MAX = 65504  # a float HTP casts to an integer is a float16 value
# HTP adds up integers in float32 in ReduceSum and CumSum: exact up to 2**24 (a cumulative sum of int64 values came
# back 17920948 for 17920949, a sum 124530528 for 124530520), so their results must stay within it.
_FLOAT32_EXACT = 2**24
_SUMMED_IN_FLOAT32 = frozenset({"ReduceSum", "CumSum"})

Interval = tuple[int, int]
# The QNN EP computes int64 tensors as int32 (an int64 graph input arrives as int32 already): both overflow there.
_AS_INT32 = frozenset({ir.DataType.INT32, ir.DataType.INT64})
_INTS = {
    ir.DataType.INT8: (-(2**7), 2**7 - 1),
    ir.DataType.UINT8: (0, 2**8 - 1),
    ir.DataType.INT16: (-(2**15), 2**15 - 1),
    ir.DataType.UINT16: (0, 2**16 - 1),
    ir.DataType.INT32: (INT32_MIN, INT32_MAX),
    ir.DataType.UINT32: (0, 2**32 - 1),
    ir.DataType.INT64: (INT32_MIN, INT32_MAX),
    ir.DataType.UINT64: (0, 2**64 - 1),
}
# Ops that move or select values without computing new ones: the output holds values of these inputs.
_SELECT: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand", "Tile", "Slice"), (0,)
    ),
    **dict.fromkeys(("Gather", "GatherElements", "GatherND", "Split", "ReduceMax", "ReduceMin", "Sort"), (0,)),
    **dict.fromkeys(("DepthToSpace", "SpaceToDepth", "MaxPool", "Resize", "Compress", "TopK"), (0,)),
    "Where": (1, 2),
    **dict.fromkeys(("ScatterND", "ScatterElements", "Pad"), (0, 2)),
}
# Integer arithmetic this analysis does not bound: a graph with one on int32 is not bounded at all.
_UNBOUNDED = frozenset(
    {"MatMul", "Gemm", "Einsum", "Pow", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2", "Conv", "CumProd"}
    | {"MatMulInteger", "ConvInteger", "BitShift"}
)


# Ops that can leave int32 by adding or multiplying, and how many of their inputs are operands: an operand whose type
# is not known (so neither is its range) leaves their result unbounded.
_ADDING = {"Add": 2, "Sub": 2, "Mul": 2, "Neg": 1, "Abs": 1, "ReduceSum": 1, "CumSum": 1}


class _Unbounded(Exception):
    """An integer node whose values the analysis cannot bound."""


class IntegerOverflow(Exception):
    """With every integer input at 0, an integer value of the graph (or its float32 sum, or its float16 cast) may
    already leave what HTP computes it in, bounded from constants, shapes and rules alone (no value the analysis had
    to take as anything its type holds): no input bound makes the graph safe on HTP.

    Attributes:
        node: The name (or op type) of the first such node.
    """

    def __init__(self, node: str) -> None:
        super().__init__(
            f"the graph's integer arithmetic leaves what QNN HTP computes exactly at node {node!r} even with its "
            "integer inputs at 0 (HTP holds integers in int32, adds up sums in float32, exact up to 2**24, and casts "
            "integers to float16): no bound on the inputs keeps it exact. Fix: compute these values in float, or "
            "keep this graph in PyTorch (device='cpu')."
        )
        self.node = node


def _union(*intervals: Interval | None) -> Interval | None:
    known = [i for i in intervals if i is not None]
    return (min(i[0] for i in known), max(i[1] for i in known)) if known else None


def _products(a: Interval, b: Interval) -> Interval:
    corners = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(corners), max(corners)


def _sum_of(n: int, x: Interval) -> Interval:
    """The range of any sum of 1 to ``n`` values of ``x``."""
    return min(x[0], n * x[0]), max(x[1], n * x[1])


def _magnitude(x: Interval) -> int:
    return max(abs(x[0]), abs(x[1]))


def _remainder_divisor(sub: ir.Node, ranges: _Ranges) -> Interval | None:
    """The interval of ``d`` when ``sub`` is ``Sub(a, Mul(Div(a, d), d))`` (a remainder, as the integer Mod rewrite
    writes it, whose magnitude stays below the divisor's whether Div truncates or floors); else None."""
    a, multiple = sub.inputs[0], sub.inputs[1] if len(sub.inputs) > 1 else None
    mul = multiple.producer() if multiple is not None else None
    if a is None or mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2:
        return None
    for quotient, d in (mul.inputs, reversed(mul.inputs)):
        div = quotient.producer() if quotient is not None else None
        if div is not None and div.op_type == "Div" and list(div.inputs) == [a, d] and d is not None:
            return ranges.of(d)
    return None


class _Ranges:
    """Intervals of the integer values of a graph, for given intervals of its integer inputs."""

    def __init__(self, inputs: Mapping[str, Interval]) -> None:
        self.inputs = inputs
        self.memo: dict[int, Interval | None] = {}
        # Values whose interval is only their type's range (no rule bounds them), or derives from one: an overflow
        # of theirs proves nothing about the graph.
        self.loose: set[int] = set()

    def of(self, value: ir.Value | None) -> Interval | None:
        """The interval of ``value`` (None: not an integer, or no value)."""
        if value is None or value.dtype not in _INTS:
            return None
        found = self.memo.get(id(value), ())
        if found != ():
            return found  # type: ignore[return-value]
        array = const_array(value)
        if array is not None:
            interval = (int(array.min()), int(array.max())) if array.size else (0, 0)
        elif value.name is not None and value.name in self.inputs and value.producer() is None:
            interval = self.inputs[value.name]
        else:
            interval = _INTS[value.dtype]  # a value no rule bounds holds anything its type holds
            if value.name not in self.inputs:
                self.loose.add(id(value))
        self.memo[id(value)] = interval
        return interval

    def set(self, value: ir.Value | None, interval: Interval | None) -> None:
        if value is not None and value.dtype in _INTS and interval is not None:
            low, high = _INTS[value.dtype]
            self.memo[id(value)] = (max(low, interval[0]), min(high, interval[1]))


def _count(value: ir.Value | None, axes: Sequence[int] | None) -> int:
    """The number of elements a reduction over ``axes`` (all when None or empty) adds up."""
    shape = static_shape(value)
    if shape is None:
        raise _Unbounded("a reduction over a dynamic shape")
    if not axes:
        return max(1, math.prod(shape))
    return max(1, math.prod(shape[a] for a in axes))


def _axes(node: ir.Node) -> list[int]:
    rank = len(static_shape(node.inputs[0]) or ())
    given = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if given is None:
        attr = node.attributes.get("axes")
        given = np.array(attr.as_ints() if attr is not None else [], dtype=np.int64)
    return [int(a) % rank for a in np.asarray(given).reshape(-1)] if rank else []


def _axis_size(node: ir.Node) -> int:
    """The size of the axis a TopK selects along (int32's largest value when not static): its indices are below."""
    shape = static_shape(node.inputs[0])
    attr = node.attributes.get("axis")
    axis = attr.as_int() if attr is not None else -1
    return max(1, shape[axis % len(shape)]) if shape else INT32_MAX


# Rules whose intervals do not depend on their inputs' values (sizes, positions, signs): exact whatever those are.
_VALUE_FREE = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero", "Sign", "ConstantOfShape"})


def _computed(node: ir.Node, r: _Ranges) -> list[Interval | None]:
    """The intervals of ``node``'s outputs (raises :class:`_Unbounded` for integer arithmetic it cannot bound)."""
    op = node.op_type
    ins = [r.of(v) for v in node.inputs]
    out = node.outputs[0]
    reduction = node.attributes.get("reduction")
    if op in ("ScatterND", "ScatterElements") and reduction is not None and reduction.as_string() != "none":
        data, updates = ins[0], ins[2] if len(ins) > 2 else None
        how = reduction.as_string()
        if how == "mul":
            raise _Unbounded(f"{op} with reduction mul")
        if data is None or updates is None or how != "add":
            return [_union(data, updates)]
        n = math.prod(static_shape(node.inputs[2]) or (INT32_MAX,))  # each element takes at most every update
        return [(data[0] + min(0, n * updates[0]), data[1] + max(0, n * updates[1]))]
    if op in _SELECT:
        picked = _union(*(ins[i] for i in _SELECT[op] if i < len(ins)))
        if op == "TopK" and len(node.outputs) > 1:
            return [picked, (0, _axis_size(node) - 1)]
        if op == "Pad" and len(ins) < 3:
            picked = _union(picked, (0, 0))
        return [picked] * len(node.outputs)
    if op in ("Concat", "Max", "Min", "Sum", "Mean"):
        known = [i for i in ins if i is not None]
        if op == "Sum":
            if len(known) != len(ins):
                raise _Unbounded("Sum of a value whose type is unknown")
            return [(sum(i[0] for i in known), sum(i[1] for i in known))]
        if op in ("Max", "Min") and len(known) == len(ins):
            pick = max if op == "Max" else min
            return [(pick(i[0] for i in known), pick(i[1] for i in known))]
        return [_union(*ins)]
    a = ins[0] if ins else None
    b = ins[1] if len(ins) > 1 else None
    if out.dtype in _AS_INT32 and op in _ADDING and any(i is None for i in ins[: _ADDING[op]]):
        raise _Unbounded(f"{op} of a value whose type is unknown")
    if op == "Sub" and b is not None and (divisor := _remainder_divisor(node, r)) is not None:
        return [(-(_magnitude(divisor) - 1), _magnitude(divisor) - 1)]  # a - Div(a, d) * d: within the divisor
    if op in ("Add", "Sub", "Mul") and a is not None and b is not None:
        if op == "Add":
            return [(a[0] + b[0], a[1] + b[1])]
        if op == "Sub":
            return [(a[0] - b[1], a[1] - b[0])]
        return [_products(a, b)]
    if op == "Neg" and a is not None:
        return [(-a[1], -a[0])]
    if op == "Abs" and a is not None:
        return [(0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1])), _magnitude(a))]
    if op == "Sign":
        return [(-1, 1)]
    if op == "Div" and a is not None and b is not None:
        # A divisor that cannot be 0 divides the magnitude by its smallest one, rounded up (HTP's Div floors by a
        # constant power of two where ONNX truncates).
        least = min(abs(b[0]), abs(b[1])) if b[0] > 0 or b[1] < 0 else 1
        return [(-(-_magnitude(a) // least), -(-_magnitude(a) // least))]
    if op == "Mod" and a is not None and b is not None:
        m = max(_magnitude(b) - 1, 0)
        return [(-min(m, _magnitude(a)), min(m, _magnitude(a)))]
    if op == "Clip" and a is not None:
        low = ins[1][0] if len(ins) > 1 and ins[1] is not None else a[0]
        high = ins[2][1] if len(ins) > 2 and ins[2] is not None else a[1]
        return [(max(a[0], low), min(a[1], high))]
    if op == "ReduceSum" and a is not None:
        return [_sum_of(_count(node.inputs[0], _axes(node)), a)]
    if op == "CumSum" and a is not None:
        shape = static_shape(node.inputs[0])
        axis = const_array(node.inputs[1])
        if shape is None or axis is None:
            raise _Unbounded("a cumulative sum over a dynamic shape")
        return [_sum_of(shape[int(axis) % len(shape)] if shape else 1, a)]
    if op == "Cast":
        source = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
        if source == ir.DataType.BOOL:
            return [(0, 1)]
        if source is not None and source.is_floating_point():
            return [(-_FP16_MAX, _FP16_MAX)]
        return [a]
    if op in ("Shape", "Size"):
        shape = static_shape(node.inputs[0])
        n = max([*(shape or ()), math.prod(shape or ())], default=0) if shape is not None else INT32_MAX
        return [(0, n)]
    if op in ("ArgMax", "ArgMin", "NonZero"):
        shape = static_shape(node.inputs[0])
        return [(0, max(shape) if shape else INT32_MAX)]
    if op == "ConstantOfShape":
        value = node.attributes.get("value")
        array = value.as_tensor().numpy() if value is not None else np.zeros(1)
        return [(int(array.min()), int(array.max())) if array.size and array.dtype.kind in "iub" else None]
    if op == "Range" and len(ins) == 3 and ins[0] is not None and ins[1] is not None:
        return [_union(ins[0], ins[1])]
    if out.dtype in _AS_INT32 and op in _UNBOUNDED:
        raise _Unbounded(f"{op} on {out.dtype}")
    return [None] * len(node.outputs)  # no rule: each output holds what its type holds


def _summed_in_float32(node: ir.Node) -> bool:
    reduction = node.attributes.get("reduction")
    return node.op_type in _SUMMED_IN_FLOAT32 or (
        node.op_type in ("ScatterND", "ScatterElements") and reduction is not None and reduction.as_string() == "add"
    )


def _int_to_float(node: ir.Node) -> bool:
    """A Cast of an integer to a float: HTP holds the result in float16, which saturates beyond 65504."""
    source = node.inputs[0] if node.op_type == "Cast" and node.inputs else None
    target = node.outputs[0].dtype if source is not None else None
    return source is not None and source.dtype in _INTS and target is not None and target.is_floating_point()


def _first_overflow(nodes: Sequence[ir.Node], inputs: Mapping[str, Interval]) -> tuple[str, bool] | None:
    """The first node whose integer values may leave what HTP holds them in, for integer inputs within ``inputs``
    (int32; float32's exact integers for a sum; float16's range for an integer cast to a float), with whether its
    interval derives from a value bounded only by its type (loose), else None (raises :class:`_Unbounded`)."""
    r = _Ranges(inputs)
    for node in nodes:
        if _int_to_float(node):
            source = r.of(node.inputs[0])
            if source is not None and _magnitude(source) > _FP16_MAX:
                return node.name or node.op_type, id(node.inputs[0]) in r.loose
            continue
        intervals = _computed(node, r)
        loose = node.op_type not in _VALUE_FREE and any(v is not None and id(v) in r.loose for v in node.inputs)
        low, high = (-_FLOAT32_EXACT, _FLOAT32_EXACT) if _summed_in_float32(node) else (INT32_MIN, INT32_MAX)
        for k, (value, interval) in enumerate(zip(node.outputs, intervals)):
            if interval is None:
                continue
            value_loose = loose and not (node.op_type == "TopK" and k == 1)  # positions along a static axis
            if value.dtype in _AS_INT32 and (interval[0] < low or interval[1] > high):
                return node.name or node.op_type, value_loose
            r.set(value, interval)
            if value_loose:
                r.loose.add(id(value))
    return None


def _largest(safe: Callable[[int], bool]) -> int:
    """The largest bound in [0, INT32_MAX] for which ``safe`` holds (``safe`` is monotone: true up to a point); -1
    when it holds for none."""
    if safe(INT32_MAX):
        return INT32_MAX
    if not safe(0):
        return -1
    low, high = 0, INT32_MAX  # safe(low), not safe(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if safe(mid) else (low, mid)
    return low


def integer_input_bounds(model: ir.Model) -> dict[str, int]:
    """``{input name: largest magnitude}`` for the integer graph inputs that need a bound: with every such input
    within its bound (and the others anything int32 holds), no integer value of the graph leaves what HTP holds it
    in. An input the graph only indexes with or compares needs none, and is not listed. Empty when no input needs
    one, and also when the graph holds integer arithmetic the analysis cannot bound (it then proves nothing).

    Each input gets its own bound (the largest with the other bounded inputs at 0); when those bounds together are
    not safe (the inputs are combined), all of them are scaled down by one factor until they are.

    Raises:
        IntegerOverflow: Even with every integer input at 0 a value may leave that range, by intervals that no
            value bounded only by its type enters (its constants alone overflow: ``((x - 277) * 277 * 237)
            .cumsum(0)`` sums past float32's exact integers at ``x = 0``, and any bound admits 0).
    """
    graph = model.graph
    nodes = [n for n in graph if any(o.dtype in _INTS for o in n.outputs) or _int_to_float(n)]
    if not nodes:
        return {}
    inputs = [v.name for v in graph.inputs if v.dtype in _AS_INT32 and v.name]
    full = (INT32_MIN, INT32_MAX)

    def refuse_if_certain() -> None:
        found = _first_overflow(nodes, dict.fromkeys(inputs, (0, 0)))
        if found is not None and not found[1]:
            raise IntegerOverflow(found[0])

    if not inputs:
        with contextlib.suppress(_Unbounded):  # arithmetic the analysis does not model proves nothing
            refuse_if_certain()
        return {}

    def safe(bounds: Mapping[str, int]) -> bool:
        ranges = {n: (-bounds[n], bounds[n]) if n in bounds else full for n in inputs}
        return _first_overflow(nodes, ranges) is None

    def scaled(bounded: Sequence[str]) -> dict[str, int] | None:
        """Bounds of ``bounded`` (the other inputs free): each input's own, scaled down together until safe."""

        def own(name: str) -> int:
            return _largest(lambda b: safe({**dict.fromkeys(bounded, 0), name: b}))

        alone = {n: own(n) for n in bounded}
        if not alone or any(b < 0 for b in alone.values()):
            return None
        if safe(alone):
            return alone
        steps = 1 << 20
        k = _largest(lambda k: k <= steps and safe({n: b * k // steps for n, b in alone.items()}))
        return None if k < 0 else {n: b * min(k, steps) // steps for n, b in alone.items()}

    try:
        if safe({}):
            return {}
        zero = dict.fromkeys(inputs, 0)
        # Inputs that leave every value in range on their own (ids that only index) keep the full range, unless
        # they overflow together with the others: then every input is bounded.
        alone = scaled([n for n in inputs if not safe({**zero, n: INT32_MAX})]) or scaled(inputs)
        if alone is None:
            refuse_if_certain()
    except _Unbounded:
        return {}
    return alone or {}
