"""``scatter``: ``x.scatter(dim, index, value)`` (a router's group mask, ``mask.scatter_(1, idx, 1)``) and
``x.scatter(dim, index, src)`` (a sampler's ``sorted_mask.scatter(1, sorted_indices, sorted_mask)``).

Written densely, without ScatterElements (whose negative and runtime indices are wrong on HTP): the positions the
index names along ``dim`` are matched against every row (``ScatterMatch``), and the named ones take the value.
Repeated positions of a value write the same value. Where the index of a source repeats a position, PyTorch's CPU
kernel writes the source elements in index order, so the last one along ``dim`` stays: the dense form picks that
one, so the result is eager's whatever the repetitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake
from qnnx_export._fast._ops_reduce_into import EXACT_ROWS, ScatterMatch
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


@handles(aten.scatter.value)
def _scatter_value(t: Translator, node: Node, x: Node, dim: int, index: Node, value: float | int | bool) -> ir.Value:
    """``x.scatter(dim, index, value)``: the elements the index names along ``dim`` take ``value``, the others
    keep theirs."""
    val = node.meta["val"]
    dtype = val.dtype
    if not isinstance(value, (bool, int, float)):
        raise Declined(f"{node.target} with a value of type {type(value).__name__}")
    sm = ScatterMatch(t, node, x, dim, index)
    named = t.emit1(
        "ReduceMax",
        [
            t.emit1(
                "Cast",
                [sm.match],
                {"to": int(ir_dtype(torch.float32))},
                dtype=torch.float32,
                shape=(sm.n, sm.k, sm.rest),
            ),
            t.ints([1], "axes"),
        ],
        {"keepdims": 0},
        dtype=torch.float32,
        shape=(sm.n, sm.rest),
    )
    hit = t.emit1("Greater", [named, t.scalar(0.0, torch.float32)], dtype=torch.bool, shape=(sm.n, sm.rest))
    own = sm.rows(t.value(x), sm.shape, dtype)
    result = t.emit1("Where", [hit, t.scalar(value, dtype), own], dtype=dtype, shape=(sm.n, sm.rest))
    return sm.back(result, dtype)


_SOURCE_DTYPES = (torch.float32, torch.float16, torch.bool)


@handles(aten.scatter.src)
def _scatter_src(t: Translator, node: Node, x: Node, dim: int, index: Node, src: Node) -> ir.Value:
    """``x.scatter(dim, index, src)``: each element the index names along ``dim`` takes the source element at the
    last index position that names it (eager's order of writes); the others keep theirs.

    The positions ``1..K`` of the index along ``dim`` are compared as float32 (exact in HTP's float16 up to 2048):
    the largest matching one is the last write, and the source element there is the only term of a sum over ``K``
    that is not masked to zero. An index outside ``[0, size)`` names no element (PyTorch raises for it). A bool
    tensor (a sampler's mask) is moved as 0.0 and 1.0; integer tensors are left to PyTorch's exporters (the masked
    sum of integers on HTP was not measured)."""
    val = node.meta["val"]
    dtype = val.dtype
    if dtype not in _SOURCE_DTYPES or fake(src).dtype != dtype:
        raise Declined(f"{node.target} of {dtype} (float32, float16 and bool are translated)")
    if fake(src).dim() != fake(x).dim():
        raise Declined(f"{node.target} with a source of another rank")
    sm = ScatterMatch(t, node, x, dim, index)
    if sm.k >= EXACT_ROWS:
        raise Declined(f"{node.target} with {sm.k} index positions along dim (up to {EXACT_ROWS - 1})")
    n, k, rest = sm.n, sm.k, sm.rest
    carrier = torch.float32 if dtype is torch.bool else dtype
    source3 = sm.source3(src, carrier)
    order = t.initializer(torch.arange(1, k + 1, dtype=torch.float32).reshape(1, k, 1), "positions")
    named = t.emit1("Where", [sm.match, order, t.scalar(0.0, torch.float32)], dtype=torch.float32, shape=(n, k, rest))
    axes = t.ints([1], "axes")
    last = t.emit1("ReduceMax", [named, axes], {"keepdims": 1}, dtype=torch.float32, shape=(n, 1, rest))
    chosen = t.emit1(
        "And",
        [sm.match, t.emit1("Equal", [named, last], dtype=torch.bool, shape=(n, k, rest))],
        dtype=torch.bool,
        shape=(n, k, rest),
    )
    picked = t.emit1("Where", [chosen, source3, t.scalar(0.0, carrier)], dtype=carrier, shape=(n, k, rest))
    value = t.emit1("ReduceSum", [picked, axes], {"keepdims": 0}, dtype=carrier, shape=(n, rest))
    hit = t.emit1(
        "Reshape",
        [
            t.emit1("Greater", [last, t.scalar(0.0, torch.float32)], dtype=torch.bool, shape=(n, 1, rest)),
            t.ints([n, rest]),
        ],
        dtype=torch.bool,
        shape=(n, rest),
    )
    if dtype is torch.bool:
        value = t.emit1("Greater", [value, t.scalar(0.5, carrier)], dtype=torch.bool, shape=(n, rest))
    own = sm.rows(t.value(x), sm.shape, dtype)
    result = t.emit1("Where", [hit, value, own], dtype=dtype, shape=(n, rest))
    return sm.back(result, dtype)
