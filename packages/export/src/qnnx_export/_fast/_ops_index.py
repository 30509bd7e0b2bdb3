"""Indexing: select, embedding, gather, index_select and advanced indexing with index tensors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


def _in_range(index: torch.Tensor, size: int) -> torch.Tensor:
    """Constant indices made non-negative; PyTorch raises for any outside [-size, size), so the translator declines."""
    if bool(((index < -size) | (index >= size)).any()):
        raise Declined(f"constant index out of range for a dimension of size {size}")
    return torch.remainder(index, size)


def _gather_index(t: Translator, index: Node, size: int) -> ir.Value:
    """A Gather index: constant indices are checked (PyTorch raises out of range) and made non-negative, since
    not every backend takes ONNX's negative Gather indices; runtime indices go as they are."""
    const = t.constant_of(index)
    if const is None:
        return t.value(index)
    return t.initializer(_in_range(const, size).to(const.dtype), "index")


@handles(aten.select.int)
def _select(t: Translator, node: Node, x: Node, dim: int, index: int) -> ir.Value:
    shape = tuple(fake(x).shape)
    d = onnx_axis(dim, len(shape))
    i = index + shape[d] if index < 0 else index
    return t.out("Gather", [t.value(x), t.initializer(torch.tensor(i, dtype=torch.int64), "index")], {"axis": d})


@handles(aten.embedding.default)
def _embedding(t: Translator, node: Node, weight: Node, indices: Node, *args: object) -> ir.Value:
    return t.out("Gather", [t.value(weight), t.value(indices)], {"axis": 0})


@handles(aten.gather.default)
def _gather(t: Translator, node: Node, x: Node, dim: int, index: Node, sparse_grad: bool = False) -> ir.Value:
    return t.out("GatherElements", [t.value(x), t.value(index)], {"axis": onnx_axis(dim, fake(x).dim())})


@handles(aten.index_select.default)
def _index_select(t: Translator, node: Node, x: Node, dim: int, index: Node) -> ir.Value:
    axis = onnx_axis(dim, fake(x).dim())
    return t.out("Gather", [t.value(x), _gather_index(t, index, fake(x).shape[axis])], {"axis": axis})


@handles(aten.index.Tensor)
def _index(t: Translator, node: Node, x: Node, indices: Sequence[Node | None]) -> ir.Value:
    """``x[..., i1, i2, ...]`` with adjacent integer index tensors (advanced indexing).

    One index tensor is a Gather on its axis. Several must be constants (masks built from ``arange``, the usual
    case): they are broadcast and flattened at export time into one index over the merged axes, checked against
    the sizes (PyTorch raises for an index out of range), and the data is gathered once.
    """
    shape = tuple(fake(x).shape)
    pos = [i for i, v in enumerate(indices) if v is not None]
    if not pos or pos != list(range(pos[0], pos[-1] + 1)):
        raise Declined("index with non-adjacent index tensors")
    p, k = pos[0], len(pos)
    idx_nodes = [v for v in indices if v is not None]
    if any(fake(v).dtype not in (torch.int64, torch.int32) for v in idx_nodes):
        raise Declined("index with a bool or non-integer index tensor")
    if k == 1:
        return t.out("Gather", [t.value(x), _gather_index(t, idx_nodes[0], shape[p])], {"axis": p})
    consts = [t.constant_of(v) for v in idx_nodes]
    if any(c is None for c in consts):
        raise Declined("index with several index tensors that are not constants")
    sizes = shape[p : p + k]
    parts = torch.broadcast_tensors(*[c.to(torch.int64) for c in consts if c is not None])
    flat = torch.zeros(parts[0].shape, dtype=torch.int64)
    for idx, size in zip(parts, sizes, strict=True):
        flat = flat * size + _in_range(idx, size)
    merged = (*shape[:p], math.prod(sizes), *shape[p + k :])
    dtype = fake(x).dtype
    data = t.emit1("Reshape", [t.value(x), t.ints(merged)], dtype=dtype, shape=merged)
    return t.out("Gather", [data, t.initializer(flat, "index")], {"axis": p})


@handles(aten.index_copy.default)
def _index_copy(t: Translator, node: Node, x: Node, dim: int, index: Node, source: Node) -> ir.Value:
    """``x.index_copy(dim, index, source)`` as ScatterElements with the index broadcast over ``source``.

    How a KV cache takes new keys and values (transformers' StaticCache). PyTorch refuses indices outside
    [0, size) and duplicates are undefined there too, so every valid call is exact. Runtime indices are clamped at
    0, which changes no valid call and lets the backend prove them non-negative.
    """
    shape = tuple(fake(x).shape)
    src_shape = tuple(fake(source).shape)
    axis = onnx_axis(dim, len(shape))
    const = t.constant_of(index)
    if const is not None:
        idx = t.initializer(_in_range(const, shape[axis]).to(torch.int64), "index")
    else:
        raw = t.value(index)
        if fake(index).dtype != torch.int64:
            raw = t.emit1("Cast", [raw], {"to": 7}, dtype=torch.int64, shape=tuple(fake(index).shape))
        idx = t.emit1("Max", [raw, t.scalar(0, torch.int64)], dtype=torch.int64, shape=tuple(fake(index).shape))
    along = [1] * len(src_shape)
    along[axis] = src_shape[axis]
    idx = t.emit1("Reshape", [idx, t.ints(along)], dtype=torch.int64, shape=tuple(along))
    idx = t.emit1("Expand", [idx, t.ints(src_shape)], dtype=torch.int64, shape=src_shape)
    return t.out("ScatterElements", [t.value(x), idx, t.value(source)], {"axis": axis})


@handles(aten.copy.default)
def _copy(t: Translator, node: Node, x: Node, source: Node, non_blocking: bool = False) -> ir.Value:
    """``x.copy(source)``: ``source`` in ``x``'s dtype, broadcast to ``x``'s shape."""
    val = node.meta["val"]
    src = t.operand(source, val.dtype)
    return t.out("Expand", [src, t.ints(tuple(val.shape))])
