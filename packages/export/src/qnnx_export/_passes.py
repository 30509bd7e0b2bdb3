"""ONNX -> ONNX rewrites that make exported graphs safe for the QNN execution provider.

Each pass is an ``onnx_ir`` in-place pass with a precondition (``requires``), the rewrite
(``call``, which reports whether it changed the graph) and a postcondition (``ensures``) that
checks the defect it targets is gone. Every rewrite is exact or within fp16 rounding: a pass never
trades accuracy for placement. Defects cite onnxruntime-qnn 2.7.0 (QNN SDK 2.51) on the x86 HTP
simulator with ``soc_model=60``, where they were reproduced.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, ClassVar, cast

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult, PostconditionError, PreconditionError
from onnx_ir.passes.common import RemoveUnusedNodesPass

from qnnx_export._naming import UniqueNames
from qnnx_export._pass_names import DEFAULT_PASSES

__all__ = ["DEFAULT_PASSES", "PASS_REGISTRY", "QnnPass", "run_passes"]

log = logging.getLogger(__name__)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


# --------------------------------------------------------------------------------------------- helpers


def _const(value: ir.Value | None) -> np.ndarray | None:
    """Return the constant array behind ``value`` (initializer or Constant node), else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:
        return None


def _shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """Return the static shape of ``value`` or None when unknown or symbolic."""
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


def _names(graph: ir.Graph, prefix: str) -> UniqueNames:
    """Fresh value/node names ``<prefix>_<hint>...`` that collide with nothing in the graph."""
    taken = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    for node in graph:
        taken.update(o.name for o in node.outputs if o.name)
        if node.name:
            taken.add(node.name)
    return UniqueNames(taken, prefix=f"{prefix}_")


def _add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def _new_value(name: str, dtype: ir.DataType | None, shape: Iterable[int] | None) -> ir.Value:
    return ir.Value(
        name=name,
        type=ir.TensorType(dtype) if dtype is not None else None,
        shape=ir.Shape(list(shape)) if shape is not None else None,
    )


def _producer_op(value: ir.Value | None) -> str | None:
    node = value.producer() if value is not None else None
    if node is None:
        return None
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


class QnnPass(InPlacePass):
    """Base of the QNN-safety passes: a named, documented in-place rewrite with checks.

    Attributes:
        name: Registry name used in :attr:`ExportOptions.passes`.
        defect: One sentence: the QNN defect avoided and where it was observed.
    """

    name: ClassVar[str] = ""
    defect: ClassVar[str] = ""

    def requires(self, model: ir.Model) -> None:
        if model.graph.opset_imports.get("", 0) < 20:
            raise PreconditionError(f"{self.name} expects opset >= 20, got {model.graph.opset_imports.get('')}")

    def call(self, model: ir.Model) -> PassResult:
        changed = self.rewrite(model.graph)
        if changed:
            RemoveUnusedNodesPass()(model)
            model.graph.sort()
        return PassResult(model, modified=changed)

    def rewrite(self, graph: ir.Graph) -> bool:  # pragma: no cover - abstract
        """Rewrite ``graph`` in place; return True when something changed."""
        raise NotImplementedError

    def match(self, node: ir.Node) -> Any:
        """For a pass that matches node by node: what :meth:`rewrite` needs for ``node``, or None."""
        return None

    def matched(self, graph: ir.Graph) -> list[tuple[ir.Node, Any]]:
        """Every node of ``graph`` with its :meth:`match`, taken before any rewrite."""
        return [(n, m) for n in list(graph) if (m := self.match(n)) is not None]

    def find_defects(self, graph: ir.Graph) -> list[str]:
        """Return a description of every occurrence of the defect still in ``graph`` (by default: the nodes
        :meth:`match` still finds)."""
        return [n.name or n.op_type for n, _ in self.matched(graph)]

    def ensures(self, model: ir.Model) -> None:
        left = self.find_defects(model.graph)
        if left:
            raise PostconditionError(f"{self.name} left {len(left)} occurrence(s): {left[:3]}")


# ------------------------------------------------------------------------------- 1. LayerNorm batch tiling


_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})


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
            if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
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
        out_shape = _shape(node.outputs[0])
        if out_shape is None or len(out_shape) < 2 or out_shape[0] <= 1:
            return []
        bad = []
        for i, inp in enumerate(node.inputs):
            shape = _shape(inp)
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
        names = _names(graph, "qnnx_tile")
        changed = False
        for node in self._feeding_nodes(graph):
            for i, shape, out_shape in self._bad_operands(node):
                value = cast(ir.Value, node.inputs[i])  # an operand with a static shape: never a missing input
                batch = out_shape[0]
                aligned = (1,) * (len(out_shape) - len(shape)) + shape
                array = _const(value)
                if array is not None:
                    tiled = np.ascontiguousarray(np.broadcast_to(array.reshape(aligned), (batch, *aligned[1:])))
                    new = _add_initializer(graph, names(value.name or "const"), tiled)
                else:
                    if len(shape) != len(out_shape):
                        reshaped = _new_value(names("reshaped"), value.dtype, aligned)
                        target = _add_initializer(graph, names("shape"), np.array(aligned, dtype=np.int64))
                        graph.insert_before(node, ir.Node("", "Reshape", [value, target], outputs=[reshaped]))
                        value = reshaped
                    repeats = _add_initializer(
                        graph, names("repeats"), np.array([batch] + [1] * (len(out_shape) - 1), dtype=np.int64)
                    )
                    new = _new_value(names("tiled"), value.dtype, (batch, *aligned[1:]))
                    graph.insert_before(node, ir.Node("", "Tile", [value, repeats], outputs=[new]))
                node.replace_input_with(i, new)
                changed = True
        return changed


# ------------------------------------------------------------------------------------ 2. RMSNorm weight


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
                nxt = [v for v in producer.inputs if v is not None and _const(v) is None]
                cur = nxt[0] if nxt else None
                depth += 1
        return False

    def _matches(self, graph: ir.Graph) -> list[ir.Node]:
        return [
            n
            for n in graph
            if n.op_type == "Mul"
            and len(n.inputs) == 2
            and _const(n.inputs[0]) is not None
            and _const(n.inputs[1]) is None
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


class FuseRMSNorm(QnnPass):
    """Fuse the decomposed RMSNorm, ``x * 1/sqrt(mean(x^2) + eps) [* w]``, into one ``RMSNormalization`` (opset 23).

    The decomposed form squares ``x`` in fp16 on HTP, which overflows once ``|x|`` passes 256 (65504 is the largest
    fp16): a row of magnitude 400 came back 0.64-0.85 of its scale off (onnxruntime-qnn 2.7.0, soc 60), and LLM
    hidden states carry outliers of that size. HTP's RMSNormalization keeps the statistic in higher precision: the
    same rows are within 7.5e-4 for magnitudes up to 2000. The model's default opset moves to 23, which only
    adds types to the ops of opset 20, unless the graph holds an op whose meaning changed since
    (GroupNormalization), in which case nothing is fused.
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
        if mean.op_type != "ReduceMean" or mean.domain not in ("", "ai.onnx"):
            return None
        if mean.attributes.get_int("keepdims", 1) != 1 or len(mean.inputs) < 2:
            return None
        axes_arr = _const(mean.inputs[1])
        sq = mean.inputs[0].producer() if mean.inputs[0] is not None else None
        if axes_arr is None or sq is None:
            return None
        if (
            sq.op_type == "Pow"
            and _const(sq.inputs[1]) is not None
            and float(cast(np.ndarray, _const(sq.inputs[1])).reshape(-1)[0]) == 2.0
        ) or (sq.op_type == "Mul" and sq.inputs[0] is sq.inputs[1]):
            x = sq.inputs[0]
        else:
            return None
        shape = _shape(x)
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
        eps_arr = _const(eps_value)
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
            w = _const(other)
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
        names = _names(graph, "qnnx_rmsnorm")
        changed = False
        for x, axes, eps, _norm, weight, last in self._matches(graph):
            shape = _shape(x)
            assert shape is not None
            lead, trail = shape[: len(shape) - len(axes)], shape[len(shape) - len(axes) :]
            width = math.prod(trail)
            # _match checked x's dtype and that the weight is a constant.
            scale = (
                np.ones(width, dtype=cast(ir.DataType, x.dtype).numpy())
                if weight is None
                else cast(np.ndarray, _const(weight)).reshape(width)
            )
            weight = _add_initializer(graph, names("scale"), scale)
            out = last.outputs[0]
            new_nodes: list[ir.Node] = []
            src = x
            if len(axes) > 1:
                # QNN HTP takes RMSNormalization over the last axis only (axis 0 of a rank-3 input is refused):
                # normalize the flattened trailing axes, then restore the shape.
                flat_shape = (*lead, width) if lead else (1, width)
                src = _new_value(names("flat"), x.dtype, flat_shape)
                target = _add_initializer(graph, names("flat_shape"), np.array(flat_shape, dtype=np.int64))
                new_nodes.append(ir.Node("", "Reshape", [x, target], outputs=[src]))
            normed = _new_value(names("out"), out.dtype, _shape(src) if len(axes) > 1 else _shape(out))
            new_nodes.append(
                ir.Node(
                    "",
                    "RMSNormalization",
                    [src, weight],
                    attributes=[ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", eps)],
                    outputs=[normed],
                )
            )
            if len(axes) > 1:
                back = _add_initializer(graph, names("shape"), np.array(shape, dtype=np.int64))
                restored = _new_value(names("restored"), out.dtype, shape)
                new_nodes.append(ir.Node("", "Reshape", [normed, back], outputs=[restored]))
                normed = restored
            graph.insert_after(last, new_nodes)
            _replace_value(graph, out, normed)
            changed = True
        return changed


# --------------------------------------------------------------------------------------- 3. Erf GELU


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
        arr = _const(value)
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
        names = _names(graph, "qnnx_gelu")
        changed = False
        for erf in [n for n in graph if n.op_type == "Erf"]:
            match = self._match(erf)
            if match is None:
                continue
            x, out = match
            new = _new_value(names("out"), out.dtype, _shape(out))
            gelu = ir.Node("", "Gelu", [x], attributes=[ir.AttrString("approximate", "none")], outputs=[new])
            graph.insert_after(cast(ir.Node, out.producer()), gelu)  # out is a Mul/Div output
            _replace_value(graph, out, new)
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


class FoldHighRankTranspose(QnnPass):
    """Rewrite ``Reshape -> Transpose -> Reshape`` through a rank-6+ tensor with the same chain at rank <= 5.

    QNN HTP takes tensors of rank <= 5 only. Swin's window partition and reverse (``view(B, H/w, w, W/w, w, C)
    .permute(0, 1, 3, 2, 4, 5)``) go through rank 6, but the axes that the permutation keeps together can be
    merged first: the merged transpose moves the same elements to the same places, so the rewrite is exact.
    """

    name = "fold_high_rank_transpose"
    defect = "rank-6 tensors are refused by QNN HTP (Swin window partition)"

    def match(self, node: ir.Node) -> tuple[ir.Node, list[int], list[int]] | None:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            return None
        src = node.inputs[0]
        first = src.producer() if src is not None else None
        shape = _shape(src)
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
        names = _names(graph, "qnnx_rank")
        changed = False
        for node, (first, merged_shape, merged_perm) in self.matched(graph):
            x = cast(ir.Value, first.inputs[0])  # _match read its shape
            target = _add_initializer(graph, names("shape"), np.array(merged_shape, dtype=np.int64))
            flat = _new_value(names("merged"), x.dtype, merged_shape)
            moved_shape = [merged_shape[a] for a in merged_perm]
            moved = _new_value(names("moved"), x.dtype, moved_shape)
            new_nodes = [
                ir.Node("", "Reshape", [x, target], outputs=[flat]),
                ir.Node("", "Transpose", [flat], attributes=[ir.AttrInt64s("perm", merged_perm)], outputs=[moved]),
            ]
            graph.insert_after(node, new_nodes)
            for use in list(node.outputs[0].uses()):
                use.node.replace_input_with(0, moved)
            changed = True
        return changed


# ------------------------------------------------------------- safe softmax: the fully-masked test without -inf

# Rows whose maximum is at or below this are "fully masked". HTP has no infinities: a -inf mask value saturates
# near -65504 and survives the addition of any score of magnitude below 32768; real scores never come near it.
_MASKED_ROW_MAX = -32768.0


class SafeSoftmaxWithoutInf(QnnPass):
    """Test for fully-masked rows in a safe softmax with ``ReduceMax(x) <= -32768`` instead of ``== -inf``.

    ``aten._safe_softmax`` (what ``scaled_dot_product_attention`` with a mask uses, so Hugging Face's default
    "sdpa" attention) returns 0 for a row whose inputs are all -inf. It is exported as
    ``Where(Equal(ReduceMax(x), -inf), 0, Softmax(x))``, and on QNN HTP, which has no infinities, the test is never
    true: a fully masked row comes back as a uniform average instead of 0 (onnxruntime-qnn 2.7.0). The threshold
    gives the same answer for every row whose finite values stay above -32768, on HTP and on the CPU.
    """

    name = "safe_softmax_without_inf"
    defect = "Equal(x, -inf) is never true on QNN HTP (no infinities): fully masked attention rows come back wrong"

    def match(self, node: ir.Node) -> ir.Value | None:
        """The -inf operand of an Equal(ReduceMax(x), -inf) that selects between 0 and Softmax(x), or None."""
        if node.op_type != "Equal" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            return None
        for stat, limit in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            value = _const(limit)
            producer = stat.producer() if stat is not None else None
            if value is None or value.size != 1 or not np.isneginf(value.reshape(-1)[0]):
                continue
            if producer is None or producer.op_type != "ReduceMax":
                continue
            uses = list(node.outputs[0].uses())
            if uses and all(u.node.op_type == "Where" and u.idx == 0 for u in uses):
                return limit
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _names(graph, "qnnx_safe_softmax")
        changed = False
        for node, limit in self.matched(graph):
            stat = node.inputs[1] if node.inputs[0] is limit else node.inputs[0]
            dtype = cast(ir.DataType, cast(ir.Value, stat).dtype)  # _match checked the statistic's float dtype
            threshold = _add_initializer(graph, names("threshold"), np.array(_MASKED_ROW_MAX, dtype=dtype.numpy()))
            out = node.outputs[0]
            new = _new_value(names("masked"), out.dtype, _shape(out))
            graph.insert_after(node, ir.Node("", "LessOrEqual", [stat, threshold], outputs=[new]))
            _replace_value(graph, out, new)
            changed = True
        return changed


# --------------------------------------------------------------------------- Log(Exp(z) + 1) -> Softplus(z)


class FuseSoftplus(QnnPass):
    """Rewrite ``Log(Add(Exp(z), 1))`` (torch.onnx's ``log1p(exp(z))``, as in ``soft_margin_loss``) as ``Softplus(z)``.

    The same function, but the decomposed form overflows fp16 on HTP as soon as ``z`` passes 11 (``exp(z)`` >
    65504): ``soft_margin_loss`` on inputs in [-9, 9] came back 0.80 of its value off (onnxruntime-qnn 2.7.0).
    HTP's Softplus is right for large ``z`` (it approaches ``z``).
    """

    name = "fuse_softplus"
    defect = "log1p(exp(z)) overflows fp16 on QNN HTP for z > 11 (silent wrong output)"

    def match(self, log_node: ir.Node) -> ir.Value | None:
        """The ``z`` of a Log(Add(Exp(z), 1)) ending at ``log_node``, or None."""
        if log_node.op_type != "Log" or log_node.domain not in ("", "ai.onnx"):
            return None
        add = log_node.inputs[0].producer() if log_node.inputs[0] is not None else None
        if add is None or add.op_type != "Add" or len(add.inputs) != 2:
            return None
        for exp_in, one in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            exp = exp_in.producer() if exp_in is not None else None
            value = _const(one)
            if (
                exp is not None
                and exp.op_type == "Exp"
                and value is not None
                and value.size == 1
                and float(value.reshape(-1)[0]) == 1.0
                and _shape(exp.inputs[0]) == _shape(log_node.outputs[0])
            ):
                return exp.inputs[0]
        return None

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _names(graph, "qnnx_softplus")
        changed = False
        for log_node, z in self.matched(graph):
            out = log_node.outputs[0]
            assert z is not None
            new = _new_value(names("out"), out.dtype, _shape(out))
            graph.insert_after(log_node, ir.Node("", "Softplus", [z], outputs=[new]))
            _replace_value(graph, out, new)
            changed = True
        return changed


# ----------------------------------------------------------------- AveragePool count_include_pad without pads


class AvgPoolDropUnusedCountIncludePad(QnnPass):
    """Clear ``count_include_pad`` on an AveragePool that has no padding and no ceil_mode (it changes nothing there).

    PyTorch's ``avg_pool*d`` defaults to ``count_include_pad=True``, and both exporters write the flag even without
    padding. QNN HTP then averages wrongly at rank 5 when a window is left over at the end of an axis
    (``avg_pool3d(x[2, 3, 3, 4, 4], 2)``: 0.45 of the output's scale off; onnxruntime-qnn 2.7.0), while the same
    pool without the flag is right. With zero pads no window ever holds a padded element, so the rewrite is exact.
    """

    name = "avgpool_count_include_pad"
    defect = "AveragePool with count_include_pad=1 is wrong on QNN HTP at rank 5 even without padding"

    @staticmethod
    def _matches(graph: ir.Graph) -> list[ir.Node]:
        found = []
        for n in graph:
            if n.op_type != "AveragePool" or n.domain not in ("", "ai.onnx"):
                continue
            # mypy binds onnx_ir's TypeVar default from the `or`'s bool context; the int default is right.
            if not n.attributes.get_int("count_include_pad", 0) or n.attributes.get_int("ceil_mode", 0):  # type: ignore[arg-type]
                continue
            if n.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
                continue
            pads = n.attributes.get_ints("pads", None)
            if pads is None or not any(pads):
                found.append(n)
        return found

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "AveragePool" for n in self._matches(graph)]

    def rewrite(self, graph: ir.Graph) -> bool:
        nodes = self._matches(graph)
        for node in nodes:
            node.attributes["count_include_pad"] = ir.AttrInt64("count_include_pad", 0)
        return bool(nodes)


# ---------------------------------------------------------------------- zero-width Concat inputs dropped


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
        shape = _shape(value)
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
            names = _names(graph, "qnnx_concat")
            out = node.outputs[0]
            new = _new_value(names("out"), out.dtype, _shape(out))
            axis = node.attributes.get_int("axis", 0)
            replacement = (
                ir.Node("", "Identity", kept, outputs=[new])
                if len(kept) == 1
                else ir.Node("", "Concat", kept, attributes=[ir.AttrInt64("axis", axis)], outputs=[new])
            )
            graph.insert_after(node, replacement)
            _replace_value(graph, out, new)
        return bool(nodes)


# ------------------------------------------------------------------- Log(Sigmoid(x)) -> -Softplus(-x)


class LogSigmoidToSoftplus(QnnPass):
    """Rewrite ``Log(Sigmoid(x))`` (torch.onnx's ``logsigmoid``) as ``Neg(Softplus(Neg(x)))``, the same function.

    QNN HTP's Sigmoid has an absolute error of about 3e-4 (onnxruntime-qnn 2.7.0, soc 60), which the Log turns
    into a large error wherever the sigmoid is small: ``logsigmoid`` on [-9, 9] came back 0.15 of the output's
    scale off. Softplus on HTP is within 1.3e-3 of the scale on the same inputs.
    """

    name = "logsigmoid_to_softplus"
    defect = "Log(Sigmoid(x)) on QNN HTP loses the small sigmoid values (silent wrong output)"

    def match(self, log_node: ir.Node) -> ir.Node | None:
        if log_node.op_type != "Log" or log_node.domain not in ("", "ai.onnx"):
            return None
        sig = log_node.inputs[0].producer() if log_node.inputs[0] is not None else None
        if sig is None or sig.op_type != "Sigmoid" or sig.domain not in ("", "ai.onnx"):
            return None
        return sig

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _names(graph, "qnnx_logsigmoid")
        changed = False
        for log_node, sig in self.matched(graph):
            x, out = cast(ir.Value, sig.inputs[0]), log_node.outputs[0]  # Sigmoid has its one input
            neg_x = _new_value(names("neg"), x.dtype, _shape(x))
            soft = _new_value(names("softplus"), x.dtype, _shape(x))
            new = _new_value(names("out"), out.dtype, _shape(out))
            nodes = [
                ir.Node("", "Neg", [x], outputs=[neg_x]),
                ir.Node("", "Softplus", [neg_x], outputs=[soft]),
                ir.Node("", "Neg", [soft], outputs=[new]),
            ]
            graph.insert_after(log_node, nodes)
            _replace_value(graph, out, new)
            changed = True
        return changed


# ----------------------------------------------------------------------------- 4. GatherND -> Gather


class GatherNDToGather(QnnPass):
    """Rewrite ``GatherND`` with constant indices into ``Reshape`` + ``Gather`` (or a bare ``Reshape``).

    QNN HTP rejects GatherND ("Failed to create GatherND node", onnxruntime-qnn 2.7.0); the probe grid
    shows it failing for every dtype, and HF attention-mask code emits it on a bool mask
    (``padding_mask[batch_idx, kv_idx]``). With constant indices and ``batch_dims=0`` the gather is a
    plain Gather of flattened row indices (exact: the same elements are selected).
    """

    name = "gathernd_to_gather"
    defect = "GatherND (bool attention-mask path) is rejected by QNN HTP"

    @staticmethod
    def _plan(node: ir.Node) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]] | None:
        if node.op_type != "GatherND":
            return None
        batch_dims = node.attributes.get("batch_dims")
        if batch_dims is not None and batch_dims.as_int() != 0:
            return None
        data_shape = _shape(node.inputs[0])
        indices = _const(node.inputs[1])
        if data_shape is None or indices is None or indices.ndim < 1:
            return None
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

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "GatherND" for n in graph if self._plan(n) is not None]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _names(graph, "qnnx_gathernd")
        changed = False
        for node in list(graph):
            plan = self._plan(node)
            if plan is None:
                continue
            flat, flat_shape, out_shape = plan
            data, out = cast(ir.Value, node.inputs[0]), node.outputs[0]  # _plan read its shape
            rows = _add_initializer(graph, names("rows_shape"), np.array(flat_shape, dtype=np.int64))
            flat_data = _new_value(names("rows"), data.dtype, flat_shape)
            new_nodes = [ir.Node("", "Reshape", [data, rows], outputs=[flat_data])]
            if flat.size == flat_shape[0] and np.array_equal(flat.reshape(-1), np.arange(flat_shape[0])):
                # The gather selects every row in order: only a reshape.
                final_shape = _add_initializer(graph, names("out_shape"), np.array(out_shape, dtype=np.int64))
                result = _new_value(names("out"), out.dtype, out_shape)
                new_nodes.append(ir.Node("", "Reshape", [flat_data, final_shape], outputs=[result]))
            else:
                index = _add_initializer(graph, names("index"), flat.astype(np.int32))
                result = _new_value(names("out"), out.dtype, out_shape)
                new_nodes.append(
                    ir.Node("", "Gather", [flat_data, index], attributes=[ir.AttrInt64("axis", 0)], outputs=[result])
                )
            for n in new_nodes:
                graph.insert_before(node, n)
            _replace_value(graph, out, result)
            changed = True
        return changed


def _replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Redirect every use of ``old`` (graph outputs too, keeping the output's name) to ``new``."""
    was_output = old.is_graph_output()
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    if was_output:
        name = old.name
        old.name = f"{name}__qnnx_replaced"
        new.name = name


# ------------------------------------------------------------------------- 5. Unsqueeze on int64 data


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
        names = _names(graph, "qnnx_unsqueeze")
        changed = False
        unknown: list[str] = []
        for node in self._targets(graph):
            out_shape = _shape(node.outputs[0])
            if out_shape is None:
                unknown.append(node.name or "Unsqueeze")
                continue
            target = _add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            result = _new_value(names("out"), node.outputs[0].dtype, out_shape)
            graph.insert_before(node, ir.Node("", "Reshape", [node.inputs[0], target], outputs=[result]))
            _replace_value(graph, node.outputs[0], result)
            changed = True
        if unknown:
            log.warning("unsqueeze_int64_to_reshape: output shape unknown for %s; left unchanged", unknown)
        return changed


# ---------------------------------------------------------------------------- 6. int64 inputs -> int32


_INDEX_INPUTS = {("Gather", 1), ("GatherElements", 1)}


class Int64InputsToInt32(QnnPass):
    """Feed int64 graph inputs as int32 where that is exact.

    QNN has no int64: the EP casts int64 inputs and initializers to int32 and SATURATES values that do
    not fit (Add of two 2.0e9 int64 values returned 2147483647, onnxruntime-qnn 2.7.0), silently.
    After this pass the ONNX input is int32 and :meth:`GraphSignature.onnx_inputs` casts the int64
    argument with a range check that raises instead of saturating. An input used only as Gather
    indices (token ids) is consumed as int32 directly; otherwise a Cast back to int64 keeps the graph
    typed as before. int64 initializers are left alone; values outside int32 are reported (logged)
    because QNN would saturate them.
    """

    name = "int64_to_int32"
    defect = "int64 values are silently saturated to int32 by the QNN EP"

    def find_defects(self, graph: ir.Graph) -> list[str]:
        # Graph inputs are always named.
        return [cast(str, v.name) for v in graph.inputs if v.dtype == ir.DataType.INT64 and not v.is_graph_output()]

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _names(graph, "qnnx_i32")
        changed = False
        for value in list(graph.inputs):
            if value.dtype != ir.DataType.INT64 or value.is_graph_output():
                continue  # an input returned as is keeps its dtype (Dynamo never emits that)
            uses = list(value.uses())
            index_only = bool(uses) and all((u.node.op_type, u.idx) in _INDEX_INPUTS for u in uses)
            value.type = ir.TensorType(ir.DataType.INT32)
            if not index_only:
                cast_out = _new_value(names(cast(str, value.name)), ir.DataType.INT64, _shape(value))
                cast_node = ir.Node(
                    "", "Cast", [value], attributes=[ir.AttrInt64("to", ir.DataType.INT64)], outputs=[cast_out]
                )
                for use in uses:
                    use.node.replace_input_with(use.idx, cast_out)
                graph.append(cast_node)  # QnnPass.call re-sorts the graph topologically
            changed = True
        for name, init in graph.initializers.items():
            arr = _const(init)
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


# ------------------------------------------------------------------------------------------ registry


PASS_REGISTRY: dict[str, type[QnnPass]] = {
    cls.name: cls
    for cls in (
        GatherNDToGather,
        UnsqueezeInt64ToReshape,
        FuseErfGelu,
        FoldHighRankTranspose,
        DropEmptyConcatInputs,
        AvgPoolDropUnusedCountIncludePad,
        SafeSoftmaxWithoutInf,
        FuseSoftplus,
        LogSigmoidToSoftplus,
        FuseRMSNorm,
        RMSNormWeightLast,
        TileLayerNormBroadcast,
        Int64InputsToInt32,
    )
}
if tuple(PASS_REGISTRY) != DEFAULT_PASSES:  # pragma: no cover - guards edits of either list
    raise ImportError(f"_pass_names.DEFAULT_PASSES {DEFAULT_PASSES} != registered passes {tuple(PASS_REGISTRY)}")


def run_passes(model: ir.Model, names: Iterable[str]) -> list[tuple[str, bool]]:
    """Run the named passes in order on ``model`` (in place); return ``(name, changed)`` per pass."""
    report: list[tuple[str, bool]] = []
    for name in names:
        cls = PASS_REGISTRY[name]
        result = cls()(model)
        report.append((name, bool(result.modified)))
        if result.modified:
            log.debug("pass %s changed the graph", name)
    return report


def pass_table() -> list[dict[str, Any]]:
    """Return ``[{name, defect, doc}]`` for every registered pass (used by the docs)."""
    return [
        {"name": n, "defect": c.defect, "doc": (c.__doc__ or "").strip().splitlines()[0]}
        for n, c in PASS_REGISTRY.items()
    ]
