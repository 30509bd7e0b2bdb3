"""The graph helpers the QNN-safety passes share: constants and static shapes of values, fresh names, new values
and initializers, and redirecting the uses of a value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames

__all__ = [
    "EXP_FLOOR",
    "add_initializer",
    "const_array",
    "float_op_input",
    "fresh_names",
    "input_producer",
    "is_op",
    "new_value",
    "new_values",
    "one_node_like",
    "op_input",
    "replace_value",
    "static_shape",
]

# The least Exp argument HTP computes right: exp(-87) = 1.6e-38 is 0 in float16 as exp of anything smaller, and
# below -88 HTP's Exp returns +-131008. Passes floor an Exp's input here, or cap the magnitude they negate.
EXP_FLOOR = -87.0


def is_op(node: ir.Node | None, op_type: str) -> bool:
    """Whether ``node`` is a node of the default ONNX domain with op type ``op_type``."""
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def op_input(node: ir.Node, op_type: str) -> ir.Value | None:
    """The first input of ``node`` when it is an ``op_type`` node of the default domain (see :func:`is_op`), else
    None."""
    return node.inputs[0] if is_op(node, op_type) and node.inputs else None


def float_op_input(node: ir.Node, op_type: str) -> ir.Value | None:
    """The first input of ``node`` when it is an ``op_type`` node (see :func:`op_input`) and that input is float32
    or float16, else None."""
    x = op_input(node, op_type)
    return x if x is not None and x.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16) else None


def input_producer(node: ir.Node, index: int = 0) -> ir.Node | None:
    """The node that computes input ``index`` of ``node``; None for a graph input, an initializer or no input."""
    value = node.inputs[index] if index < len(node.inputs) else None
    return value.producer() if value is not None else None


def const_array(value: ir.Value | None) -> np.ndarray | None:
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


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """Return the static shape of ``value`` or None when unknown or symbolic."""
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


MAX_HTP_RANK = 5
"""QNN HTP takes tensors of rank 5 at most."""


def transpose_perm(node: ir.Node, rank: int) -> list[int]:
    """A Transpose's permutation (reversed axes when it has no ``perm``)."""
    attr = node.attributes.get("perm")
    return list(attr.as_ints()) if attr is not None else list(reversed(range(rank)))


def read_only_by_reshapes(value: ir.Value) -> bool:
    """Whether ``value`` is read, and only as the data input of Reshapes (not a graph output)."""
    uses = list(value.uses())
    return not value.is_graph_output() and bool(uses) and all(u.node.op_type == "Reshape" and u.idx == 0 for u in uses)


def product_viewed_at_rank5(view: ir.Node) -> ir.Value | None:
    """The MatMul's or Gemm's product that Reshape ``view`` reshapes to rank 5 ``[..., N, k]`` (``k > 1``) from
    ``[..., N]``, the form that stops the process in QNN HTP and that qnnx-opcheck refuses; else None."""
    product = view.inputs[0] if is_op(view, "Reshape") else None
    maker = product.producer() if product is not None else None
    if product is None or maker is None or maker.op_type not in ("MatMul", "Gemm"):
        return None
    before, after = static_shape(product), static_shape(view.outputs[0])
    if before is None or after is None or len(after) != 5 or after[-1] < 2 or after[-2] != before[-1]:
        return None
    return product


def fresh_names(graph: ir.Graph, prefix: str) -> UniqueNames:
    """Fresh value/node names ``<prefix>_<hint>...`` that collide with nothing in the graph."""
    taken = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    for node in graph:
        taken.update(o.name for o in node.outputs if o.name)
        if node.name:
            taken.add(node.name)
    return UniqueNames(taken, prefix=f"{prefix}_")


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def new_value(name: str, dtype: ir.DataType | None, shape: Iterable[int] | None) -> ir.Value:
    return ir.Value(
        name=name,
        type=ir.TensorType(dtype) if dtype is not None else None,
        shape=ir.Shape(list(shape)) if shape is not None else None,
    )


def new_values(
    names: UniqueNames, dtype: ir.DataType | None, shapes: Mapping[str, Iterable[int] | None]
) -> dict[str, ir.Value]:
    """One new value per name hint of ``shapes``, in order: named after the hint, of ``dtype`` and that shape."""
    return {hint: new_value(names(hint), dtype, shape) for hint, shape in shapes.items()}


def one_node_like(
    names: UniqueNames, hint: str, node: ir.Node, op_type: str, inputs: Sequence[ir.Value | None]
) -> tuple[list[ir.Node], ir.Value]:
    """One ``op_type`` node of ``inputs`` whose output (named ``hint``) has the dtype and static shape of ``node``'s
    first output: a :data:`~qnnx_export._passes._base.Replacement` of one node."""
    out = node.outputs[0]
    new = new_value(names(hint), out.dtype, static_shape(out))
    return [ir.Node("", op_type, inputs, outputs=[new])], new


def replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Redirect every use of ``old`` (graph outputs too, keeping the output's name) to ``new``."""
    was_output = old.is_graph_output()
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    if was_output:
        name = old.name
        old.name = f"{name}__qnnx_replaced"
        new.name = name
