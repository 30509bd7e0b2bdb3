"""The multi-node and attribute patterns a table lists (``patterns``): fusions QNN makes (Erf inside GELU), ops it
computes wrongly in some configurations, fp16 semantics, runtime values where QNN wants constants, shapes, ranks.

A rule is registered where its matcher is defined: ``@rule("<pattern id>")`` on a method of :class:`Patterns`
puts it in :data:`PATTERN_RULES`, which the checker tries in definition order (the first that holds decides).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from qnnx_clikit import htp_averages_wrongly, htp_pads_wrongly, merges_heads
from qnnx_opcheck._einsum import einsum_has_diagonal, einsum_is_matmul
from qnnx_opcheck._model import NodeView
from qnnx_opcheck._values import ValueAnalysis
from qnnx_opcheck._view import FLOATS, GraphView

__all__ = ["PATTERN_RULES", "Matcher", "PatternRule", "Patterns", "rule"]

# onnx.TensorProto element types of floats (FLOAT, DOUBLE, FLOAT16, BFLOAT16): a Cast to another type truncates.
_FLOAT_ELEM_TYPES = (1, 11, 10, 16)
_COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Max", "Min", "Clip"})
_SELECTIONS = frozenset({"Max", "Min", "Clip"})  # the comparisons that return one of their inputs


# Optional inputs that exporters fill with an empty constant to mean "not given" (ONNX Resize opset 11-13 needs a roi
# before scales, and an empty scales before sizes). ONNX Runtime and the QNN EP read them as absent: Resize with an
# empty roi initializer (and with empty roi + empty scales + sizes), nearest and linear, opsets 11, 13 and 18, builds
# with CPU fallback disabled and matches the CPU EP (onnxruntime-qnn 2.7.0, HTP simulator, soc_model 60).
_EMPTY_PLACEHOLDERS: dict[tuple[str, str], tuple[int, ...]] = {("", "Resize"): (1, 2)}
# The reductions whose axes are input 1 (opset 18; ReduceSum from 13). An empty axes tensor, a constant or a graph
# input of static shape [0], means "reduce every axis" unless noop_with_empty_axes is set: ReduceSum and ReduceMean
# of x[3, 2, 2] by axes of shape [0] (keepdims), and ReduceL2, ReduceL1 and ReduceSumSquare written as ReduceSum,
# build with CPU fallback disabled and are right (node tests, onnxruntime-qnn 2.7.0, soc_model 60). With
# noop_with_empty_axes=1 the QNN EP declines the node ("does not support NoOp for reduction operators with empty axes").
REDUCE_AXES_INPUT = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
    }
)


# Ops that only move elements (a scalar factor commutes with them).
_MOVES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})


#: A rule's matcher: ``(patterns, index, node) -> bool``, whether the node shows the defect of the rule's pattern.
Matcher = Callable[["Patterns", int, NodeView], bool]


class PatternRule(NamedTuple):
    """A table pattern and its matcher. The checker tries it on a node whose op the pattern's ``ops`` list, when
    the table has the pattern: if the matcher holds, the pattern's kind, reason (and fix) and evidence decide."""

    pattern: str
    matcher: Matcher


_RULES: list[PatternRule] = []


def rule(pattern: str) -> Callable[[Matcher], Matcher]:
    """Register the decorated matcher for the table pattern ``pattern`` (the one place a rule is listed). The rules
    are tried in the order they are defined, after the table-wide ones and the measured conditions."""

    def register(matcher: Matcher) -> Matcher:
        if any(r.pattern == pattern for r in _RULES):
            raise TypeError(f"the opcheck pattern {pattern!r} already has a rule")
        _RULES.append(PatternRule(pattern, matcher))
        return matcher

    return register


# Elementwise arithmetic between a computed value and a constant (a bias or a scale) that a rule looks through.
_ELEMENTWISE_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div"})

# Ops whose float output lies in [-1, 1] whatever the input: computed in fp16 it can neither overflow nor be NaN
# from a finite input.
_BOUNDED_OPS = frozenset({"Softmax", "Sigmoid", "Tanh"})


# Ops that pass index values along without computing new ones (for the gather-index wrap of integer Mod).
_INDEX_PASSING = frozenset(
    {
        "Cast",
        "Reshape",
        "Unsqueeze",
        "Squeeze",
        "Flatten",
        "Expand",
        "Transpose",
        "Identity",
        "Slice",
        "Gather",
        "GatherElements",
        "Concat",
        "ArgMax",
        "ArgMin",
        "TopK",
    }
)


class Patterns:
    """The matchers of the table's patterns (``(index, node) -> bool``, the registered rules) and the other pattern
    tests the checker makes, on one graph."""

    def __init__(self, view: GraphView, values: ValueAnalysis, outputs_range_checked: bool = False) -> None:
        self.view = view
        self.values = values
        # The caller sees HTP's stand-ins for inf and NaN (65536, 98304) in the outputs (check_model's option).
        self.outputs_range_checked = outputs_range_checked

    def dynamic_value(self, node: NodeView) -> tuple[str, tuple[Any, ...]] | None:
        for name in list(node.input) + list(node.output):
            if not name or self.view.is_const(name):
                continue
            shape = self.view.shape(name)
            if shape is not None and any(not isinstance(d, int) for d in shape):
                return name, tuple(d if d is not None else "?" for d in shape)
        return None

    def over_rank(self, node: NodeView, max_rank: int) -> tuple[str, int] | None:
        for name in list(node.input) + list(node.output):
            shape = self.view.shape(name) if name and not self.view.is_const(name) else None
            if shape is not None and len(shape) > max_rank:
                return name, len(shape)
        return None

    def is_erf_gelu(self, index: int, node: NodeView) -> bool:
        """Erf inside x * 0.5 * (1 + erf(x / sqrt(2))): the QNN EP fuses it into one Gelu."""
        return self.gelu_structure(node) is True

    def gelu_structure(self, node: NodeView) -> bool | None:
        """For an Erf inside ``x * a * (b + erf(x / c))`` (or ``erf(x * c)``, either grouping of the products, scalar
        constants a, b, c): whether a, b and c are GELU's (0.5, 1, sqrt(2)); None for an Erf outside that shape.
        The QNN EP fuses the whole shape into one Gelu whatever the constants."""
        pre = self.view.producer(node.input[0]) if node.input else None
        if pre is None or pre.op_type not in ("Div", "Mul") or len(pre.input) != 2 or not node.output:
            return None
        k = self.view.scalar(pre.input[1])
        if k is None:
            return None
        want = math.sqrt(2.0) if pre.op_type == "Div" else 1 / math.sqrt(2.0)
        x = pre.input[0]
        adds = self.view.consumer_nodes(node.output[0])
        if len(adds) != 1 or adds[0].op_type != "Add" or not adds[0].output:
            return None
        add = adds[0]
        one = self.view.scalar(next((i for i in add.input if i != node.output[0]), ""))
        muls = self.view.consumer_nodes(add.output[0])
        if one is None or len(muls) != 1 or muls[0].op_type != "Mul" or not muls[0].output:
            return None
        mul = muls[0]
        other = next((i for i in mul.input if i != add.output[0]), "")
        # Either (x * 0.5) * (1 + erf) or x * (1 + erf) followed by * 0.5.
        halves: list[float | None] = []
        if other == x:
            tail = self.view.consumer_nodes(mul.output[0])
            if len(tail) == 1 and tail[0].op_type == "Mul":
                halves = [self.view.scalar(i) for i in tail[0].input]
        else:
            half = self.view.producer(other)
            if half is not None and half.op_type == "Mul" and x in half.input:
                halves = [self.view.scalar(i) for i in half.input if i != x]
        factors = [h for h in halves if h is not None]
        if not factors:
            return None
        return abs(k - want) <= 1e-3 and abs(one - 1.0) <= 1e-6 and any(abs(h - 0.5) < 1e-6 for h in factors)

    def touches_empty(self, node: NodeView) -> bool:
        """Whether an input or output of the node has no elements (a static dimension of 0). An empty constant in
        an optional-input slot that means "not given" (Resize's roi and scales) is a placeholder, not data."""
        placeholders = _EMPTY_PLACEHOLDERS.get((node.domain, node.op_type), ())
        for position, name in enumerate((*node.input, *node.output)):
            if position in placeholders and position < len(node.input) and self.view.is_const(name):
                continue
            if position == 1 and (self.empty_axes_reduce_all(node) or self._reshape_to_scalar(node)):
                continue
            shape = self.view.shape(name) if name else None
            if shape is not None and any(d == 0 for d in shape):
                return True
        return False

    def empty_axes_reduce_all(self, node: NodeView) -> bool:
        """A reduction given an empty axes input (static shape [0]) without noop_with_empty_axes: it reduces every
        axis, as if no axes were given."""
        if node.domain != "" or node.op_type not in REDUCE_AXES_INPUT or len(node.input) < 2 or not node.input[1]:
            return False
        return self._static_dims(node.input[1]) == (0,) and not self.view.attr(node, "noop_with_empty_axes")

    def _reshape_to_scalar(self, node: NodeView) -> bool:
        """A Reshape by a constant shape of no elements: its output is a scalar (one element), which QNN HTP takes.
        Reshape of x[1], x[1, 1] and x[1, 1, 1, 1] to shape [] (alone, and feeding a Mul) builds with CPU fallback
        disabled and matches the CPU EP (onnxruntime-qnn 2.7.0, soc_model 60): how ``unbind`` and ``squeeze`` of
        size-1 dims are written."""
        if node.domain != "" or node.op_type != "Reshape" or len(node.input) < 2 or not node.input[1]:
            return False
        return self.view.is_const(node.input[1]) and self._static_dims(node.input[1]) == (0,)

    def _runtime_empty_axes_ok(self, node: NodeView) -> bool:
        """An empty axes graph input is taken when the reduction's output is a graph output: onnxruntime does not
        infer the output shape of a reduction by runtime axes, and the QNN EP then fails on the node after it
        ("Cannot get shape": ReduceL2 and ReduceLogSum written as ReduceSum then Cast or Log)."""
        return bool(node.output) and node.output[0] in self.view.f.graph_outputs

    def _static_dims(self, name: str) -> tuple[int, ...] | None:
        shape = self.view.shape(name) if name else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return tuple(int(d) for d in shape)  # type: ignore[arg-type]

    def node_condition(self, node: NodeView, shape_free: bool = False) -> tuple[str, str, str | None] | None:
        """The first rule of the table's ``node_conditions`` that the node meets: (kind, reason, evidence). A rule
        names its ops and holds when every condition it lists holds (see tools/opcheck/tables.py). ``shape_free``:
        only the rules on runtime or given inputs, which hold whatever the shapes."""
        p = self.view.pattern("node_conditions")
        for rule in (p or {}).get("rules", ()):
            if shape_free and not set(rule) & {"runtime_inputs", "given_inputs"}:
                continue
            if node.op_type in rule["ops"] and self._meets(rule, node):
                return rule["kind"], f"{node.op_type}: {rule['reason']}", rule.get("evidence")
        return None

    def _meets(self, rule: dict[str, Any], node: NodeView) -> bool:
        present = [i for i, name in enumerate(node.input) if name]
        checks: list[bool] = []
        if "runtime_inputs" in rule:  # one of these inputs is given and is not a constant (an empty axes input
            # of a reduction carries no values: the EP reads it as absent)
            checks.append(
                any(
                    i in present
                    and not self.view.is_static(node.input[i])
                    and not (i == 1 and self.empty_axes_reduce_all(node) and self._runtime_empty_axes_ok(node))
                    for i in rule["runtime_inputs"]
                )
            )
        if "given_inputs" in rule:  # one of these optional inputs is given
            checks.append(any(i in present for i in rule["given_inputs"]))
        if "attr_in" in rule:  # every listed attribute (its default when absent) has one of these values
            checks.append(all(self.view.attr(node, a) in values for a, values in rule["attr_in"].items()))
        if "attr_not_in" in rule:  # some listed attribute has none of these values
            checks.append(any(self.view.attr(node, a) not in values for a, values in rule["attr_not_in"].items()))
        if "min_outputs" in rule:
            checks.append(sum(1 for o in node.output if o) >= rule["min_outputs"])
        if "max_inputs" in rule:
            checks.append(len(present) <= rule["max_inputs"])
        if "input_dtype" in rule:
            idx, allowed = rule["input_dtype"]
            checks.append(idx in present and self.view.dtype(node.input[idx]) in allowed)
        if "uneven_attr" in rule:  # an ints attribute whose values differ between axes
            values = self.view.attr(node, rule["uneven_attr"]) or []
            checks.append(len(set(values)) > 1)
        if "unbounded_input" in rule:  # this input may overflow inside HTP: it is not the output of a bounded op
            # (softmax, sigmoid, tanh) that QNN computes. HTP keeps an overflowed fp16 value inside the graph and
            # clamps it only at the output, so an op on QNN sees what a consumer on the CPU EP never would.
            name = node.input[rule["unbounded_input"]] if len(node.input) > rule["unbounded_input"] else ""
            producer = self.view.producer(name) if name else None
            bounded = producer is not None and producer.op_type in _BOUNDED_OPS and self.values.computed_on_qnn(name)
            checks.append(not bounded)
        if "unless_index_wrap" in rule:  # not a wrap of gather indices by the gathered axis's size (at most the limit)
            checks.append(not self._wraps_indices(node, rule["unless_index_wrap"]))
        if "power_of_two_divisor" in rule:  # this input is a one-element constant 2, 4, 8, ...
            idx = rule["power_of_two_divisor"]
            value = self.view.scalar(node.input[idx]) if len(node.input) > idx and node.input[idx] else None
            checks.append(value is not None and value >= 2 and value == int(value) and int(value) & int(value - 1) == 0)
        if "signed_dividend" in rule:  # this input may be negative (it is not >= 0 by construction)
            idx = rule["signed_dividend"]
            checks.append(len(node.input) > idx and not self.values.non_negative(node.input[idx]))
        if rule.get("unless_remainder_step"):  # not a quotient whose rounding the remainder built from it cancels
            checks.append(not self._rounding_free_remainder(node))
        if "input_rank" in rule:
            shape = self.view.shape(node.input[0]) if node.input else None
            checks.append(shape is None or len(shape) in rule["input_rank"])
        if "axis_before_last" in rule:  # the axis attribute (default -1) is not the input's last axis
            shape = self.view.shape(node.input[0]) if node.input else None
            axis = self.view.attr(node, "axis")
            axis = -1 if axis is None else int(axis)
            checks.append(shape is None or (axis + len(shape) if axis < 0 else axis) != len(shape) - 1)
        return bool(checks) and all(checks)

    def _wraps_indices(self, node: NodeView, limit: int) -> bool:
        """``Mod(i, d)`` by a constant ``1 <= d <= limit`` whose every use is the indices of a Gather or GatherElements
        along an axis of static size ``d`` (torch.onnx's ``take_along_dim`` and ``gather`` wrap negative indices so).
        PyTorch raises for an index outside [-d, d), so the dividends that reach QNN lie there, where HTP's fp16
        quotient i / d stays on the right side of every integer for d <= 1024 (measured exact for every i in
        [-d, d), d 3-1000). That holds for indices as PyTorch checks them: a graph input, or indices that views,
        casts, gathers or an arg-max pass along. A dividend that arithmetic computes is a hash, not an index
        (``(ids + 1) * 31 % 64`` into a 64-row table): it can be any size, and is not vouched for."""
        d = self.view.scalar(node.input[1]) if len(node.input) > 1 else None
        out = node.output[0] if node.output else ""
        if d is None or not 1 <= d <= limit or d != int(d) or not out or out in self.view.f.graph_outputs:
            return False
        if not self._index_like(node.input[0]):
            return False
        users = self.view.consumer_nodes(out)
        for user in users:
            if (
                user.op_type not in ("Gather", "GatherElements")
                or list(user.input[1:2]) != [out]
                or out == user.input[0]
            ):
                return False
            shape = self.view.shape(user.input[0])
            axis = self.view.attr(user, "axis") or 0
            if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] != int(d):
                return False
        return bool(users)

    def _remainder_step(self, div: NodeView) -> str | None:
        """The output of ``x - Div(x, b) * b`` when ``div`` is that Div (its only use the product by the same
        constant ``b``, the product's only use that subtraction), else None."""
        if len(div.input) != 2 or not div.output:
            return None
        x, b = div.input
        outputs = self.view.f.graph_outputs
        users = self.view.consumer_nodes(div.output[0])
        if len(users) != 1 or users[0].op_type != "Mul" or sorted(users[0].input) != sorted([div.output[0], b]):
            return None
        subs = self.view.consumer_nodes(users[0].output[0]) if users[0].output else []
        if len(subs) != 1 or subs[0].op_type != "Sub" or list(subs[0].input) != [x, users[0].output[0]]:
            return None
        if div.output[0] in outputs or users[0].output[0] in outputs:
            return None
        return subs[0].output[0] if subs[0].output else None

    def _first_step(self, quotient: NodeView | None, b: str, remainder: str) -> bool:
        """Whether ``quotient`` is ``Div(x, b)`` of a remainder step whose output is ``remainder``."""
        return (
            quotient is not None
            and quotient.op_type == "Div"
            and list(quotient.input[1:]) == [b]
            and self._remainder_step(quotient) == remainder
        )

    def _rounding_free_remainder(self, div: NodeView) -> bool:
        """``div`` is a quotient of the floor remainder ``r = x - (x / b) * b; (r + b) - ((r + b) / b) * b``
        (qnnx-export's integer Mod, a constant ``b > 0``), whose result is the same whether HTP's integer Div rounds
        down or toward zero: either way the first step leaves ``|r| < b``, so ``r + b`` is positive and the second
        quotient cannot differ. True for both of its Divs."""
        remainder = self._remainder_step(div)
        b = div.input[1] if len(div.input) == 2 else ""
        if remainder is None or not (self.view.scalar(b) or 0) > 0:
            return False
        # The second step: its dividend is r + b, r the remainder of a first step by the same b.
        shifted = self.view.producer(div.input[0])
        if shifted is not None and shifted.op_type == "Add" and len(shifted.input) == 2 and b in shifted.input:
            r = shifted.input[1] if shifted.input[0] == b else shifted.input[0]
            sub = self.view.producer(r)
            mul = self.view.producer(sub.input[1]) if sub is not None and len(sub.input) == 2 else None
            quotients = [self.view.producer(q) for q in mul.input] if mul is not None and mul.op_type == "Mul" else []
            if any(self._first_step(q, b, r) for q in quotients):
                return True
        # The first step: its remainder's only use is r + b, the dividend of a second step by b.
        users = self.view.consumer_nodes(remainder)
        if remainder in self.view.f.graph_outputs:
            return False
        if len(users) != 1 or users[0].op_type != "Add" or sorted(users[0].input) != sorted([remainder, b]):
            return False
        shifted_out = users[0].output[0] if users[0].output else ""
        return any(
            d.op_type == "Div" and list(d.input) == [shifted_out, b] and self._remainder_step(d) is not None
            for d in self.view.consumer_nodes(shifted_out)
        )

    def _index_like(self, name: str, depth: int = 8) -> bool:
        """Whether ``name`` is a graph input or constant, or comes from one only through ops that move, cast or pick
        index values (never through arithmetic that computes new ones)."""
        producer = self.view.producer(name)
        if producer is None:
            return True
        if depth == 0 or producer.op_type not in _INDEX_PASSING:
            return False
        if producer.op_type in ("ArgMax", "ArgMin", "TopK"):
            return True  # positions along an axis: within its size, as PyTorch computes them
        data = producer.input if producer.op_type == "Concat" else producer.input[:1]
        return all(self._index_like(i, depth - 1) for i in data if i)

    @rule("add_const_broadcast_layernorm")
    def _is_add_const_ln(self, index: int, node: NodeView) -> bool:
        """Add/Mul(x[N>1,...], const[1,...]) feeding LayerNormalization (wrong rows >= 1 on HTP)."""
        if len(node.input) != 2:
            return False
        a, b = node.input
        if self.view.is_const(a) == self.view.is_const(b):
            return False
        const, x = (a, b) if self.view.is_const(a) else (b, a)
        cs, xs = self.view.shape(const), self.view.shape(x)
        if cs is None or xs is None or len(cs) < 2 or len(cs) != len(xs):
            return False
        if cs[0] != 1 or not isinstance(xs[0], int) or xs[0] <= 1:
            return False
        return any(
            c.op_type == "LayerNormalization" and c.input[0] == node.output[0]
            for c in self.view.consumer_nodes(node.output[0])
        )

    @rule("rmsnorm_mul_weight")
    def _is_rmsnorm_mul(self, index: int, node: NodeView) -> bool:
        """Mul(weight_const, x * 1/sqrt(mean(x^2) + eps)) as written by Llama/T5-style RMSNorm."""
        p = self.view.pattern("rmsnorm_mul_weight") or {}
        orders = p.get("orders", ["const_first"])
        if len(node.input) != 2:
            return False
        a, b = node.input
        if self.view.is_const(a) and not self.view.is_const(b) and "const_first" in orders:
            inner = b
        elif self.view.is_const(b) and not self.view.is_const(a) and "const_second" in orders:
            inner = a
        else:
            return False
        mul = self.view.producer(inner)
        if mul is None or mul.op_type != "Mul":
            return False
        for name in mul.input:
            prod = self.view.producer(name)
            if prod is None:
                continue
            if prod.op_type == "Reciprocal":
                root = self.view.producer(prod.input[0])
                if root is not None and root.op_type == "Sqrt":
                    return True
            if prod.op_type == "Div" and self.view.scalar(prod.input[0]) == 1.0:
                root = self.view.producer(prod.input[1])
                if root is not None and root.op_type == "Sqrt":
                    return True
        return False

    @rule("fp16_discontinuous")
    def _is_fp16_discontinuous(self, index: int, node: NodeView) -> bool:
        """Floor/Ceil/Round/Mod/TopK on float, and Cast float -> integer or bool: rounding the input to fp16 moves
        it across an integer or reorders near-equal values, so the result changes by a whole step.

        A TopK whose input another QNN node computes is vouched for: that input is rounded to fp16 wherever TopK
        runs, and HTP's TopK of fp16 values returns the CPU EP's values (measured), so keeping it on the CPU would
        buy nothing. The step ops are not: the backend moves the float chain feeding them to the CPU as well."""
        if not self._is_float_op(index, node):
            return False
        if node.op_type == "TopK":
            return not self.values.computed_on_qnn(node.input[0])
        if node.op_type == "Cast":
            to = self.view.attr(node, "to")
            return to is not None and to not in _FLOAT_ELEM_TYPES
        return True

    @rule("fp16_imprecise")
    def _is_float_op(self, index: int, node: NodeView) -> bool:
        """A float input (HTP computes every float op in fp16)."""
        return bool(node.input) and self.view.dtype(node.input[0]) in FLOATS

    @rule("pow_fractional_exponent")
    def _is_pow_fractional(self, index: int, node: NodeView) -> bool:
        """Pow on float whose exponent is a runtime value or a constant (or a Cast/CastLike of one) with a non-integer
        element, unless the base cannot be negative (a positive constant, or computed by ops whose results are >= 0:
        x^2, |x|, exp, a sum of squares... as L2 normalization and vector norms write it)."""
        if not self._is_float_op(index, node) or len(node.input) < 2:
            return False
        import numpy as np

        exponent = self.view.const_value(node.input[1])
        cast = self.view.producer(node.input[1]) if exponent is None else None
        if cast is not None and cast.op_type in ("Cast", "CastLike") and cast.input:
            exponent = self.view.const_value(cast.input[0])  # a constant cast to the base's type (gelu_tanh's x^3)
        if exponent is not None:
            try:
                values = np.asarray(exponent, dtype=np.float64)
                if not bool((values != np.round(values)).any()):
                    return False
            except (TypeError, ValueError):
                pass
        return not self.values.non_negative(node.input[0])

    @rule("averagepool_defects")
    def _is_avgpool_defect(self, index: int, node: NodeView) -> bool:
        """AveragePool conditions QNN HTP computes wrongly (measured by tools/opcheck/conformance.py): a partial
        last window under ceil_mode, count_include_pad with padding (or at rank 5), a pad of half the kernel or
        more; an unknown input shape counts as a defect, since the conditions cannot be ruled out."""
        shape = self._static_dims(node.input[0]) if node.input else None
        if shape is None:
            return True
        spatial = len(shape) - 2
        kernel = list(self.view.attr(node, "kernel_shape") or [])
        if len(kernel) != spatial or (self.view.attr(node, "auto_pad") or "NOTSET") != "NOTSET":
            return True
        strides = list(self.view.attr(node, "strides") or [1] * spatial)
        pads = list(self.view.attr(node, "pads") or [0] * (2 * spatial))
        dilations = list(self.view.attr(node, "dilations") or [1] * spatial)
        if any(d != 1 for d in dilations):
            return True
        ceil = bool(self.view.attr(node, "ceil_mode"))
        count_pad = bool(self.view.attr(node, "count_include_pad"))
        return htp_averages_wrongly(shape, kernel, strides, pads, ceil=ceil, count_pad=count_pad)

    def _fused_scale(self, node: NodeView) -> tuple[float, bool] | None:
        """(c, over the last axis) when the QNN EP folds the factor of ``node``'s input into it: the Softmax reads
        ``Mul(x, c)`` or ``Mul(c, x)`` with ``c`` a float32 constant of rank 0, and nothing else reads the Mul."""
        source = node.input[0] if node.input else ""
        mul = self.view.producer(source) if source else None
        if mul is None or mul.op_type != "Mul" or mul.domain != "" or len(mul.input) != 2:
            return None
        if source in self.view.f.graph_outputs or len(self.view.consumer_nodes(source)) != 1:
            return None
        for factor, x in ((mul.input[1], mul.input[0]), (mul.input[0], mul.input[1])):
            value = self.view.const_value(factor) if factor else None
            if value is None or getattr(value, "ndim", None) != 0 or str(getattr(value, "dtype", "")) != "float32":
                continue
            shape = self.view.shape(x)
            axis = self.view.attr(node, "axis")
            axis = -1 if axis is None else int(axis)
            last = shape is not None and axis in (-1, len(shape) - 1)
            return float(value), last
        return None

    @rule("softmax_negative_scale_fusion")
    def _is_softmax_negative_scale(self, index: int, node: NodeView) -> bool:
        """A Softmax over its last axis that the QNN EP fuses with a negative rank-0 factor."""
        fused = self._fused_scale(node)
        return fused is not None and fused[1] and fused[0] < 0

    @rule("softmax_scale_fusion_axis")
    def _is_softmax_scale_axis(self, index: int, node: NodeView) -> bool:
        """A Softmax over another axis than the last that the QNN EP fuses with a rank-0 factor (or of an input
        whose rank is unknown)."""
        fused = self._fused_scale(node)
        return fused is not None and not fused[1]

    @rule("pad_unwritten_ends")
    def _is_pad_with_unwritten_ends(self, index: int, node: NodeView) -> bool:
        """A constant-mode float Pad with constant pads that pads the end of the last axis, or a float16 Pad of rank
        5 (``qnnx_clikit.htp_pads_wrongly``); pads given at run time are another rule's."""
        if not node.input or self.view.dtype(node.input[0]) not in FLOATS:
            return False
        if (self.view.attr(node, "mode") or "constant") != "constant" or len(node.input) < 2:
            return False
        pads = self.view.const_value(node.input[1])
        if pads is None:
            return False
        import numpy as np

        flat = [int(p) for p in np.asarray(pads).reshape(-1)]
        rank = len(flat) // 2
        if rank == 0 or any(p < 0 for p in flat):
            return False
        half = self.view.dtype(node.input[0]) == "float16"
        return htp_pads_wrongly(flat[:rank], flat[rank:], half=half)

    @rule("maxpool_ceil_dropped_window")
    def _is_maxpool_dropped_window(self, index: int, node: NodeView) -> bool:
        """MaxPool with ceil_mode whose last ceil window would start past the end of the (begin-padded) input: ONNX
        drops that window, so the output is one shorter than the ceil formula gives."""
        if not self.view.attr(node, "ceil_mode"):
            return False
        shape = self._static_dims(node.input[0]) if node.input else None
        kernel = list(self.view.attr(node, "kernel_shape") or [])
        if shape is None or len(kernel) != len(shape) - 2:
            return False
        spatial = len(kernel)
        strides = list(self.view.attr(node, "strides") or [1] * spatial)
        pads = list(self.view.attr(node, "pads") or [0] * (2 * spatial))
        dilations = list(self.view.attr(node, "dilations") or [1] * spatial)
        for axis in range(spatial):
            size, before, after = shape[axis + 2], pads[axis], pads[axis + spatial]
            span = size + before + after - (dilations[axis] * (kernel[axis] - 1) + 1)
            windows = -(-span // strides[axis]) + 1  # ceil
            if span >= 0 and (windows - 1) * strides[axis] >= size + before:
                return True
        return False

    @rule("merged_heads_matmul")
    def _is_merged_heads_matmul(self, index: int, node: NodeView) -> bool:
        """MatMul of ``Reshape(x[A, A, A, D] -> [A, A, A*D])`` (leading 1s or not, A > 1) by a rank-2 right operand:
        attention's output projection after merging as many heads as the two leading dims."""
        if len(node.input) != 2:
            return False
        a, b = self._static_dims(node.input[0]), self._static_dims(node.input[1])
        if a is None or b is None or len(b) != 2:
            return False
        # ONNX Runtime merges consecutive Reshapes before QNN sees them: any source up the chain counts.
        merge = self.view.producer(node.input[0])
        sources: list[tuple[int, ...] | None] = []
        while merge is not None and merge.op_type == "Reshape" and merge.input and len(sources) < 16:
            sources.append(self._static_dims(merge.input[0]))
            merge = self.view.producer(merge.input[0])
        return any(merges_heads(source, a) for source in sources)

    @rule("einsum_equation")
    def _is_einsum_beyond_matmul(self, index: int, node: NodeView) -> bool:
        """An Einsum whose equation is not one of the MatMul forms the QNN EP translates: ``...mk,...kn->...mn``,
        ``...mk,...nk->...mn`` (batch letters shared in place), ``bkhm,bnhk->bnhm`` (4-D, transposed throughout)
        and ``bhmk,hnk->bhmn``; any other equation is declined when the session is built."""
        text = str(self.view.attr(node, "equation") or "").replace(" ", "")
        lhs, arrow, out = text.partition("->")
        terms = lhs.split(",")
        if not arrow or len(terms) != 2 or any(len(t) < 2 or not t.isalpha() or not t.islower() for t in terms):
            return True
        if len(out) < 2 or not out.isalpha() or not out.islower():
            return True
        if einsum_has_diagonal(text):
            return False  # einsum_diagonal's class
        return not einsum_is_matmul(terms[0], terms[1], out)

    @rule("einsum_diagonal")
    def _is_einsum_diagonal(self, index: int, node: NodeView) -> bool:
        """An Einsum with a letter repeated within one term (a diagonal, ``ii,ij->ij``): the QNN EP reads it as a
        MatMul and computes something else."""
        return einsum_has_diagonal(str(self.view.attr(node, "equation") or "").replace(" ", ""))

    @rule("nonfinite_constant")
    def _uses_nonfinite_constant(self, index: int, node: NodeView) -> bool:
        """A constant holding inf or NaN that is compared against, or that can reach a graph output unchanged:
        HTP has no infinities (an inf constant reads as 65536, NaN as 98304), so the comparison is never true and the
        output is finite where PyTorch's is not. A -inf mask added before a Softmax is fine and is not matched."""
        nonfinite = [name for name in node.input if name and self.values.from_nonfinite_constant(name)]
        if not nonfinite:
            return False
        if node.op_type in _COMPARISONS:
            # Wrong only when an infinity can arrive on the other side at run time: a float graph input, or a
            # value computed from another inf/NaN constant. A mask built from integers with finfo.min (Hugging
            # Face's) never holds one, and the comparison is then false in PyTorch too.
            others = [name for name in node.input if name and name not in nonfinite]
            if not any(self.values.may_hold_nonfinite(name) for name in others):
                return False
            if node.op_type in _SELECTIONS:
                # Max/Min/Clip return one of their inputs, and saturation keeps the order: HTP's result is PyTorch's
                # saturated, which differs only where an infinity reaches an output (a comparison after it is
                # checked at that comparison). Phi-MoE's clamp(|scores|, min=max(masked scores)) feeds a Div.
                return self._nonfinite_reaches_output(node)
            return True
        return self._nonfinite_reaches_output(node)

    def _nonfinite_reaches_output(self, node: NodeView) -> bool:
        """Whether an infinity out of ``node`` can reach a graph output where nobody sees it: not when the caller
        checks the outputs' range, since HTP writes an inf or NaN constant there as 65536 or 98304."""
        if self.outputs_range_checked:
            return False
        return any(self.values.reaches_output_unabsorbed(o) for o in node.output if o)

    @rule("partial_weight_block")
    def is_partial_weight_block(self, index: int, node: NodeView) -> bool:
        """A block-wise DequantizeLinear (``block_size`` > 0) whose blocked dim is not a multiple of the block; a dim
        that cannot be known is counted (the class cannot be ruled out)."""
        block = self.view.attr(node, "block_size")
        if not isinstance(block, int) or block <= 0 or not node.input:
            return False
        dims = self._static_dims(node.input[0])
        if dims is None:
            return True
        axis = self.view.attr(node, "axis")
        axis = 1 if axis is None else int(axis)
        axis = axis + len(dims) if axis < 0 else axis
        return not 0 <= axis < len(dims) or dims[axis] % block != 0

    @rule("int64_reshape_rank5")
    def _is_int64_reshape_rank5(self, index: int, node: NodeView) -> bool:
        """Reshape of int64 data to a 5-D output (the output's rank from its shape, else from the constant shape
        input); an output rank that cannot be known is not counted."""
        if not node.input or self.view.dtype(node.input[0]) != "int64":
            return False
        shape = self.view.shape(node.output[0]) if node.output and node.output[0] else None
        if shape is not None:
            return len(shape) == 5
        target = self.view.const_value(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        return target is not None and target.size == 5

    @rule("int64_cast_rank5")
    def _is_int64_cast_rank5(self, index: int, node: NodeView) -> bool:
        """Cast to int64 (``to`` = 7) with a 5-D output (its rank from the output's shape, else from the input's)."""
        shape = next((s for s in map(self.view.shape, [*node.output[:1], *node.input[:1]]) if s is not None), None)
        return self.view.attr(node, "to") == 7 and shape is not None and len(shape) == 5

    @rule("matmul_rank5_first_axis_broadcast")
    def _is_matmul_rank5_broadcast(self, index: int, node: NodeView) -> bool:
        """A MatMul of two rank-5 inputs whose first axes differ (one broadcast): sizes, or named dims that are not
        the same name."""
        shapes = [self.view.shape(i) for i in node.input[:2]] if len(node.input) >= 2 else []
        if len(shapes) != 2 or any(s is None or len(s) != 5 for s in shapes):
            return False
        first = [s[0] for s in shapes if s is not None]
        return first[0] != first[1]

    def _rank5_broadcast(self, node: NodeView) -> bool:
        """Whether ``node``'s output is rank 5 and one of its inputs is rank 5 with another shape."""
        out = self._static_dims(node.output[0]) if node.output else None
        if out is None or len(out) != 5:
            return False
        shapes = [self._static_dims(i) for i in node.input if i]
        return any(s is not None and len(s) == 5 and tuple(s) != tuple(out) for s in shapes)

    @rule("where_rank5_broadcast")
    def _is_where_rank5_broadcast(self, index: int, node: NodeView) -> bool:
        """A rank-5 Where with a rank-5 input of another shape than its output (a broadcast)."""
        return self._rank5_broadcast(node)

    @rule("pow_rank5_broadcast")
    def _is_pow_rank5_broadcast(self, index: int, node: NodeView) -> bool:
        """A rank-5 Pow with a rank-5 input of another shape than its output (a broadcast)."""
        return self._rank5_broadcast(node)

    @rule("gather_rank5_output")
    def _is_gather_into_rank5(self, index: int, node: NodeView) -> bool:
        """A Gather by indices of rank >= 2 whose output has rank 5."""
        data = self.view.shape(node.input[0]) if node.input else None
        indices = self.view.shape(node.input[1]) if len(node.input) > 1 else None
        return data is not None and indices is not None and len(indices) >= 2 and len(data) - 1 + len(indices) == 5

    @rule("runtime_indices")
    def _has_runtime_indices(self, index: int, node: NodeView) -> bool:
        """GatherElements/ScatterElements whose indices are computed at run time (they may be negative, which
        QNN HTP gets wrong; constant indices are made non-negative at export or checked here)."""
        if len(node.input) < 2 or not node.input[1]:
            return False
        if not self.view.is_const(node.input[1]):
            return not self.values.non_negative(node.input[1])  # e.g. Max(index, 0), as qnnx writes index_copy
        value = self.view.const_value(node.input[1])
        return value is not None and bool((value < 0).any())

    @rule("gather_runtime_inner_axis")
    def _is_gather_inner_runtime(self, index: int, node: NodeView) -> bool:
        """Gather by runtime indices along an inner axis after a dim > 1, or along the last axis by indices of rank
        >= 2; with unknown shapes the class cannot be ruled out."""
        if len(node.input) < 2 or not node.input[1] or self.view.is_const(node.input[1]):
            return False
        data, indices = self._static_dims(node.input[0]), self._static_dims(node.input[1])
        if data is None or indices is None:
            return True
        axis = int(self.view.attr(node, "axis") or 0)
        axis = axis + len(data) if axis < 0 else axis
        if math.prod(data[:axis]) == 1:
            return False
        return not (axis == len(data) - 1 and len(indices) <= 1)

    @rule("gather_transposed_vector")
    def _is_gather_transposed_vector(self, index: int, node: NodeView) -> bool:
        """A Reshape of a Transpose's output to rank 1 that a Gather (axis 0) reads by indices of rank >= 2; with
        unknown index shapes the class cannot be ruled out."""
        if not node.input or (self.view.producer(node.input[0]) or node).op_type != "Transpose":
            return False
        out = self._static_dims(node.output[0]) if node.output else None
        if out is not None and len(out) != 1:
            return False
        for gather in self.view.consumer_nodes(node.output[0]):
            if gather.op_type != "Gather" or len(gather.input) < 2 or gather.input[0] != node.output[0]:
                continue
            indices = self._static_dims(gather.input[1])
            if out is None or indices is None or len(indices) >= 2:
                return True
        return False

    @rule("gathernd_runtime_slices")
    def _is_gathernd_runtime_slices(self, index: int, node: NodeView) -> bool:
        """GatherND by runtime indices holding more than 8 tuples along their second-to-last axis, each selecting a
        slice of rank 2 or more, or by runtime indices of rank 4 or more (wrong with a first axis longer than 8;
        rank 5 stops the process); with unknown shapes the class cannot be ruled out."""
        if len(node.input) < 2 or not node.input[1] or self.view.is_const(node.input[1]):
            return False
        data, indices = self._static_dims(node.input[0]), self._static_dims(node.input[1])
        if data is None or indices is None:
            return True
        if len(indices) >= 4:
            return True
        if len(indices) < 2:
            return False  # one index tuple
        slice_rank = len(data) - int(self.view.attr(node, "batch_dims") or 0) - indices[-1]
        return slice_rank >= 2 and indices[-2] > 8

    @rule("gather_scaled_by_constant")
    def _is_gather_scaled(self, index: int, node: NodeView) -> bool:
        """Mul of a one-element constant and rows gathered from a constant table by runtime int32 indices (through
        reshapes or transposes)."""
        if len(node.input) != 2:
            return False
        for scaled, factor in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            if not factor or not self.view.is_const(factor):
                continue
            value = self.view.const_value(factor)
            if value is None or getattr(value, "size", 0) != 1:
                continue
            source = self.view.producer(scaled)
            while source is not None and source.op_type in _MOVES and source.input:
                source = self.view.producer(source.input[0])
            if source is None or source.op_type != "Gather" or len(source.input) < 2:
                continue
            table, ids = source.input[0], source.input[1]
            if self.view.is_const(table) and not self.view.is_const(ids) and self.view.dtype(ids) in ("int32", None):
                return True
        return False

    @rule("flat_projection_into_heads")
    def _is_flat_projection_into_heads(self, index: int, node: NodeView) -> bool:
        """A Gemm or MatMul of x[A, A, K] reshaped to [A*A, K] whose result is reshaped (directly, or through a
        Reshape back to [A, A, N]) into [A, A, A, N/A] with A > 1 and N/A > 1."""
        if not node.input or not node.output:
            return False
        flatten = self.view.producer(node.input[0])
        if flatten is None or flatten.op_type != "Reshape" or not flatten.input:
            return False
        lead = self._static_dims(flatten.input[0])
        out = self._static_dims(node.output[0])
        if lead is None or out is None or len(lead) != 3 or len(out) != 2 or lead[0] != lead[1] or lead[0] < 2:
            return False
        side, n = lead[0], out[1]
        if out[0] != side * side or n % side or n // side < 2:
            return False
        heads = (side, side, side, n // side)
        todo = [node.output[0]]
        for _depth in range(2):  # the split, or the unflattening Reshape and then the split
            following = [c for name in todo for c in self.view.consumer_nodes(name) if c.op_type == "Reshape"]
            if any(self._static_dims(c.output[0]) == heads for c in following if c.output):
                return True
            todo = [c.output[0] for c in following if c.output and self._static_dims(c.output[0]) == (side, side, n)]
            if not todo:
                return False
        return False

    @rule("projection_regrouped_rank5")
    def _is_projection_regrouped_rank5(self, index: int, node: NodeView) -> bool:
        """A Reshape to rank 5 ``[..., N, k]`` (``k > 1``) of a MatMul's or Gemm's ``[..., N]`` product, directly or
        through Reshapes (which ONNX Runtime merges into one) and elementwise Add/Sub/Mul/Div (a bias)."""
        out = self._static_dims(node.output[0]) if node.output else None
        if out is None or len(out) != 5 or out[-1] < 2:
            return False
        name = node.input[0] if node.input else ""
        for _depth in range(8):
            producer = self.view.producer(name) if name else None
            if producer is None:
                return False
            if producer.op_type in ("MatMul", "Gemm"):
                product = self._static_dims(producer.output[0]) if producer.output else None
                return product is not None and product[-1] == out[-2]
            if producer.op_type == "Reshape":
                name = producer.input[0] if producer.input else ""
            elif producer.op_type in _ELEMENTWISE_ARITHMETIC:
                computed = [i for i in producer.input if i and not self.view.is_const(i)]
                if len(computed) != 1:
                    return False
                name = computed[0]
            else:
                return False
        return False

    @rule("conv_defects")
    def _is_conv_defect(self, index: int, node: NodeView) -> bool:
        """A Conv with one output channel and a stride >= 3, or with padding on an axis whose one output window
        leaves part of the input out; with unknown shapes, any Conv that has padding or a stride >= 3."""
        strides = list(self.view.attr(node, "strides") or [])
        pads = list(self.view.attr(node, "pads") or [])
        weights = self._static_dims(node.input[1]) if len(node.input) > 1 else None
        data = self._static_dims(node.input[0]) if node.input else None
        out = self._static_dims(node.output[0]) if node.output else None
        wide = any(s >= 3 for s in strides)
        if weights is None or out is None or data is None:
            return wide or any(pads)
        if wide and weights[0] == 1:
            return True
        spatial = len(out) - 2
        if len(pads) != 2 * spatial or len(weights) != spatial + 2:
            return False
        dilations = list(self.view.attr(node, "dilations") or [1] * spatial)
        return any(
            (pads[d] or pads[spatial + d])
            and out[2 + d] == 1
            and data[2 + d] > dilations[d] * (weights[2 + d] - 1) + 1 - pads[d]
            for d in range(spatial)
        )

    @rule("runtime_parameters")
    def _has_runtime_parameters(self, index: int, node: NodeView) -> bool:
        """A shape-like parameter input (Slice starts/ends/axes/steps, Tile repeats, Expand shape) that is not a
        constant: QNN HTP refuses the node at session creation."""
        p = self.view.pattern("runtime_parameters") or {}
        positions = p.get("inputs", {}).get(node.op_type, [])
        return any(i < len(node.input) and node.input[i] and not self.view.is_const(node.input[i]) for i in positions)

    @rule("convtranspose3d_pads_differ")
    def _is_convtranspose3d_uneven(self, index: int, node: NodeView) -> bool:
        """A 3-D ConvTranspose (weight of rank 5) whose first two spatial axes have different (begin, end) pads."""
        weights = self._static_dims(node.input[1]) if len(node.input) > 1 else None
        pads = list(self.view.attr(node, "pads") or [])
        if weights is None or len(weights) != 5 or len(pads) != 6:
            return False
        return (pads[0], pads[3]) != (pads[1], pads[4])

    @rule("convtranspose_output_padding")
    def _has_output_padding(self, index: int, node: NodeView) -> bool:
        """A ConvTranspose with a nonzero output_padding."""
        return any(int(p) for p in (self.view.attr(node, "output_padding") or []))

    @rule("convtranspose3d_groups")
    def _is_grouped_convtranspose3d(self, index: int, node: NodeView) -> bool:
        """A 3-D ConvTranspose (weight of rank 5) with more than one group."""
        weights = self._static_dims(node.input[1]) if len(node.input) > 1 else None
        return weights is not None and len(weights) == 5 and int(self.view.attr(node, "group") or 1) > 1

    @rule("convtranspose3d_strides_differ")
    def _is_convtranspose3d_strided_unevenly(self, index: int, node: NodeView) -> bool:
        """A 3-D ConvTranspose (weight of rank 5) whose last two spatial axes have different strides."""
        weights = self._static_dims(node.input[1]) if len(node.input) > 1 else None
        strides = list(self.view.attr(node, "strides") or [])
        return weights is not None and len(weights) == 5 and len(strides) == 3 and strides[1] != strides[2]

    @rule("convtranspose_dilation")
    def _is_dilated(self, index: int, node: NodeView) -> bool:
        """ConvTranspose with a dilation above 1 (QNN HTP refuses it)."""
        return any(d != 1 for d in (self.view.attr(node, "dilations") or []))


#: Every registered rule, in definition order.
PATTERN_RULES: tuple[PatternRule, ...] = tuple(_RULES)
