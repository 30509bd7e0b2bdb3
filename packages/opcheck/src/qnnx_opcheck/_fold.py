"""Shape inference that sees through constant computations, as ONNX Runtime's constant folding does before the QNN
EP partitions the graph.

``onnx.shape_inference.infer_shapes(..., data_prop=True)`` propagates shape data through Shape, Gather, Concat,
Slice and a few more, but not through Cast, arithmetic on computed values, or ConstantOfShape: exporters write Pad
widths, Reshape targets and Resize sizes that way (``Cast(Concat(...))``), and their outputs stay symbolic. Here small
constant values are computed with onnx's reference evaluator, one node at a time, written into a copy of the model as
initializers, and shapes are inferred again, until nothing new folds.
"""

from __future__ import annotations

import logging
from typing import Any

import onnx
from onnx import helper, numpy_helper

__all__ = ["infer_with_folding"]

_log = logging.getLogger(__name__)

# Shape computations are small: larger values are not computed (and not needed for shapes).
_MAX_ELEMENTS = 4096
_MAX_ROUNDS = 6
_NOT_FOLDED = frozenset(
    {"If", "Loop", "Scan", "QuantizeLinear", "DequantizeLinear", "RandomNormal", "RandomNormalLike", "RandomUniform",
     "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)  # fmt: skip


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)


def _static(inferred: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]
            if all(d is not None for d in dims):
                out[vi.name] = [int(d) for d in dims if d is not None]
    return out


def _evaluate(node: onnx.NodeProto, values: dict[str, Any], opsets: list[onnx.OperatorSetIdProto]) -> list[Any]:
    from onnx.reference import ReferenceEvaluator

    inputs = [numpy_helper.from_array(values[i], i) for i in node.input if i]
    g = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(o) for o in node.output], inputs)
    return list(ReferenceEvaluator(helper.make_model(g, opset_imports=opsets)).run(None, {}))


def infer_with_folding(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` after shape inference, with the shapes that constant folding makes static.

    Args:
        model: A (weightless) model; never modified.

    Returns:
        An inferred copy: the same nodes and value infos as plain shape inference gives, with more static shapes.
        Raises what ``onnx.shape_inference.infer_shapes`` raises.
    """
    import numpy as np

    model = _without_symbolic_infos(model)
    inferred = _infer(model)
    work: onnx.ModelProto | None = None
    values: dict[str, Any] = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and np.prod(t.dims, dtype=np.int64) <= _MAX_ELEMENTS:
            try:
                values[t.name] = numpy_helper.to_array(t)
            except Exception:  # an unusual encoding: not folded
                continue
    runtime = {vi.name for vi in model.graph.input}
    values = {k: v for k, v in values.items() if k not in runtime}
    folded: set[str] = set()
    opsets = list(model.opset_import)
    for _ in range(_MAX_ROUNDS):
        shapes = _static(inferred)
        new: dict[str, Any] = {}
        for node in (work or model).graph.node:
            if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDED or not node.output:
                continue
            if any(o in values for o in node.output):
                continue
            try:
                if node.op_type in ("Shape", "Size") and node.input and node.input[0] in shapes:
                    dims = shapes[node.input[0]]
                    if node.op_type == "Size":
                        out = [np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)]
                    else:
                        attrs = {a.name: a.i for a in node.attribute}
                        out = [np.array(dims[attrs.get("start", 0) : attrs.get("end", len(dims))], dtype=np.int64)]
                elif (node.input or node.op_type == "Constant") and all((not i) or i in values for i in node.input):
                    out = _evaluate(node, values, opsets)
                else:
                    continue
            except Exception as exc:  # the reference evaluator cannot compute it: leave it to shape inference
                _log.debug("not folded for shapes: %s (%s): %s", node.name, node.op_type, exc)
                continue
            for name, value in zip(node.output, out, strict=False):
                array = np.asarray(value)
                if name and array.size <= _MAX_ELEMENTS:
                    new[name] = array
                    values[name] = array  # later nodes of this pass read it
        if not new:
            break
        folded.update(new)
        # A copy in which the folded values are initializers (their nodes removed), for the next round's inference.
        work = onnx.ModelProto()
        work.CopyFrom(model)
        keep = [n for n in work.graph.node if not all((not o) or o in folded for o in n.output)]
        del work.graph.node[:]
        work.graph.node.extend(keep)
        outputs = {o.name for o in work.graph.output}
        work.graph.initializer.extend(
            numpy_helper.from_array(values[name], name) for name in sorted(folded) if name not in outputs
        )
        try:
            inferred_work = _infer(work)
        except Exception as exc:
            _log.info("shape inference after folding failed (%s); keeping the plain inference", exc)
            break
        inferred = _merge(inferred, inferred_work, values, folded)
    return inferred


def _without_symbolic_infos(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose intermediate value infos and outputs forget their symbolic dims (``unk__0``, ``2*height``):
    shape inference keeps a symbol it finds written there even when it could compute the size now."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for vi in [*copy.graph.value_info, *copy.graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param"):
                    d.Clear()
    return copy


def _merge(base: onnx.ModelProto, better: onnx.ModelProto, values: dict[str, Any], folded: set[str]) -> onnx.ModelProto:
    """``base`` (the original nodes) with value infos taken from ``better`` where they are more static, and value
    infos for the folded values."""
    out = onnx.ModelProto()
    out.CopyFrom(base)
    static = _static(better)
    infos = {vi.name: vi for vi in [*better.graph.value_info, *better.graph.output]}
    del out.graph.value_info[:]
    seen = set()
    for vi in base.graph.value_info:
        choice = infos[vi.name] if vi.name in static and vi.name in infos else vi
        out.graph.value_info.append(choice)
        seen.add(vi.name)
    graph_outputs = {o.name for o in base.graph.output}
    for name in sorted(folded - seen - graph_outputs):
        array = values[name]
        elem = helper.np_dtype_to_tensor_dtype(array.dtype)
        out.graph.value_info.append(helper.make_tensor_value_info(name, elem, list(array.shape)))
        seen.add(name)
    for name, vi in infos.items():
        if name not in seen and name not in graph_outputs and name in static:
            out.graph.value_info.append(vi)
    for i, o in enumerate(base.graph.output):
        if o.name in static and o.name in infos:
            out.graph.output[i].CopyFrom(infos[o.name])
    return out
