"""Copies, dtype casts and the ``*_like`` constants."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, out_shape
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import MAX_FOLD_BYTES, Declined, Translator, ir_dtype

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


@handles(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def _alias(t: Translator, node: Node, x: Node, *args: object, **kwargs: object) -> ir.Value:
    """A copy is the same ONNX value (ONNX values are immutable)."""
    if node.meta["val"].dtype != fake(x).dtype or out_shape(node) != tuple(fake(x).shape):
        raise Declined(f"{node.target} changes dtype or shape")
    return t.value(x)


@handles(aten._to_copy.default)
def _to_copy(t: Translator, node: Node, x: Node, **kwargs: object) -> ir.Value:
    dtype = node.meta["val"].dtype
    if dtype == fake(x).dtype:
        return t.value(x)
    return t.out("Cast", [t.value(x)], {"to": int(ir_dtype(dtype))})


@handles(
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.full_like.default,
    aten.empty_like.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
)
def _like_constant(t: Translator, node: Node, *args: object, **kwargs: object) -> torch.Tensor:
    """zeros_like/ones_like/full_like of a runtime tensor, and its new_zeros/new_ones/new_full: only the (static)
    shape matters. empty_like's and new_empty's memory is uninitialized: zeros are one of its values (a graph that
    reads them before writing is wrong in PyTorch too)."""
    val = node.meta["val"]
    if val.numel() * val.element_size() > MAX_FOLD_BYTES:
        raise Declined(f"{node.target} would become a constant of {val.numel() * val.element_size()} bytes")
    name = node.target.__name__.split(".")[0]  # type: ignore[union-attr]  # fx types Node.target loosely; here it is an OpOverload
    # full_like(self, fill_value), new_full(self, size, fill_value)
    fill_at = {"full_like": 1, "new_full": 2}.get(name)
    fill = {"zeros": 0, "ones": 1, "empty": 0}.get(
        name.removeprefix("new_").removesuffix("_like"),
        args[fill_at] if fill_at is not None and len(args) > fill_at else kwargs.get("fill_value"),
    )
    return torch.full(tuple(val.shape), fill, dtype=val.dtype)  # type: ignore[call-overload]  # fill: the op's scalar
