"""Control flow as the QNN EP meets it: ``If`` nodes whose condition is a constant are replaced by their taken branch
(ONNX Runtime folds them before partitioning), and the branches of the other ``If`` nodes are checked as graphs of
their own.

Measured with onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0 on the HTP simulator (soc_model 60):

* ``If(Equal(Gather(Shape(x), 0), 2))`` on a static ``x``: ONNX Runtime inlines the taken branch; its nodes are
  assigned to the QNN EP, and the session builds with CPU fallback disabled.
* ``If`` on a runtime condition: the QNN EP takes the ``If`` node (a control-flow kernel of the plugin EP) when every
  node of both branches is supported; one unsupported branch node (``Erf``) sends the ``If`` and both branches to the
  CPU EP, and a session with ``session.disable_cpu_ep_fallback=1`` fails. So does a branch node that reads an
  initializer of the enclosing graph (``MatMul(x, W)`` with ``W`` outside the branch; the same ``W`` inside the
  branch runs on QNN), which is how some exporters share weights between branches.
* ``Loop`` and ``Scan``: ONNX Runtime runs them and their bodies on the CPU EP; with CPU fallback disabled the session
  fails.
"""

from __future__ import annotations

import logging
from typing import Any

import onnx
from onnx import helper, numpy_helper

from qnnx_opcheck._fold import infer_with_folding
from qnnx_opcheck._model import weightless_view

__all__ = ["CONTROL_FLOW_MEASURED", "branch_model", "fold_constant_ifs", "outer_reads"]

_log = logging.getLogger(__name__)

#: The onnxruntime-qnn releases whose control-flow behaviour was measured (the rules apply to their tables only).
CONTROL_FLOW_MEASURED = frozenset({"2.7.0"})
# The condition of an If is computed from shapes and small constants; a cone larger than this is not evaluated.
_MAX_CONE_NODES = 64
_MAX_ROUNDS = 8


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    try:
        inferred = infer_with_folding(weightless_view(model))
    except Exception as exc:  # partial knowledge: no If is folded
        _log.info("shape inference failed while looking for constant If conditions: %s", exc)
        return {}
    out = {}
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if all(d is not None for d in dims):
                out[vi.name] = [int(d) for d in dims if d is not None]
    for t in g.initializer:
        out[t.name] = [int(d) for d in t.dims]
    return out


def _condition(model: onnx.ModelProto, name: str, shapes: dict[str, list[int]]) -> bool | None:
    """The value of boolean ``name`` when it follows from constants and static shapes alone, else None."""
    import numpy as np

    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output if o}
    inits = {t.name: t for t in graph.initializer}
    runtime = {vi.name for vi in graph.input}
    folded_shapes: list[onnx.NodeProto] = []  # Shape/Size of a static value, as Constant nodes
    kept: set[int] = set()  # ids of the cone's own nodes
    needed: dict[str, onnx.TensorProto] = {}
    seen: set[str] = set()
    stack = [name]
    while stack:
        value = stack.pop()
        if not value or value in seen:
            continue
        seen.add(value)
        if value in inits and value not in runtime:
            t = inits[value]
            if t.data_location == onnx.TensorProto.EXTERNAL:
                return None
            needed[value] = t
            continue
        node = producers.get(value)
        if node is None or node.domain not in ("", "ai.onnx") or node.op_type in ("If", "Loop", "Scan"):
            return None
        if node.op_type in ("Shape", "Size") and node.input and node.input[0] in shapes:
            dims = shapes[node.input[0]]
            if node.op_type == "Shape":
                attrs = {a.name: a.i for a in node.attribute}
                array = np.array(dims[attrs.get("start", 0) : attrs.get("end", len(dims))], dtype=np.int64)
            else:
                array = np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
            folded_shapes.append(helper.make_node("Constant", [], [value], value=numpy_helper.from_array(array)))
            continue
        kept.add(id(node))
        if len(kept) > _MAX_CONE_NODES:
            return None
        stack.extend(node.input)
    ordered = folded_shapes + [n for n in graph.node if id(n) in kept]  # graph order is a topological order
    sub = helper.make_graph(
        ordered, "condition", [], [helper.make_empty_tensor_value_info(name)], list(needed.values())
    )
    try:
        from onnx.reference import ReferenceEvaluator

        cond_model = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        (value,) = ReferenceEvaluator(cond_model).run(None, {})
        return bool(np.asarray(value).reshape(-1)[0]) if np.asarray(value).size == 1 else None
    except Exception as exc:  # not evaluable here: treated as a runtime condition
        _log.debug("If condition %r not evaluated: %s", name, exc)
        return None


def _inline(graph: onnx.GraphProto, index: int, branch: onnx.GraphProto) -> None:
    """Replace node ``index`` (an If) by the nodes of ``branch``, its outputs named as the If's outputs."""
    node = graph.node[index]
    rename = {}
    produced = {o for n in branch.node for o in n.output}
    extra = []
    for inner, outer in zip(branch.output, node.output, strict=False):
        if inner.name in produced:
            rename[inner.name] = outer
        else:  # the branch returns an outer value (or one of its initializers) as it is
            extra.append(helper.make_node("Identity", [inner.name], [outer], name=f"{node.name or 'If'}/{outer}"))
    new_nodes = []
    for n in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        for i, name in enumerate(copy.input):
            copy.input[i] = rename.get(name, name)
        for i, name in enumerate(copy.output):
            copy.output[i] = rename.get(name, name)
        new_nodes.append(copy)
    nodes = list(graph.node)
    nodes[index : index + 1] = new_nodes + extra
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(branch.initializer)


def fold_constant_ifs(model: onnx.ModelProto) -> list[str]:
    """Replace, in place, every top-level ``If`` whose condition follows from constants and static shapes by its
    taken branch, as ONNX Runtime does before partitioning.

    Returns:
        One note per folded node.
    """
    notes: list[str] = []
    for _ in range(_MAX_ROUNDS):
        ifs = [i for i, n in enumerate(model.graph.node) if n.op_type == "If" and n.domain in ("", "ai.onnx")]
        if not ifs:
            break
        shapes = _static_shapes(model)
        folded = False
        for i in ifs:
            node = model.graph.node[i]
            cond = _condition(model, node.input[0], shapes) if node.input else None
            if cond is None:
                continue
            which = "then_branch" if cond else "else_branch"
            branch = next((a.g for a in node.attribute if a.name == which), None)
            if branch is None:
                continue
            notes.append(
                f"If node '{node.name or f'n{i}'}': its condition is {cond} once the shapes are fixed, so ONNX Runtime "
                f"folds it; checked as its {which} ({len(branch.node)} node(s))"
            )
            _inline(model.graph, i, branch)
            folded = True
            break  # indices moved: look again
        if not folded:
            break
    return notes


def outer_reads(branch: onnx.GraphProto) -> set[str]:
    """The values the nodes of ``branch`` (and of its nested subgraphs) read from enclosing graphs."""
    reads: set[str] = set()
    defined: set[str] = set()
    stack = [branch]
    while stack:
        g = stack.pop()
        defined |= {t.name for t in g.initializer} | {vi.name for vi in g.input}
        for n in g.node:
            reads.update(i for i in n.input if i)
            defined.update(o for o in n.output if o)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    reads.update(o.name for o in branch.output)
    return reads - defined


def branch_model(
    parent: onnx.ModelProto, branch: onnx.GraphProto, outer: dict[str, Any], outer_inits: dict[str, onnx.TensorProto]
) -> onnx.ModelProto:
    """A standalone model of ``branch``: the outer values it reads become graph inputs typed from ``outer`` (name ->
    ValueInfoProto), or initializers when they are small outer initializers."""
    inputs: list[onnx.ValueInfoProto] = list(branch.input)
    inits: list[onnx.TensorProto] = list(branch.initializer)
    for name in sorted(outer_reads(branch)):
        if name in outer_inits:
            inits.append(outer_inits[name])
        elif name in outer:
            inputs.append(outer[name])
        else:
            inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None))
    g = helper.make_graph(list(branch.node), branch.name or "branch", inputs, list(branch.output), inits)
    g.value_info.extend(branch.value_info)
    return helper.make_model(g, opset_imports=list(parent.opset_import), ir_version=parent.ir_version)
