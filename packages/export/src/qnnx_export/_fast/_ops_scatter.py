"""``scatter`` of one value: ``x.scatter(dim, index, value)`` (a router's group mask, ``mask.scatter_(1, idx, 1)``).

Written densely, without ScatterElements (whose negative and runtime indices are wrong on HTP): the positions the
index names along ``dim`` are matched against every row (``ScatterMatch``), and the named ones take the value.
Repeated positions write the same value, so the result is the same whatever order the writes take. A scatter of a
source tensor (``scatter.src``) is left to PyTorch's exporters: where the index repeats a position PyTorch does not
say which source element wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._ops_reduce_into import ScatterMatch
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
