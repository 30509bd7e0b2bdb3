"""What values a tensor can hold, by construction: >= 0 (a square, an absolute value, an exponential...), or inf
or NaN (from a float graph input or a non-finite constant), and whether an infinity reaches a graph output."""

from __future__ import annotations

from collections.abc import Callable

from qnnx_opcheck._model import NodeView
from qnnx_opcheck._view import FLOATS, GraphView

__all__ = ["ValueAnalysis"]

# Ops whose output is finite (or bool) for an infinite input: an infinity stops there, as a -inf mask does in
# attention's Softmax.
_ABSORB_INFINITY = frozenset(
    {
        "Softmax",
        "Exp",
        "Sigmoid",
        "Tanh",
        "Relu",
        "Clip",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "IsInf",
        "IsNaN",
        "Not",
        "Shape",
        "Size",
        "Cast",
        "HardSigmoid",
        "Erf",
        "Softsign",
    }
)
# Ops whose results are >= 0 whatever they are given, and ops that keep "all inputs >= 0" (how many leading
# inputs are data: the rest are shapes, axes or indices).
_NON_NEGATIVE_OPS = frozenset(
    {
        "Abs",
        "Exp",
        "Relu",
        "Sigmoid",
        "Softplus",
        "Softmax",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "Sqrt",
        "HardSigmoid",
        "Shape",
        "Size",
        # positions along an axis: a router's ``scores.gather(-1, scores.argmax(-1, keepdim=True))``
        "ArgMax",
        "ArgMin",
        # bool outputs (0 or 1 once cast): an attention mask's ``ids != pad``
        "Equal",
        "Greater",
        "GreaterOrEqual",
        "Less",
        "LessOrEqual",
        "Not",
        "And",
        "Or",
        "Xor",
        "IsNaN",
        "IsInf",
    }
)
_KEEPS_NON_NEGATIVE = {
    "Add": 2,
    "Mul": 2,
    "Div": 2,
    "ReduceSum": 1,
    "ReduceMean": 1,
    "ReduceMax": 1,
    "ReduceMin": 1,
    "Min": 8,
    "Reshape": 1,
    "Transpose": 1,
    "Squeeze": 1,
    "Unsqueeze": 1,
    "Expand": 1,
    "Slice": 1,
    "Concat": 8,
    "Identity": 1,
    "Cast": 1,
    "Pad": 1,
    "Gather": 1,
    "AveragePool": 1,
    "MaxPool": 1,
    "Tile": 1,
    "Flatten": 1,
    "CumSum": 1,  # a running sum of values >= 0: position ids counted from a mask
}


class ValueAnalysis:
    """The value analysis the patterns use, on one graph (memoized per graph)."""

    def __init__(self, view: GraphView) -> None:
        self.view = view
        self.f = view.f
        self._memos: dict[str, dict[str, bool]] = {}

    def non_negative(self, name: str, depth: int = 0) -> bool:
        """Whether ``name`` is >= 0 by construction (NaN aside): a constant >= 0, or the output of an op that only
        gives non-negative values from what it is given."""
        import numpy as np

        if depth > 12 or not name:
            return False
        if self.view.is_const(name):
            value = self.view.const_value(name)
            return value is not None and getattr(value, "size", 0) > 0 and bool((np.asarray(value) >= 0).all())
        idx = self.f.producers.get(name)
        if idx is None:
            return False
        node = self.f.nodes[idx]
        op = node.op_type
        if op in _NON_NEGATIVE_OPS:
            return True
        if op == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
            return True  # x * x
        if op == "Pow" and len(node.input) == 2:
            exponent = self.view.const_value(node.input[1])
            if (
                exponent is not None
                and np.asarray(exponent).size == 1
                and float(np.asarray(exponent).reshape(-1)[0]) % 2 == 0
            ):
                return True  # an even power
            return self.non_negative(node.input[0], depth + 1)  # a power of a value >= 0 (a p-norm's sum of powers)
        if op in _KEEPS_NON_NEGATIVE:
            data = [i for i in node.input[: _KEEPS_NON_NEGATIVE[op]] if i]
            return bool(data) and all(self.non_negative(i, depth + 1) for i in data)
        if op == "Clip" and len(node.input) > 1 and node.input[1]:
            return self.non_negative(node.input[1], depth + 1)  # a lower bound >= 0
        if op == "Max":
            return any(self.non_negative(i, depth + 1) for i in node.input if i)
        if op == "Where" and len(node.input) == 3:
            if self._sign_select(node):
                return True
            return all(self.non_negative(i, depth + 1) for i in node.input[1:])  # either branch is >= 0
        if op == "Sub" and len(node.input) == 2:
            return self._remainder_of_non_negative(node, depth)
        if op == "Range" and len(node.input) == 3:
            return self.non_negative(node.input[0], depth + 1) and self.non_negative(node.input[2], depth + 1)
        return False

    def _sign_select(self, node: NodeView) -> bool:
        """``Where(x < 0, k - x, x)`` with a constant ``k >= 0`` (or ``Neg(x)`` / ``Abs(x)`` in the first branch):
        x where it is >= 0, a value >= -x > 0 where it is not. qnnx-export's integer floor division writes its
        dividend so, to divide only values >= 0."""
        cond, then, other = node.input
        producer = self.view.producer(cond) if cond else None
        if producer is None or len(producer.input) != 2:
            return False
        a, b = producer.input
        if producer.op_type == "Less" and self.view.scalar(b) == 0:
            x = a
        elif producer.op_type == "Greater" and self.view.scalar(a) == 0:
            x = b
        else:
            return False
        if other != x:
            return False
        negated = self.view.producer(then) if then else None
        if negated is None:
            return False
        if negated.op_type in ("Neg", "Abs"):
            return list(negated.input[:1]) == [x]
        if negated.op_type == "Sub" and len(negated.input) == 2 and negated.input[1] == x:
            k = self.view.scalar(negated.input[0])
            return k is not None and k >= 0
        return False

    def _remainder_of_non_negative(self, node: NodeView, depth: int) -> bool:
        """``x - Div(x, b) * b`` with ``x >= 0`` and a constant ``b > 0``: in ``[0, b)`` however the integer
        quotient rounds, since a quotient of values >= 0 rounds the same way down or toward zero."""
        x, product = node.input
        mul = self.view.producer(product) if product else None
        if mul is None or mul.op_type != "Mul" or len(mul.input) != 2:
            return False
        for quotient, b in (mul.input, mul.input[::-1]):
            div = self.view.producer(quotient) if quotient else None
            if div is None or div.op_type != "Div" or len(div.input) != 2 or div.input[0] != x:
                continue
            divisor = self.view.scalar(div.input[1])
            if divisor is not None and divisor > 0 and self.view.scalar(b) == divisor:
                return self.non_negative(x, depth + 1)
        return False

    def computed_on_qnn(self, name: str) -> bool:
        """Whether ``name`` is the output of a node already decided to run on QNN (vouched for, or with a caveat;
        a removed Dropout passes its input through): HTP computes it in fp16, so its value reaches any consumer,
        on QNN or on the CPU EP, already rounded to fp16. A graph input, a constant or a value computed on the CPU
        EP is not."""
        from qnnx_opcheck._outcomes import KIND_STATUS

        for _ in range(64):  # a chain of removed nodes is short; the bound only guards against a malformed graph
            idx = self.f.producers.get(name) if name else None
            kind = self.view.kinds.get(idx) if idx is not None else None
            if kind is None or kind == "constant_folded":
                return False
            if kind != "removed":
                return KIND_STATUS.get(kind) == "supported" or kind == "caveat"
            node = self.f.nodes[idx]  # type: ignore[index]
            name = node.input[0] if node.input else ""
        return False

    def reaches_output_unabsorbed(self, name: str) -> bool:
        """Whether an infinity in ``name`` can reach a graph output, i.e. a path to an output that does not pass
        through an op turning -inf into a finite number (Softmax, Exp, Sigmoid, Relu...) or into a bool, nor through
        an integer or bool value (the indices of a TopK or ArgMax over a -inf mask hold none)."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in self.f.graph_outputs:
                return True
            for idx in self.f.consumers.get(cur, ()):
                consumer = self.f.nodes[idx]
                if consumer.op_type in _ABSORB_INFINITY:
                    continue
                stack.extend(o for o in consumer.output if o and not self._not_float(o))
        return False

    def _not_float(self, name: str) -> bool:
        """Whether ``name`` is known to be an integer or bool tensor, which holds no infinity."""
        dtype = self.view.dtype(name)
        return dtype is not None and dtype not in FLOATS

    def _const_nonfinite(self, name: str) -> bool:
        import numpy as np

        value = self.view.const_value(name)
        kind = getattr(getattr(value, "dtype", None), "kind", None)
        return kind == "f" and not bool(np.isfinite(value).all())

    def _any_upstream(self, name: str, memo_key: str, leaf: Callable[[str, int | None], bool | None]) -> bool:
        """Whether ``name`` holds a property that ``leaf(value, producer index)`` decides for a value (True or False)
        or leaves to the producer's inputs (None: true when any input has it); memoized per ``memo_key``."""
        memo = self._memos.setdefault(memo_key, {})
        stack = [name]
        while stack:
            cur = stack[-1]
            if cur in memo:
                stack.pop()
                continue
            idx = self.f.producers.get(cur)
            decided = leaf(cur, idx)
            if decided is not None or idx is None:
                memo[cur] = bool(decided)
                stack.pop()
                continue
            pending = [i for i in self.f.nodes[idx].input if i and i not in memo]
            if pending:
                stack.extend(pending)
                continue
            memo[cur] = any(memo[i] for i in self.f.nodes[idx].input if i)
            stack.pop()
        return bool(memo[name])

    def from_nonfinite_constant(self, name: str) -> bool:
        """Whether ``name`` is a non-finite constant, or is computed from one without a graph input in between and
        without an op that absorbs infinities: a -inf mask that onnxruntime folds (Where of constants), or a -inf
        passed through CastLike, holds -inf at run time although opcheck does not know the folded value."""

        def leaf(cur: str, idx: int | None) -> bool | None:
            if self.view.is_const(cur) and (idx is None or self.view.const_value(cur) is not None):
                return self._const_nonfinite(cur)
            if idx is None or self.f.nodes[idx].op_type in _ABSORB_INFINITY or self._not_float(cur):
                return False
            return self._const_nonfinite(cur) if self.f.nodes[idx].op_type == "Constant" else None

        return self._any_upstream(name, "_from_nonfinite_memo", leaf)

    def may_hold_nonfinite(self, name: str) -> bool:
        """Whether ``name`` can hold inf or NaN at run time: it is (or is computed from) a float graph input or a
        non-finite constant. Overflow inside the graph (exp of a large number) is not tracked."""

        def leaf(cur: str, idx: int | None) -> bool | None:
            if self.view.is_const(cur):
                return self._const_nonfinite(cur)
            if self._not_float(cur):
                return False
            return self.view.dtype(cur) in FLOATS if idx is None else None  # a graph input: a float may hold inf

        return self._any_upstream(name, "_nonfinite_memo", leaf)
