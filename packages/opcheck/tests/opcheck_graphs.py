"""Small ONNX graph builders for the opcheck tests (numpy + onnx only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[str | onnx.ValueInfoProto],
    inits: Sequence[onnx.TensorProto] = (),
    opset: int = 21,
    extra_opsets: Sequence[tuple[str, int]] = (),
) -> onnx.ModelProto:
    """Build a checked model; outputs given by name get their type from shape inference."""
    outs = [o if isinstance(o, onnx.ValueInfoProto) else helper.make_empty_tensor_value_info(o) for o in outputs]
    g = helper.make_graph(list(nodes), "g", list(inputs), outs, list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(g, opset_imports=ops, ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(m)
    typed = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    del m.graph.output[:]
    for o in outs:
        vi = typed.get(o.name, o)
        if not vi.type.tensor_type.elem_type:
            vi = helper.make_tensor_value_info(o.name, F, None)
        m.graph.output.append(vi)
    onnx.checker.check_model(m)
    return m


def inp(name: str, shape: Sequence[int | str] | None, dtype: int = F) -> onnx.ValueInfoProto:
    """A typed graph input."""
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name: str, value: object, dtype: object = np.float32) -> onnx.TensorProto:
    """An initializer from a Python/numpy value."""
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def node(
    op: str, ins: Sequence[str], outs: Sequence[str], name: str = "", domain: str = "", **attrs: object
) -> onnx.NodeProto:
    """A node with a name (defaults to the op type in lower case)."""
    return helper.make_node(op, list(ins), list(outs), name=name or op.lower(), domain=domain, **attrs)


def unary(
    op: str, dtype: int = F, shape: Sequence[int] = (2, 3, 4), opset: int = 21, **attrs: object
) -> onnx.ModelProto:
    """One unary node on a graph input."""
    return model([node(op, ["x"], ["y"], **attrs)], [inp("x", shape, dtype)], ["y"], opset=opset)


def feature_extractor(
    shape: tuple[int, ...],
    indices: Sequence[int],
    dtype: str = "float32",
    runtime: bool = False,
    declared: bool = True,
    index_shape: tuple[int, ...] | None = None,
) -> onnx.ModelProto:
    """ai.onnx.ml's ArrayFeatureExtractor of ``x[shape]`` (float32, int32 or int64) by int64 indices ``y``: a graph
    input (``runtime``) or a constant. The output's shape is declared as onnxruntime computes it ([1, n] for a 1-D
    x), or left out (``declared=False``, as ONNX's shape inference leaves it). ``index_shape`` reshapes the indices
    (a scalar, a matrix); the output is then left to inference."""
    elem = {"float32": F, "int32": TensorProto.INT32, "int64": TensorProto.INT64}[dtype]
    inputs = [helper.make_tensor_value_info("x", elem, list(shape))]
    y = np.array(indices, np.int64).reshape(index_shape if index_shape is not None else (len(indices),))
    declared = declared and index_shape is None
    inits = []
    if runtime:
        inputs.append(helper.make_tensor_value_info("y", TensorProto.INT64, list(y.shape)))
    else:
        inits.append(numpy_helper.from_array(y, "y"))
    out_shape = [1, len(indices)] if len(shape) == 1 else [*shape[:-1], len(indices)]
    node = helper.make_node("ArrayFeatureExtractor", ["x", "y"], ["z"], domain="ai.onnx.ml", name="afe")
    output = helper.make_tensor_value_info("z", elem, out_shape if declared else None)
    graph = helper.make_graph([node], "g", inputs, [output], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)
