"""Integer inputs and results of rank 5 or more, passed through the graph boundary with their leading dims merged.

HTP holds no integer or bool tensor of rank 5: a graph that reads or returns one fails QNN's finalize (or stops the
process), although the ONNX model is right. Such a tensor is often only reshaped at the boundary: a 3-D max pool's
indices are computed on the ``[N*C, D, H, W]`` view and reshaped to ``[N, C, D, H, W]`` last, and an unpooling
reshapes its rank-5 indices flat first. There the reshape can happen on the host instead, where reshaping a
contiguous tensor copies nothing: the ONNX input takes the merged view (``InputSpec.onnx_shape``) and the ONNX
output is the tensor before its last reshape (``OutputSlot.shape`` restores the result's shape).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["merge_integer_ranks"]

_MAX_RANK = 4  # the highest rank HTP holds an integer tensor at


def _static(value: ir.Value) -> tuple[int, ...] | None:
    if value.shape is None:
        return None
    dims = [d for d in value.shape if isinstance(d, int)]
    return tuple(dims) if len(dims) == len(value.shape) else None


def _integer(value: ir.Value) -> bool:
    import onnx_ir as ir

    return value.dtype is not None and (value.dtype == ir.DataType.BOOL or value.dtype.is_integer())


def _fixed_target(node: ir.Node) -> bool:
    """Whether a Reshape's target shape is a constant whose meaning does not depend on its input's rank (no 0, which
    copies a dim of the input, unless ``allowzero`` makes it a literal 0)."""
    target = node.inputs[1] if len(node.inputs) > 1 else None
    if target is None or target.const_value is None:
        return False
    allowzero = node.attributes.get_int("allowzero", 0)
    return bool(allowzero) or 0 not in target.const_value.numpy().tolist()


def _reshaped_only(value: ir.Value) -> list[ir.Value] | None:
    """The outputs of the Casts between ``value`` and its reshapes when every path from it is a reshape to a fixed
    shape, directly or through one Cast (the int32 a legalized int64 input is cast back from); else None."""
    casts: list[ir.Value] = []
    uses = list(value.uses())
    for use in uses:
        node = use.node
        if node.op_type == "Cast" and len(node.outputs) == 1:
            after = list(node.outputs[0].uses())
            if not after or node.outputs[0].is_graph_output():
                return None
            if not all(u.node.op_type == "Reshape" and u.idx == 0 and _fixed_target(u.node) for u in after):
                return None
            casts.append(node.outputs[0])
        elif not (node.op_type == "Reshape" and use.idx == 0 and _fixed_target(node)):
            return None
    return casts if uses else None


# Elementwise ops: with every other input one element, they compute the same on any view of their tensor input.
_ELEMENTWISE = frozenset(
    {"Cast", "Not", "Neg", "Abs", "Sign", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"}
    | {"Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "And", "Or", "Xor", "Where", "Clip"}
)


def _elementwise_input(node: ir.Node) -> int | None:
    """The one input of an elementwise ``node`` that is not a one-element constant, or None."""
    if node.op_type not in _ELEMENTWISE or len(node.outputs) != 1:
        return None
    tensors = [i for i, v in enumerate(node.inputs) if v is not None and not _one_constant(v)]
    return tensors[0] if len(tensors) == 1 else None


def _one_constant(value: ir.Value) -> bool:
    shape = _static(value)
    return value.const_value is not None and shape is not None and math.prod(shape) == 1 and len(shape) <= 1


def _last_reshape(value: ir.Value) -> tuple[ir.Node, list[tuple[ir.Node, int]]] | None:
    """The Reshape to a fixed shape that makes ``value`` from a tensor of rank 4 or less computed in the graph,
    directly or through elementwise ops with one-element constants (a Cast, a comparison with 0), and those ops
    (nearest the Reshape last) with the input each reads the chain at; None when there is none, or when the graph
    reads ``value`` or a tensor of the chain otherwise."""
    if not all(u.node.op_type == "Reshape" and u.idx == 0 and _fixed_target(u.node) for u in value.uses()):
        return None
    chain: list[tuple[ir.Node, int]] = []
    current, node = value, value.producer()
    while node is not None and (at := _elementwise_input(node)) is not None:
        if chain and (current.is_graph_output() or len(list(current.uses())) != 1):
            return None
        chain.append((node, at))
        current = node.inputs[at]  # type: ignore[assignment]  # _elementwise_input picks a present input
        node = current.producer()
    if chain and (current.is_graph_output() or len(list(current.uses())) != 1):
        return None
    if node is None or node.op_type != "Reshape" or not _fixed_target(node):
        return None
    source = node.inputs[0]
    source_shape = _static(source) if source is not None else None
    if source is None or source_shape is None or len(source_shape) > _MAX_RANK:
        return None
    if source.is_graph_input() or source.is_graph_output() or source.is_initializer():
        return None
    return node, chain


def merge_integer_ranks(model: ir.Model, results: int) -> tuple[dict[str, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """Move the reshapes of integer inputs and results of rank 5+ to the host, where they are all the graph does with
    such a tensor (a result may also be reshaped again inside the graph: that reshape reads the tensor before the
    view); others are left as they are.

    Args:
        model: The exported model, changed in place.
        results: How many of the model's first outputs are the graph's results (the rest are written arguments,
            which the caller copies into tensors of their own shape; they are left).

    Returns:
        The merged shape each changed input now has (by name), and the result's shape each changed output (by
        output index) is viewed as on the host.
    """
    import onnx_ir as ir

    graph = model.graph
    inputs: dict[str, tuple[int, ...]] = {}
    for value in graph.inputs:
        shape = _static(value)
        if shape is None or len(shape) <= _MAX_RANK or not _integer(value):
            continue
        casts = _reshaped_only(value)
        if casts is None:
            continue
        merged = (math.prod(shape[: len(shape) - _MAX_RANK + 1]), *shape[len(shape) - _MAX_RANK + 1 :])
        for v in (value, *casts):  # a Cast is elementwise: it takes the view's shape
            v.shape = ir.Shape(merged)
        assert value.name is not None  # graph inputs are named
        inputs[value.name] = merged
    outputs: dict[int, tuple[int, ...]] = {}
    for k, value in enumerate(list(graph.outputs)[:results]):
        shape = _static(value)
        if shape is None or len(shape) <= _MAX_RANK or not _integer(value):
            continue
        found = _last_reshape(value)
        if found is None:
            continue
        reshape, chain = found
        source = reshape.inputs[0]
        assert source is not None  # _last_reshape checked it
        if not chain:
            for use in list(value.uses()):  # a reshape of a reshape to a fixed shape is a reshape of its input
                use.node.replace_input_with(0, source)
            graph.outputs[k] = source
        else:  # the elementwise ops compute on the source instead of its reshape; the output keeps its name
            first, at = chain[-1]
            first.replace_input_with(at, source)
            viewed = _static(source)
            assert viewed is not None  # _last_reshape checked it
            for node, _ in chain:
                node.outputs[0].shape = ir.Shape(viewed)
        graph.remove(reshape, safe=True)
        outputs[k] = shape
    return inputs, outputs
