"""Fusions of decomposed math into the one op QNN HTP computes right: RMSNorm, Erf GELU, softplus."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import PassResult

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "FuseErfGelu",
    "FuseRMSNorm",
    "FuseSoftplus",
    "LogSigmoidToSoftplus",
    "RMSNormWeightLast",
    "SoftplusStable",
]


# ------------------------------------------------------------------------------------ RMSNorm weight


@register(order=150)
class RMSNormWeightLast(QnnPass):
    """Put the weight last in RMSNorm's final multiply: ``Mul(w, x*rsqrt(..))`` -> ``Mul(x*rsqrt(..), w)``.

    QNN HTP fails to finalize ``Mul(weight_initializer, x * Reciprocal(Sqrt(ReduceMean(x^2) + eps)))``
    with ``QNN_COMMON_ERROR_MEM_ALLOC`` (code 1002) even with CPU fallback allowed (onnxruntime-qnn
    2.7.0), which kills Llama/Qwen2/T5-style models; the same math with the weight as the second
    operand finalizes (measured rel. error 6e-4). Multiplication commutes, so the rewrite is exact.
    """

    name = "rmsnorm_weight_last"
    defect = "Mul(weight, x*rsqrt(mean(x^2)+eps)) fails QNN graph finalize with QNN_COMMON_ERROR_MEM_ALLOC"

    @staticmethod
    def _is_rms_normalized(value: ir.Value | None) -> bool:
        """True when ``value`` is x * 1/sqrt(...ReduceMean...) or x / sqrt(...ReduceMean...)."""
        prod = value.producer() if value is not None else None
        if prod is None or prod.op_type not in ("Mul", "Div"):
            return False
        for inp in prod.inputs:
            cur, depth = inp, 0
            while cur is not None and cur.producer() is not None and depth < 5:
                producer = cast(ir.Node, cur.producer())  # checked just above
                op = producer.op_type
                if op == "ReduceMean":
                    return True
                if op not in ("Reciprocal", "Sqrt", "Add", "Div", "Cast", "Pow", "Mul"):
                    break
                # Follow the non-constant input (the statistic), not eps or the numerator 1.
                nxt = [v for v in producer.inputs if v is not None and _graph.const_array(v) is None]
                cur = nxt[0] if nxt else None
                depth += 1
        return False

    def _matches(self, graph: ir.Graph) -> list[ir.Node]:
        return [
            n
            for n in graph
            if n.op_type == "Mul"
            and len(n.inputs) == 2
            and _graph.const_array(n.inputs[0]) is not None
            and _graph.const_array(n.inputs[1]) is None
            and self._is_rms_normalized(n.inputs[1])
        ]

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "Mul" for n in self._matches(graph)]

    def rewrite(self, graph: ir.Graph) -> bool:
        nodes = self._matches(graph)
        for node in nodes:
            weight, normalized = node.inputs[0], node.inputs[1]
            node.replace_input_with(0, normalized)
            node.replace_input_with(1, weight)
        return bool(nodes)


# ------------------------------------------------------------------- decomposed RMSNorm -> RMSNormalization

# Opset versions whose semantics differ from opset 20 for an op that exists in both (everything else between 20
# and 23 only added types): a graph holding one of these cannot be moved to opset 23 unchanged.
_CHANGED_BEFORE_23 = frozenset({"GroupNormalization"})
_RMS_OPSET = 23


@register(order=140)
class FuseRMSNorm(QnnPass):
    """Fuse the decomposed RMSNorm, ``x * 1/sqrt(mean(x^2) + eps) [* w]``, into one ``RMSNormalization`` (opset 23).

    The decomposed form squares ``x`` in fp16 on HTP, which overflows once ``|x|`` passes 256 (65504 is the largest
    fp16): a row of magnitude 400 came back 0.64-0.85 of its scale off (onnxruntime-qnn 2.7.0, soc 60), and LLM
    hidden states carry outliers of that size. HTP's RMSNormalization keeps the statistic in higher precision: the
    same rows are within 7.5e-4 for magnitudes up to 2000. The model's default opset moves to 23, which only
    adds types to the ops of opset 20, unless the graph holds an op whose meaning changed since
    (GroupNormalization), in which case nothing is fused.

    Shape classes: HTP's RMSNormalization is right only on a rank-2 input ``[rows, width]``. At rank 3 to 5 it
    returns wrong rows without an error for many shapes (onnxruntime-qnn 2.7.0, soc 60: ``[1, 16, 4, 16]`` cosine
    -0.02, ``[16, 4, 16]`` 0.46, ``[4, 16, 16]`` 0.55, while ``[1, 64, 16]`` and ``[2, 16, 64]`` are right), which made
    Qwen3's QK-norm wrong. Rank 2 was right for every rows x width measured (1-256 x 1-128). So the pass always
    normalizes the 2-D view ``[prod(leading dims), prod(normalized dims)]`` and reshapes back: exact, and the one
    class proven right. ``tests/test_pass_conformance.py`` checks ranks 1-5, unit dims and multi-axis norms.
    """

    name = "fuse_rmsnorm"
    defect = "the decomposed RMSNorm overflows fp16 on QNN HTP for |x| > 256 (silent wrong output)"

    def call(self, model: ir.Model) -> PassResult:
        graph = model.graph
        if any(n.op_type in _CHANGED_BEFORE_23 and n.domain in ("", "ai.onnx") for n in graph):
            return PassResult(model, modified=False)
        if not self._matches(graph):
            return PassResult(model, modified=False)
        if graph.opset_imports.get("", 0) < _RMS_OPSET:
            graph.opset_imports[""] = _RMS_OPSET
            model.opset_imports[""] = _RMS_OPSET
        return super().call(model)

    @staticmethod
    def _single_use(value: ir.Value) -> ir.Node | None:
        uses = list(value.uses())
        if len(uses) != 1 or value.is_graph_output():
            return None
        return uses[0].node

    def _match(self, mean: ir.Node) -> tuple[ir.Value, list[int], float, ir.Node, ir.Value | None, ir.Node] | None:
        """For a ReduceMean in the pattern: (x, axes, eps, normalizing node, weight or None, last node)."""
        if not _graph.is_op(mean, "ReduceMean"):
            return None
        if mean.attributes.get_int("keepdims", 1) != 1 or len(mean.inputs) < 2:
            return None
        axes_arr = _graph.const_array(mean.inputs[1])
        sq = _graph.input_producer(mean)
        if axes_arr is None or sq is None:
            return None
        if (
            sq.op_type == "Pow"
            and _graph.const_array(sq.inputs[1]) is not None
            and float(cast(np.ndarray, _graph.const_array(sq.inputs[1])).reshape(-1)[0]) == 2.0
        ) or (sq.op_type == "Mul" and sq.inputs[0] is sq.inputs[1]):
            x = sq.inputs[0]
        else:
            return None
        shape = _graph.static_shape(x)
        if shape is None or x is None or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return None
        rank = len(shape)
        axes = sorted(int(a) % rank for a in axes_arr.reshape(-1))
        if not axes or axes != list(range(rank - len(axes), rank)):
            return None  # RMSNormalization normalizes the trailing axes from `axis` on
        add = self._single_use(mean.outputs[0])
        if add is None or add.op_type != "Add":
            return None
        eps_value = add.inputs[1] if add.inputs[0] is mean.outputs[0] else add.inputs[0]
        eps_arr = _graph.const_array(eps_value)
        if eps_arr is None or eps_arr.size != 1:
            return None
        eps = float(eps_arr.reshape(-1)[0])
        root = self._single_use(add.outputs[0])
        if root is None or root.op_type != "Sqrt":
            return None
        nxt = self._single_use(root.outputs[0])
        if nxt is None:
            return None
        norm: ir.Node | None
        if nxt.op_type == "Div" and nxt.inputs[1] is root.outputs[0] and nxt.inputs[0] is x:
            norm = nxt
        elif nxt.op_type == "Reciprocal":
            norm = self._single_use(nxt.outputs[0])
            if norm is None or norm.op_type != "Mul" or x not in norm.inputs or nxt.outputs[0] not in norm.inputs:
                return None
        else:
            return None
        last, weight = norm, None
        user = self._single_use(norm.outputs[0])
        if user is not None and user.op_type == "Mul":
            other = user.inputs[1] if user.inputs[0] is norm.outputs[0] else user.inputs[0]
            w = _graph.const_array(other)
            if (
                w is not None
                and w.dtype == np.dtype(x.dtype.numpy())
                and tuple(w.shape) == tuple(shape[rank - len(axes) :])
            ):
                last, weight = user, other
        return x, axes, eps, norm, weight, last

    def _matches(self, graph: ir.Graph) -> list[tuple[ir.Value, list[int], float, ir.Node, ir.Value | None, ir.Node]]:
        return [m for m in (self._match(n) for n in graph) if m is not None]

    def find_defects(self, graph: ir.Graph) -> list[str]:
        if any(n.op_type in _CHANGED_BEFORE_23 and n.domain in ("", "ai.onnx") for n in graph):
            return []  # such a graph cannot move to opset 23: nothing this pass could fuse
        return [m[3].name or "RMSNorm" for m in self._matches(graph)]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_rmsnorm")
        matches = self._matches(graph)
        # A norm of a norm (``norm(norm(x))``): the inner one's output is replaced before the outer one is rewritten,
        # so the outer one reads the replacement, and the inner decomposed nodes are left with no use.
        replaced: dict[ir.Value, ir.Value] = {}
        for x, axes, eps, _norm, weight, last in matches:
            x = replaced.get(x, x)
            shape = _graph.static_shape(x)
            assert shape is not None
            lead, trail = shape[: len(shape) - len(axes)], shape[len(shape) - len(axes) :]
            width = math.prod(trail)
            # _match checked x's dtype and that the weight is a constant.
            scale = (
                np.ones(width, dtype=cast(ir.DataType, x.dtype).numpy())
                if weight is None
                else cast(np.ndarray, _graph.const_array(weight)).reshape(width)
            )
            weight = _graph.add_initializer(graph, names("scale"), scale)
            out = last.outputs[0]
            new_nodes: list[ir.Node] = []
            src = x
            # QNN HTP computes RMSNormalization right only on a rank-2 input, over its last axis (see the class
            # docstring): normalize the [rows, width] view of x, then restore the shape.
            flat_shape = (math.prod(lead), width)
            flat = tuple(shape) != flat_shape
            if flat:
                src = _graph.new_value(names("flat"), x.dtype, flat_shape)
                target = _graph.add_initializer(graph, names("flat_shape"), np.array(flat_shape, dtype=np.int64))
                new_nodes.append(ir.Node("", "Reshape", [x, target], outputs=[src]))
            normed = _graph.new_value(names("out"), out.dtype, flat_shape)
            new_nodes.append(
                ir.Node(
                    "",
                    "RMSNormalization",
                    [src, weight],
                    attributes=[ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", eps)],
                    outputs=[normed],
                )
            )
            if flat:
                back = _graph.add_initializer(graph, names("shape"), np.array(shape, dtype=np.int64))
                restored = _graph.new_value(names("restored"), out.dtype, shape)
                new_nodes.append(ir.Node("", "Reshape", [normed, back], outputs=[restored]))
                normed = restored
            graph.insert_after(last, new_nodes)
            _graph.replace_value(graph, out, normed)
            replaced[out] = normed
        return bool(matches)


# --------------------------------------------------------------------------------------- Erf GELU


@register(order=50)
class FuseErfGelu(QnnPass):
    """Fuse the Erf form of GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``, into one ``Gelu`` node (opset 20).

    QNN HTP rejects a standalone ``Erf`` in every dtype ("Operators of type Erf are not supported",
    onnxruntime-qnn 2.7.0); only the fused Gelu runs. Models that write GELU by hand (older BERT
    code, TorchScript-era exports) carry the Erf form. Gelu(approximate="none") is the same function.
    """

    name = "fuse_erf_gelu"
    defect = "standalone Erf is rejected by QNN HTP"

    @staticmethod
    def _scalar(value: ir.Value | None) -> float | None:
        arr = _graph.const_array(value)
        if arr is None or arr.size != 1 or arr.dtype.kind != "f":
            return None
        return float(arr.reshape(()))

    def _is(self, value: ir.Value | None, target: float, tol: float = 1e-3) -> bool:
        s = self._scalar(value)
        return s is not None and abs(s - target) <= tol * abs(target)

    def _other(self, node: ir.Node, const_target: float) -> ir.Value | None:
        """For a binary node with one scalar input == const_target, return the other input."""
        a, b = node.inputs
        if self._is(b, const_target):
            return a
        if self._is(a, const_target):
            return b
        return None

    def _match(self, erf: ir.Node) -> tuple[ir.Value, ir.Value] | None:
        """Return (x, gelu_output_value) for an Erf node in a GELU pattern."""
        pre = cast(ir.Value, erf.inputs[0]).producer()  # Erf has its one input
        if pre is None:
            return None
        if pre.op_type == "Div":
            x = pre.inputs[0] if self._is(pre.inputs[1], math.sqrt(2.0)) else None
        elif pre.op_type == "Mul":
            x = self._other(pre, 1.0 / math.sqrt(2.0))
        else:
            x = None
        if x is None:
            return None
        uses = list(erf.outputs[0].uses())
        if len(uses) != 1 or uses[0].node.op_type != "Add":
            return None
        add = uses[0].node
        if self._other(add, 1.0) is not erf.outputs[0]:
            return None
        uses = list(add.outputs[0].uses())
        if len(uses) != 1 or uses[0].node.op_type != "Mul":
            return None
        mul = uses[0].node
        other = mul.inputs[1 - uses[0].idx]
        # Case A: Mul(add, Mul(x, 0.5)).
        other_prod = other.producer() if other is not None else None
        if other_prod is not None and other_prod.op_type == "Mul" and self._other(other_prod, 0.5) is x:
            return x, mul.outputs[0]
        # Case B: Mul(add, x) then * 0.5 or / 2.
        if other is x:
            uses = list(mul.outputs[0].uses())
            if len(uses) == 1:
                last = uses[0].node
                if last.op_type == "Mul" and self._other(last, 0.5) is mul.outputs[0]:
                    return x, last.outputs[0]
                if last.op_type == "Div" and last.inputs[0] is mul.outputs[0] and self._is(last.inputs[1], 2.0):
                    return x, last.outputs[0]
        return None

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "Erf" for n in graph if n.op_type == "Erf" and self._match(n) is not None]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_gelu")
        changed = False
        for erf in [n for n in graph if n.op_type == "Erf"]:
            match = self._match(erf)
            if match is None:
                continue
            x, out = match
            new = _graph.new_value(names("out"), out.dtype, _graph.static_shape(out))
            gelu = ir.Node("", "Gelu", [x], attributes=[ir.AttrString("approximate", "none")], outputs=[new])
            graph.insert_after(cast(ir.Node, out.producer()), gelu)  # out is a Mul/Div output
            _graph.replace_value(graph, out, new)
            changed = True
        return changed


# --------------------------------------------------------------------------- Log(Exp(z) + 1) -> Softplus(z)


def _elementwise(
    graph: ir.Graph, names: UniqueNames, x: ir.Value, build: Callable[[ir.Value], tuple[list[ir.Node], ir.Value]]
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes ``build`` makes for an elementwise function of ``x``, and its output value.

    QNN HTP refuses Softplus, Neg and Log on rank-5 tensors (onnxruntime-qnn 2.7.0, soc 60; ranks 1-4 run, whatever
    the dims): a rank-5 input is computed on its 1-D view and reshaped back, which is exact for elementwise math.
    """
    shape = _graph.static_shape(x)
    if shape is None or len(shape) <= 4:
        return build(x)
    target = _graph.add_initializer(graph, names("flat_shape"), np.array([math.prod(shape)], dtype=np.int64))
    flat = _graph.new_value(names("flat"), x.dtype, (math.prod(shape),))
    nodes, out = build(flat)
    back = _graph.add_initializer(graph, names("shape"), np.array(shape, dtype=np.int64))
    restored = _graph.new_value(names("out"), x.dtype, shape)
    return [
        ir.Node("", "Reshape", [x, target], outputs=[flat]),
        *nodes,
        ir.Node("", "Reshape", [out, back], outputs=[restored]),
    ], restored


def _stable_softplus(graph: ir.Graph, names: UniqueNames, x: ir.Value, negate: bool) -> tuple[list[ir.Node], ir.Value]:
    """``softplus(x) = relu(x) + log(1 + exp(-|x|))`` (or ``logsigmoid(x) = x - relu(x) - log(1 + exp(-|x|))``
    with ``negate``): the exp never exceeds 1, so nothing overflows fp16, and every op is one HTP computes to fp16
    precision. HTP's own Softplus is off by 1.4e-2 of its value near 0 (0.893 for softplus(0.346) = 0.881,
    onnxruntime-qnn 2.7.0, soc 60); this form stays within 4.7e-3 there and 3.9e-4 of the scale on [-20, 20]."""
    dtype = cast(ir.DataType, x.dtype).numpy()
    minus_one = _graph.add_initializer(graph, names("minus_one"), np.array(-1.0, dtype=dtype))
    one = _graph.add_initializer(graph, names("one"), np.array(1.0, dtype=dtype))

    def build(v: ir.Value) -> tuple[list[ir.Node], ir.Value]:
        vals = _graph.new_values(
            names, x.dtype, dict.fromkeys(("abs", "neg", "exp", "plus1", "log", "relu", "out"), _graph.static_shape(v))
        )
        nodes = [
            ir.Node("", "Abs", [v], outputs=[vals["abs"]]),
            ir.Node("", "Mul", [vals["abs"], minus_one], outputs=[vals["neg"]]),
            ir.Node("", "Exp", [vals["neg"]], outputs=[vals["exp"]]),
            ir.Node("", "Add", [vals["exp"], one], outputs=[vals["plus1"]]),
            ir.Node("", "Log", [vals["plus1"]], outputs=[vals["log"]]),
            ir.Node("", "Relu", [v], outputs=[vals["relu"]]),
        ]
        if not negate:
            nodes.append(ir.Node("", "Add", [vals["relu"], vals["log"]], outputs=[vals["out"]]))
        else:
            low = _graph.new_value(names("min0"), x.dtype, _graph.static_shape(v))
            nodes.append(ir.Node("", "Sub", [v, vals["relu"]], outputs=[low]))
            nodes.append(ir.Node("", "Sub", [low, vals["log"]], outputs=[vals["out"]]))
        return nodes, vals["out"]

    return _elementwise(graph, names, x, build)


def _nonpositive(value: ir.Value | None) -> bool:
    """True when ``value`` is ``-|x|`` by construction (``Mul(Abs(x), c)`` with a constant c <= 0, or ``Neg(Abs(x))``)."""
    prod = value.producer() if value is not None else None
    if prod is None:
        return False
    if prod.op_type == "Neg":
        inner = _graph.input_producer(prod)
        return inner is not None and inner.op_type == "Abs"
    if prod.op_type != "Mul" or len(prod.inputs) != 2:
        return False
    for a, c in ((prod.inputs[0], prod.inputs[1]), (prod.inputs[1], prod.inputs[0])):
        k = _graph.const_array(c)
        inner = a.producer() if a is not None else None
        if (
            k is not None
            and k.size == 1
            and float(k.reshape(-1)[0]) <= 0
            and inner is not None
            and inner.op_type == "Abs"
        ):
            return True
    return False


@register(order=110)
class FuseSoftplus(QnnPass):
    """Rewrite ``Log(Add(Exp(z), 1))`` (torch.onnx's ``log1p(exp(z))``, as in ``soft_margin_loss``) as the
    overflow-free softplus ``relu(z) + log(1 + exp(-|z|))``.

    The same function, but the decomposed form overflows fp16 on HTP as soon as ``z`` passes 11 (``exp(z)`` >
    65504): ``soft_margin_loss`` on inputs in [-9, 9] came back 0.80 of its value off (onnxruntime-qnn 2.7.0).
    HTP's own Softplus op avoids the overflow but is off by 1.4e-2 of its value near 0, and is refused at rank 5;
    the stable form is within fp16 rounding at every rank 1-5 (``tests/test_pass_conformance.py``). A ``z`` known
    to be non-positive (``-|x|``, as in the stable form itself) cannot overflow and is left alone.
    """

    name = "fuse_softplus"
    defect = "log1p(exp(z)) overflows fp16 on QNN HTP for z > 11 (silent wrong output)"

    def match(self, log_node: ir.Node) -> ir.Value | None:
        """The ``z`` of a Log(Add(Exp(z), 1)) ending at ``log_node``, or None."""
        add = _graph.input_producer(log_node) if _graph.is_op(log_node, "Log") else None
        if add is None or add.op_type != "Add" or len(add.inputs) != 2:
            return None
        for exp_in, one in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            exp = exp_in.producer() if exp_in is not None else None
            value = _graph.const_array(one)
            if (
                exp is not None
                and exp.op_type == "Exp"
                and not _nonpositive(exp.inputs[0])
                and value is not None
                and value.size == 1
                and float(value.reshape(-1)[0]) == 1.0
                and _graph.static_shape(exp.inputs[0]) == _graph.static_shape(log_node.outputs[0])
            ):
                return exp.inputs[0]
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        return self.replace_matched(
            graph, "qnnx_softplus", lambda names, _, z: _stable_softplus(graph, names, z, negate=False)
        )


# ------------------------------------------------------------------- Softplus -> the overflow-free form


@register(order=120)
class SoftplusStable(QnnPass):
    """Rewrite a ``Softplus`` node (torch.onnx's ``softplus``) as ``relu(x) + log(1 + exp(-|x|))``, the same
    function.

    QNN HTP's Softplus is off by up to 1.4e-2 of its value near 0 (softplus(0) came back 0.703 for 0.693;
    onnxruntime-qnn 2.7.0, soc 60) and is refused at rank 5. The stable form is within fp16 rounding at every rank
    1-5 (``tests/test_pass_conformance.py``).
    """

    name = "softplus_stable"
    defect = "Softplus on QNN HTP is off by 1.4e-2 of its value near 0 (silent imprecise output)"

    def match(self, node: ir.Node) -> ir.Value | None:
        return _graph.float_op_input(node, "Softplus")

    def rewrite(self, graph: ir.Graph) -> bool:
        return self.replace_matched(
            graph, "qnnx_softplus", lambda names, _, x: _stable_softplus(graph, names, x, negate=False)
        )


# ------------------------------------------------------------------- Log(Sigmoid(x)) -> -Softplus(-x)


@register(order=130)
class LogSigmoidToSoftplus(QnnPass):
    """Rewrite ``Log(Sigmoid(x))`` (torch.onnx's ``logsigmoid``) as ``x - relu(x) - log(1 + exp(-|x|))``, the same
    function (``-softplus(-x)`` in its overflow-free form).

    QNN HTP's Sigmoid has an absolute error of about 3e-4 (onnxruntime-qnn 2.7.0, soc 60), which the Log turns
    into a large error wherever the sigmoid is small: ``logsigmoid`` on [-9, 9] came back 0.15 of the output's
    scale off. The stable form is within fp16 rounding of the output's scale at every rank 1-5.
    """

    name = "logsigmoid_to_softplus"
    defect = "Log(Sigmoid(x)) on QNN HTP loses the small sigmoid values (silent wrong output)"

    def match(self, log_node: ir.Node) -> ir.Node | None:
        sig = _graph.input_producer(log_node) if _graph.is_op(log_node, "Log") else None
        return sig if _graph.is_op(sig, "Sigmoid") else None

    def rewrite(self, graph: ir.Graph) -> bool:
        # A Sigmoid has its one input.
        return self.replace_matched(
            graph,
            "qnnx_logsigmoid",
            lambda names, _, sig: _stable_softplus(graph, names, cast(ir.Value, sig.inputs[0]), negate=True),
        )
