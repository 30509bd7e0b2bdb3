"""Splitting one ONNX graph between QNN and ONNX Runtime's CPU EP inside one session (private).

What runs on the CPU EP is decided by qnnx-opcheck, not by the QNN EP's own capability check, which accepts some
nodes it then computes wrongly (a ``Floor`` of values it rounded to fp16, a ``TopK``, negative runtime indices):

* every node opcheck does not vouch for: status ``unsupported`` (rejected, failing, crashing or known-wrong
  patterns such as fp16 rounding ahead of a discontinuous op, or runtime indices) and ``hazard`` nodes opcheck
  cannot judge (``unknown_dtype``, ``unverified``). Hazards with a documented caveat (int64 carried as int32) are
  vouched for, as whole-graph placement does;
* the float computation feeding a value-discontinuous node (floor, ceil, round, mod, a cast to an integer or
  bool), back to the graph inputs, constants or integer values: computed on QNN, that input would carry fp16
  rounding, and the CPU's exact floor of it would still differ from PyTorch by a whole step. TopK is not followed
  upstream: like ArgMax it then only reorders values within fp16 noise of each other. opcheck vouches for a TopK
  whose input a QNN node computes (rounded to fp16 wherever TopK runs); such a TopK is pinned after all when the
  plan moves its producer to the CPU EP, whose exact value QNN would round.

onnxruntime-qnn 2.7.0 pins *op types*, not nodes: its ``op_affinity`` file takes only a top-level ``"op_type"``
object, and ONNX Runtime 1.32's per-node assignment (``session.layer_assignment_settings`` /
``session.name_based_layer_assignment``) hides the nodes from the QNN EP, whose partitioner then fails every
session ("CreateSupportedPartitionNodeGroups ... Processed 1 nodes. Expected to process 6", measured on the host
simulator). So every node of a pinned op type runs on the CPU EP, also the ones opcheck vouches for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from qnnx_backend import _scratch
from qnnx_backend._options import OPCHECK_BACKEND
from qnnx_backend._report import FINALIZE_ISLAND

# Table outcomes that run on QNN: opcheck vouches for them (hazards with a documented caveat included, as in
# whole-graph placement). Anything else is pinned to the CPU EP.
_VOUCHED_HAZARDS = frozenset({"caveat"})
# Kinds whose node never reaches an EP: ONNX Runtime folds or removes it before placement.
_NOT_PLACED = frozenset({"constant_folded", "removed"})
# Value-discontinuous ops: a move of the input by fp16 noise changes the output by a whole step.
_STEP_OPS = frozenset({"Floor", "Ceil", "Round", "Mod"})
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# onnx.TensorProto element types of floats (FLOAT, FLOAT16, DOUBLE, BFLOAT16).
_FLOAT_TYPES = frozenset({1, 10, 11, 16})


@attrs.frozen(kw_only=True)
class CpuPlan:
    """The nodes of one graph that run on ONNX Runtime's CPU EP, and the op types pinned there to do it."""

    nodes: Mapping[str, str] = attrs.field(factory=dict)
    """ONNX node name -> why it runs on the CPU EP (opcheck's reason, or the step op whose input it computes)."""
    op_types: tuple[str, ...] = ()
    """Op types pinned to the CPU EP (every node of these types runs there, vouched for or not)."""
    on_qnn: int = 0
    """Nodes predicted on QNN: not of a pinned type, not folded away by ONNX Runtime."""
    on_cpu: int = 0
    """Nodes predicted on the CPU EP: every node of a pinned type."""

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def keeps_majority(self) -> bool:
        """True when QNN would keep more than half of the placed nodes (the rule of ``partition="auto"``)."""
        return self.on_qnn > self.on_cpu

    def describe(self, limit: int = 6) -> str:
        """E.g. ``12 of 13 ONNX nodes on QNN, 1 on the ORT CPU EP (pinned op types: Floor): Floor (n3): ...``."""
        reasons = "; ".join(f"{name}: {_clip(why)}" for name, why in list(self.nodes.items())[:limit])
        more = f"; and {len(self.nodes) - limit} more" if len(self.nodes) > limit else ""
        total = self.on_qnn + self.on_cpu
        return (
            f"{self.on_qnn} of {total} ONNX nodes on QNN, {self.on_cpu} on the ORT CPU EP (pinned op types: "
            f"{', '.join(self.op_types)}): {reasons}{more}"
        )


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _node_name(node: Any, index: int) -> str:
    return node.name or f"n{index}"  # opcheck's name for an unnamed node


def _value_types(structure: Any) -> dict[str, int]:
    """Element type of every value ONNX shape inference knows (graph inputs, initializers, intermediates)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(structure, strict_mode=False)
    except Exception:  # an odd model: fall back to what the model itself declares
        inferred = structure
    graph = inferred.graph
    types: dict[str, int] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    return types


def _is_step(node: Any, types: Mapping[str, int]) -> bool:
    """A float op whose output moves by a whole step when its input moves by fp16 noise."""
    float_in = any(types.get(name, 1) in _FLOAT_TYPES for name in node.input[:1] if name)
    if node.op_type in _STEP_OPS:
        return float_in
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return float_in and to is not None and to not in _FLOAT_TYPES
    return False


def plan_cpu_nodes(structure: Any, report: Any) -> CpuPlan:
    """The CPU-EP part of ``structure`` (an ONNX ModelProto) given opcheck's ``report`` for it (see module doc).

    An empty plan (falsy) means opcheck vouches for every node: the graph runs wholly on QNN.
    """
    graph = structure.graph
    verdicts = {v.node_name: v for v in report.verdicts}
    names = [_node_name(n, i) for i, n in enumerate(graph.node)]
    pinned: dict[str, str] = {}
    for name in names:
        v = verdicts.get(name)
        if v is None or v.status == "supported" or (v.status == "hazard" and v.kind in _VOUCHED_HAZARDS):
            continue
        pinned[name] = v.reason or v.kind
    if not pinned:
        return CpuPlan()

    steps = [i for i, name in enumerate(names) if name in pinned and graph.node[i].op_type in (*_STEP_OPS, "Cast")]
    if steps:
        types = _value_types(structure)
        producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
        constant = {init.name for init in graph.initializer}
        for i in steps:
            step = graph.node[i]
            if not _is_step(step, types):
                continue
            why = (
                f"computes the float input of {names[i]} ({step.op_type}), whose result fp16 rounding on QNN would "
                "move by a whole step"
            )
            todo = [name for name in step.input if name]
            seen: set[str] = set()
            while todo:
                value = todo.pop()
                if value in seen or value in constant or types.get(value, 1) not in _FLOAT_TYPES:
                    continue  # constants, and integer or bool values (exact), end the walk
                seen.add(value)
                j = producer.get(value)
                if j is None:
                    continue  # a graph input: exact as the caller gave it
                kind = verdicts[names[j]].kind if names[j] in verdicts else None
                if kind == "constant_folded":
                    continue  # ONNX Runtime computes it at load, on the CPU
                node = graph.node[j]
                if kind != "removed":
                    pinned.setdefault(names[j], why)
                todo.extend(name for name in node.input if name)

    _pin_non_finite_consumers(graph, names, pinned)
    while True:
        members = _unit_members(graph, names, pinned)
        op_types = tuple(
            sorted({n.op_type for name, n in zip(names, graph.node) if name in pinned and name not in members})
        )
        if not _pin_topk_of_cpu_values(structure, names, pinned, op_types):
            break
    on_qnn = on_cpu = 0
    for name, node in zip(names, graph.node):
        v = verdicts.get(name)
        if v is not None and v.kind in _NOT_PLACED:
            continue
        if node.op_type in op_types or name in pinned:
            on_cpu += 1
        else:
            on_qnn += 1
    return CpuPlan(nodes=pinned, op_types=op_types, on_qnn=on_qnn, on_cpu=on_cpu)


def _pin_topk_of_cpu_values(structure: Any, names: list[str], pinned: dict[str, str], op_types: Iterable[str]) -> bool:
    """Pin each float TopK whose input is now computed on the CPU EP (its producer pinned, or of a pinned op type).
    opcheck vouches for a TopK of a value QNN computes, since that value is rounded to fp16 wherever TopK runs; a
    value from the CPU EP is exact, and TopK on QNN would round it and could pick other elements. Returns whether
    it pinned any (pinning TopK's type may move other nodes, so the caller repeats until nothing changes)."""
    graph = structure.graph
    cpu_types = set(op_types)
    if "TopK" in cpu_types:
        return False
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    types = _value_types(structure)
    changed = False
    for i, node in enumerate(graph.node):
        if node.op_type != "TopK" or names[i] in pinned or not node.input:
            continue
        j = producer.get(node.input[0])
        if j is None or types.get(node.input[0], 1) not in _FLOAT_TYPES:
            continue
        if names[j] in pinned or graph.node[j].op_type in cpu_types:
            pinned[names[i]] = (
                f"its input comes from {names[j]} ({graph.node[j].op_type}) on the CPU EP, exact in float32: TopK on "
                "QNN would round it to fp16 and could pick other elements"
            )
            changed = True
    return changed


def _divides_by_constant_zero(node: Any, constants: Mapping[str, Any]) -> bool:
    """A float Div whose divisor is a constant holding a zero: its output holds infinities or NaN."""
    if node.op_type != "Div" or len(node.input) < 2 or node.input[1] not in constants:
        return False
    from onnx import numpy_helper

    divisor = numpy_helper.to_array(constants[node.input[1]])
    return divisor.dtype.kind == "f" and bool((divisor == 0).any())


def _pin_non_finite_consumers(graph: Any, names: list[str], pinned: dict[str, str]) -> None:
    """Pin every node downstream of a pinned division by a constant zero: QNN HTP has no infinities or NaN, so the
    CPU EP's inf/NaN would come out of a QNN node as a finite number (the NaN of a variance over one element came
    back as -131008 from the Sqrt of a standard deviation)."""
    constants = {init.name: init for init in graph.initializer}
    sources = [i for i, n in enumerate(graph.node) if names[i] in pinned and _divides_by_constant_zero(n, constants)]
    if not sources:
        return
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for value in n.input:
            consumers.setdefault(value, []).append(i)
    for source in sources:
        why = f"computes on the infinities or NaN of {names[source]} (a division by zero), which QNN HTP cannot hold"
        todo, seen = list(graph.node[source].output), {source}
        while todo:
            for j in consumers.get(todo.pop(), []):
                if j not in seen:
                    seen.add(j)
                    pinned.setdefault(names[j], why)
                    todo.extend(graph.node[j].output)


def _unit_members(graph: Any, names: list[str], pinned: Mapping[str, str]) -> set[str]:
    """Pinned Q/DQ nodes that belong to the QDQ node unit of a pinned op (a DequantizeLinear feeding it, the
    QuantizeLinear of its output). The QNN EP's op_affinity judges a unit by its op, so pinning the op's type moves
    the whole unit; pinning the Q/DQ types too would move every unit of the graph (the placement check still
    requires these nodes on the CPU)."""
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for value in n.input:
            consumers.setdefault(value, []).append(i)

    def pinned_op(i: int) -> bool:
        return names[i] in pinned and graph.node[i].op_type not in _QDQ_OPS

    members: set[str] = set()
    for i, node in enumerate(graph.node):
        if names[i] not in pinned or node.op_type not in _QDQ_OPS or not node.output:
            continue
        users = consumers.get(node.output[0], [])
        source = producer.get(node.input[0]) if node.input else None
        feeds_the_op = node.op_type == "DequantizeLinear" and bool(users) and all(map(pinned_op, users))
        quantizes_its_output = node.op_type == "QuantizeLinear" and source is not None and pinned_op(source)
        if feeds_the_op or quantizes_its_output:
            members.add(names[i])
    return members


def context_cpu_types(structure: Any) -> tuple[str, ...] | None:
    """For a compiled context model (EPContext nodes beside plain ONNX nodes): the op types of its plain nodes,
    which were on the CPU EP when it was compiled and must stay there. None for a model without EPContext nodes."""
    ops = [n.op_type for n in structure.graph.node]
    if "EPContext" not in ops:
        return None
    return tuple(sorted(set(ops) - {"EPContext"}))


def write_affinity(op_types: Iterable[str]) -> str:
    """An ``op_affinity`` file (onnxruntime-qnn >= 2.6) pinning ``op_types`` to the CPU EP; the caller deletes it."""
    fd, path = _scratch.make_file("affinity", ".json")
    with os.fdopen(fd, "w") as fh:
        json.dump({"op_type": dict.fromkeys(op_types, "cpu")}, fh)
    return path


# Ops ONNX Runtime may drop before placement without computing anything elsewhere.
NO_OPS = frozenset({"Identity", "Dropout"})


def misplaced(
    placement: Mapping[str, tuple[str, ...]], cpu_nodes: Iterable[str], qnn_ep: str, no_ops: Iterable[str] = ()
) -> str | None:
    """None when every node meant for the CPU EP is there; else one sentence naming the nodes that are not.

    A node missing from ONNX Runtime's record was fused into another node before placement (ORT's level-1
    optimizations), so where its computation ran cannot be told: that counts as misplaced too, except for the
    ``no_ops`` (names of Identity/Dropout nodes, which ORT removes without moving any computation).
    """
    on_qnn = set(placement.get(qnn_ep, ()))
    placed = {name for names in placement.values() for name in names}
    wrong = [n for n in cpu_nodes if n in on_qnn]
    if wrong:
        return f"QNN took node(s) meant for the CPU EP: {', '.join(wrong[:8])}"
    skip = set(no_ops)
    gone = [n for n in cpu_nodes if n not in placed and n not in skip]
    if gone:
        return (
            f"ONNX Runtime fused node(s) {', '.join(gone[:8])} into others before placement, so they cannot be "
            "kept off QNN"
        )
    return None


def opcheck(structure: Any, device: str, soc: int) -> Any:
    """qnnx-opcheck's report of ``structure`` for ``device``'s QNN backend. Every QNN call's float outputs are checked
    for values beyond float16's range (:func:`qnnx_backend._program.check_half_range`), so an infinity that reaches
    an output needs no refusal: HTP writes it there as such a value."""
    import qnnx_opcheck

    return qnnx_opcheck.check_model(structure, OPCHECK_BACKEND[device], soc_model=soc, outputs_range_checked=True)


def with_island(plan: CpuPlan, structure: Any, narrowed: Any, op_types: Iterable[str]) -> CpuPlan:
    """``plan`` with a finalize failure's island added: ``narrowed`` (qnnx-opcheck's ``NarrowReport``) names the
    smallest failing run of nodes, and ``op_types`` (its types that compute) are pinned to the CPU EP. Since
    onnxruntime-qnn pins op types, every node of those types moves, and each of the run's nodes pinned says so."""
    graph = structure.graph
    names = [_node_name(n, i) for i, n in enumerate(graph.node)]
    new = sorted(set(op_types) - set(plan.op_types))
    counts = {t: sum(n.op_type == t for n in graph.node) for t in new}
    moved = sum(1 for name, n in zip(names, graph.node) if n.op_type in counts and name not in plan.nodes)
    run = ", ".join(narrowed.nodes[:6]) + (f" and {len(narrowed.nodes) - 6} more" if len(narrowed.nodes) > 6 else "")
    whole_types = "; ".join(f"every {t} node ({counts[t]}) runs on the CPU EP" for t in new)
    why = (
        f"{FINALIZE_ISLAND}{narrowed.error}; narrowed to {len(narrowed.nodes)} node(s) ({run}) by "
        f"{narrowed.trials} trials; onnxruntime-qnn pins op types, not nodes: {whole_types}"
    )
    island = {name: why for name, n in zip(names, graph.node) if name in narrowed.nodes and n.op_type in counts}
    return CpuPlan(
        nodes={**plan.nodes, **island},
        op_types=tuple(sorted({*plan.op_types, *new})),
        on_qnn=(plan.on_qnn if plan else len(names)) - moved,
        on_cpu=plan.on_cpu + moved,
    )
