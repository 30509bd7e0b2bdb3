"""Indexing: select, embedding, gather, index_select, advanced indexing with index tensors, and the writes
(index_copy, slice and select assignment, index_put) that in-place updates become once functionalized."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator, ir_dtype

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


_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


@handles(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(
    t: Translator,
    node: Node,
    weight: Node,
    indices: Node,
    offsets: Node,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Node | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[ir.Value, None, None, None]:
    """``nn.EmbeddingBag``'s bags (their sum, mean or max; its first output) with static shapes. Bag ``b`` holds
    positions ``[offsets[b], offsets[b + 1])`` (the last one up to the end, or to the extra last offset), found by
    comparing each position with the runtime offsets (exact integer comparisons) into a ``[bags, positions]``
    membership mask, without ``padding_idx``'s positions. The sum is the mask times the gathered rows (scaled by
    ``per_sample_weights``), one MatMul; the mean that sum divided by the bag's size; the max a ReduceMax of the rows
    masked to float16's lowest value. An empty bag gives 0, as PyTorch gives. The op's other outputs (offset2bag,
    bag sizes, max indices) are declined when read."""
    if any(user.target is not operator.getitem or user.args[1] != 0 for user in node.users):
        raise Declined(f"{node.target}: an output other than the bags is read")
    kind = _BAG_MODES.get(mode)
    if kind is None:
        raise Declined(f"{node.target} mode {mode}")
    bags = node.meta["val"][0]
    dtype, (count, width) = bags.dtype, tuple(int(s) for s in bags.shape)
    n = int(fake(indices).numel())
    if dtype not in (torch.float32, torch.float16) or fake(indices).dim() != 1 or n == 0 or count == 0:
        raise Declined(f"{node.target} of {fake(indices).dim()}-d indices to {dtype} bags")
    index_dtype = fake(offsets).dtype
    given = t.value(offsets)

    def part(start: int, stop: int) -> ir.Value:
        bounds = [t.ints([start]), t.ints([stop]), t.ints([0])]
        return t.emit1("Slice", [given, *bounds], dtype=index_dtype, shape=(stop - start,))

    if include_last_offset:  # B + 1 offsets: bag b ends where bag b + 1 starts, the last one at the extra offset
        starts, ends = part(0, count), part(1, count + 1)
    else:  # the last bag ends with the indices (no empty Slice for one bag: HTP holds no empty tensor)
        starts, ends = given, t.initializer(torch.tensor([n], dtype=index_dtype), "end")
        if count > 1:
            ends = t.emit1("Concat", [part(1, count), ends], {"axis": 0}, dtype=index_dtype, shape=(count,))
    positions = t.initializer(torch.arange(n, dtype=index_dtype).reshape(1, n), "positions")
    column = (count, 1)

    def column_of(v: ir.Value) -> ir.Value:
        return t.emit1("Reshape", [v, t.ints(column)], dtype=index_dtype, shape=column)

    grid = (count, n)
    after_start = t.emit1("LessOrEqual", [column_of(starts), positions], dtype=torch.bool, shape=grid)
    before_end = t.emit1("Less", [positions, column_of(ends)], dtype=torch.bool, shape=grid)
    member = t.emit1("And", [after_start, before_end], dtype=torch.bool, shape=grid)
    if padding_idx >= 0:
        ids = t.value(indices)
        pad = t.emit1("Equal", [ids, t.scalar(padding_idx, fake(indices).dtype)], dtype=torch.bool, shape=(n,))
        kept = t.emit1("Not", [pad], dtype=torch.bool, shape=(n,))
        member = t.emit1(
            "And",
            [member, t.emit1("Reshape", [kept, t.ints((1, n))], dtype=torch.bool, shape=(1, n))],
            dtype=torch.bool,
            shape=grid,
        )
    rows = t.emit1("Gather", [t.value(weight), t.value(indices)], {"axis": 0}, dtype=dtype, shape=(n, width))
    if per_sample_weights is not None:
        scale = t.emit1("Reshape", [t.operand(per_sample_weights, dtype), t.ints((n, 1))], dtype=dtype, shape=(n, 1))
        rows = t.emit1("Mul", [rows, scale], dtype=dtype, shape=(n, width))
    weights = t.emit1("Cast", [member], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=grid)
    if kind != "sum":  # each bag's size: the mean divides by it, an empty bag's max is 0
        sizes = t.emit1("ReduceSum", [weights, t.ints([1], "axes")], {"keepdims": 1}, dtype=dtype, shape=column)
    if kind == "max":
        lowest = t.scalar(float(torch.finfo(torch.float16).min), dtype)
        cube = (count, n, width)
        spread = t.emit1("Reshape", [member, t.ints((count, n, 1))], dtype=torch.bool, shape=(count, n, 1))
        masked = t.emit1("Where", [spread, rows, lowest], dtype=dtype, shape=cube)
        top = t.emit1("ReduceMax", [masked, t.ints([1], "axes")], {"keepdims": 0}, dtype=dtype, shape=(count, width))
        empty = t.emit1("Equal", [sizes, t.scalar(0.0, dtype)], dtype=torch.bool, shape=column)
        bag_max = t.emit1("Where", [empty, t.scalar(0.0, dtype), top], dtype=dtype, shape=(count, width))
        return bag_max, None, None, None
    total = t.emit1("MatMul", [weights, rows], dtype=dtype, shape=(count, width))
    if kind == "sum":
        return total, None, None, None
    size = t.emit1("Max", [sizes, t.scalar(1.0, dtype)], dtype=dtype, shape=column)
    return t.emit1("Div", [total, size], dtype=dtype, shape=(count, width)), None, None, None


# Ops whose int64 result is a position along an axis, >= 0 (an argmax, or the indices of max/min along a dim).
_POSITIONS = frozenset({aten.argmax.default, aten.argmin.default})
_POSITION_PAIRS = frozenset({aten.max.dim, aten.min.dim})


def _is_position(index: Node) -> bool:
    """Whether ``index`` is an ArgMax/ArgMin result (``argmax``, or ``max(x, dim)[1]``): non-negative by
    construction, and qnnx-opcheck knows it."""
    if index.target in _POSITIONS:
        return True
    source = index.args[0] if index.target is operator.getitem and len(index.args) == 2 else None
    return getattr(source, "target", None) in _POSITION_PAIRS and bool(index.args[1] == 1)


def _clamped_index(t: Translator, index: Node) -> ir.Value:
    """Runtime element indices as ``Max(i, 0)``: PyTorch's gather and scatter raise for an index outside
    ``[0, size)``, so this changes no valid call, and it lets qnnx-opcheck prove the indices non-negative (QNN HTP
    reads a negative GatherElements/ScatterElements index wrongly). An argmax's positions are taken as they are
    (a router's ``scores.gather(-1, max_ind)``): qnnx-opcheck knows them non-negative, and a Max there would be one
    more node for a split that pins Max to the CPU EP to move."""
    raw = t.value(index)
    if _is_position(index):
        return raw
    dtype, shape = fake(index).dtype, tuple(fake(index).shape)
    return t.emit1("Max", [raw, t.scalar(0, dtype)], dtype=dtype, shape=shape)


@handles(aten.gather.default)
def _gather(t: Translator, node: Node, x: Node, dim: int, index: Node, sparse_grad: bool = False) -> ir.Value:
    """``x.gather(dim, index)`` as GatherElements, runtime indices of rank <= 4 clamped at 0 (the simulator builds
    and computes that right over ranks 1-4, every axis, unit dims; rank 5 was not shown to finalize)."""
    shape = tuple(fake(x).shape)
    axis = onnx_axis(dim, len(shape))
    const = t.constant_of(index)
    if const is not None:
        idx = t.initializer(_in_range(const, shape[axis]).to(const.dtype), "index")
    elif len(shape) <= 4:
        idx = _clamped_index(t, index)
    else:
        idx = t.value(index)
    return t.out("GatherElements", [t.value(x), idx], {"axis": axis})


@handles(aten.index_select.default)
def _index_select(t: Translator, node: Node, x: Node, dim: int, index: Node) -> ir.Value:
    """``x.index_select(dim, index)`` as Gather; a scalar ``x`` is left to torch.onnx (it has no axis to gather)."""
    if fake(x).dim() == 0:
        raise Declined("index_select of a scalar")
    axis = onnx_axis(dim, fake(x).dim())
    return t.out("Gather", [t.value(x), _gather_index(t, index, fake(x).shape[axis])], {"axis": axis})


@handles(aten.index.Tensor)
def _index(t: Translator, node: Node, x: Node, indices: Sequence[Node | None]) -> ir.Value:
    """``x[..., i1, i2, ...]`` with adjacent integer index tensors (advanced indexing).

    One index tensor is a Gather on its axis. Several are flattened into one index over the merged axes and the
    data is gathered once: constants (masks built from ``arange``, the usual case) at export time, checked against
    the sizes (PyTorch raises for an index out of range); runtime ones in the graph (transformers' padding mask read
    as ``mask[batch_idx, kv_idx]``), each made non-negative first.
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
    sizes = shape[p : p + k]
    merged = (*shape[:p], math.prod(sizes), *shape[p + k :])
    dtype = fake(x).dtype
    if any(c is None for c in consts):
        data = t.emit1("Reshape", [t.value(x), t.ints(merged)], dtype=dtype, shape=merged)
        return t.out("Gather", [data, _flat_runtime_index(t, idx_nodes, sizes)], {"axis": p})
    parts = torch.broadcast_tensors(*[c.to(torch.int64) for c in consts if c is not None])
    flat = torch.zeros(parts[0].shape, dtype=torch.int64)
    for idx, size in zip(parts, sizes, strict=True):
        flat = flat * size + _in_range(idx, size)
    data = t.emit1("Reshape", [t.value(x), t.ints(merged)], dtype=dtype, shape=merged)
    return t.out("Gather", [data, t.initializer(flat, "index")], {"axis": p})


def _wrapped(t: Translator, index: Node, size: int) -> ir.Value:
    """Runtime int64 indices with the negative ones counted from the end (``i + size``), as PyTorch reads them."""
    i = t.operand(index, torch.int64)
    shape = tuple(fake(index).shape)
    negative = t.emit1("Less", [i, t.scalar(0, torch.int64)], dtype=torch.bool, shape=shape)
    wrapped = t.emit1("Add", [i, t.scalar(size, torch.int64)], dtype=torch.int64, shape=shape)
    return t.emit1("Where", [negative, wrapped, i], dtype=torch.int64, shape=shape)


def _flat_runtime_index(t: Translator, idx_nodes: Sequence[Node], sizes: Sequence[int]) -> ir.Value:
    """``sum(nonneg(i_k) * stride_k)`` over broadcast index tensors: one int64 index into the merged axes.

    A negative index counts from the end, as in PyTorch, so each is made non-negative before the sum (a negative
    term would land in the previous row). Indices outside ``[-size, size)`` raise in PyTorch and are not checked.
    """
    flat: ir.Value | None = None
    flat_shape: tuple[int, ...] = ()
    stride = math.prod(sizes)
    for node, size in zip(idx_nodes, sizes, strict=True):
        stride //= size
        shape = tuple(fake(node).shape)
        const = t.constant_of(node)
        if const is not None:
            term = t.initializer((_in_range(const, size) * stride).to(torch.int64), "index")
        else:
            term = _wrapped(t, node, size)
            if stride != 1:
                term = t.emit1("Mul", [term, t.scalar(stride, torch.int64)], dtype=torch.int64, shape=shape)
        if flat is None:
            flat, flat_shape = term, shape
        else:
            flat_shape = tuple(torch.broadcast_shapes(flat_shape, shape))
            flat = t.emit1("Add", [flat, term], dtype=torch.int64, shape=flat_shape)
    assert flat is not None
    return flat


@handles(aten.index_copy.default)
def _index_copy(t: Translator, node: Node, x: Node, dim: int, index: Node, source: Node) -> ir.Value:
    """``x.index_copy(dim, index, source)`` as ScatterElements with the index broadcast over ``source``.

    How a KV cache takes new keys and values (transformers' StaticCache). PyTorch refuses indices outside
    [0, size) and duplicates are undefined there too, so every valid call is exact. Runtime indices are clamped at
    0, which changes no valid call and lets the backend prove them non-negative.
    """
    shape = tuple(fake(x).shape)
    src_shape = tuple(fake(source).shape)
    if not shape:  # a scalar: PyTorch takes index [0] only, and the result is the source
        raise Declined("index_copy into a scalar")
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


@handles(aten.fill.Scalar, aten.fill.Tensor)
def _fill(t: Translator, node: Node, x: Node, value: Node | float | int | bool) -> ir.Value:
    """``x.fill(value)`` (what ``t[i] = 3.0`` becomes): ``value`` in ``x``'s dtype, broadcast to ``x``'s shape."""
    val = node.meta["val"]
    return t.out("Expand", [t.operand(value, val.dtype), t.ints(tuple(val.shape))])


@handles(aten.copy.default)
def _copy(t: Translator, node: Node, x: Node, source: Node, non_blocking: bool = False) -> ir.Value:
    """``x.copy(source)``: ``source`` in ``x``'s dtype, broadcast to ``x``'s shape."""
    val = node.meta["val"]
    src = t.operand(source, val.dtype)
    return t.out("Expand", [src, t.ints(tuple(val.shape))])


def _splice(t: Translator, x: Node, middle: ir.Value, axis: int, start: int, end: int) -> ir.Value:
    """``x`` with ``[start, end)`` along ``axis`` replaced by ``middle``: a Concat of the kept parts around it."""
    shape = tuple(fake(x).shape)
    dtype = fake(x).dtype
    pieces: list[ir.Value | None] = []
    for lo, hi in ((0, start), (end, shape[axis])):
        if hi <= lo:
            pieces.append(None)
            continue
        part = list(shape)
        part[axis] = hi - lo
        pieces.append(
            t.emit1(
                "Slice",
                [t.value(x), t.ints([lo], "starts"), t.ints([hi], "ends"), t.ints([axis], "axes")],
                dtype=dtype,
                shape=tuple(part),
            )
        )
    parts = [p for p in (pieces[0], middle, pieces[1]) if p is not None]
    if len(parts) == 1:
        return t.out("Identity", parts)
    return t.out("Concat", parts, {"axis": axis})


@handles(aten.slice_scatter.default)
def _slice_scatter(
    t: Translator,
    node: Node,
    x: Node,
    src: Node,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> ir.Value:
    """``x[..., start:end, ...] = src`` (slice assignment, after functionalization) as a Concat around ``src``."""
    shape = tuple(fake(x).shape)
    axis = onnx_axis(dim, len(shape))
    s, e, _ = slice(start, end, step).indices(shape[axis])
    if step != 1:
        raise Declined("slice_scatter with a step other than 1")
    e = max(e, s)
    if tuple(fake(src).shape) != (*shape[:axis], e - s, *shape[axis + 1 :]):
        raise Declined(f"slice_scatter source of shape {tuple(fake(src).shape)}")
    return _splice(t, x, t.operand(src, fake(x).dtype), axis, s, e)


@handles(aten.select_scatter.default)
def _select_scatter(t: Translator, node: Node, x: Node, src: Node, dim: int, index: int) -> ir.Value:
    """``x[..., index, ...] = src`` as a Concat around ``src`` with the dimension put back."""
    shape = tuple(fake(x).shape)
    axis = onnx_axis(dim, len(shape))
    i = index + shape[axis] if index < 0 else index
    if not 0 <= i < shape[axis]:
        raise Declined(f"select_scatter index {index} out of range for size {shape[axis]}")
    row = list(shape)
    row[axis] = 1
    middle = t.emit1(
        "Unsqueeze", [t.operand(src, fake(x).dtype), t.ints([axis], "axes")], dtype=fake(x).dtype, shape=tuple(row)
    )
    return _splice(t, x, middle, axis, i, i + 1)


def _masked_put(t: Translator, x: Node, mask: Node, lead: int, values: Node) -> ir.Value:
    """``x[..., mask] = values`` (a boolean mask over dims ``lead`` to ``lead + mask.ndim``) as
    ``Where(mask, values, x)``, when ``values`` broadcasts to the dims after the mask's: the same value written at
    every selected position (``ids[ids == k] = 0``, ``embeds[ids == k] = row``). Values with one entry per selected
    position (their count depends on the data) decline."""
    shape, dtype = tuple(fake(x).shape), fake(x).dtype
    mshape = tuple(fake(mask).shape)
    if not mshape or shape[lead : lead + len(mshape)] != mshape:
        raise Declined("index_put with a boolean mask of another shape than the dims it indexes")
    rest = shape[lead + len(mshape) :]
    given = tuple(fake(values).shape)
    vshape = given
    while vshape and len(vshape) > len(rest) and vshape[0] == 1:
        vshape = vshape[1:]  # a leading 1 (one row for every selected position) broadcasts
    if len(vshape) > len(rest) or any(v not in (1, r) for v, r in zip(vshape[::-1], rest[::-1], strict=False)):
        raise Declined("index_put with a boolean mask and one value per selected position")
    cond = t.value(mask)
    if rest:
        full = (*mshape, *(1,) * len(rest))
        cond = t.emit1("Reshape", [cond, t.ints(full)], dtype=torch.bool, shape=full)
    value = t.operand(values, dtype)
    if vshape != given:
        value = t.emit1("Reshape", [value, t.ints(vshape)], dtype=dtype, shape=vshape)
    return t.out("Where", [cond, value, t.value(x)])


@handles(aten.index_put.default)
def _index_put(
    t: Translator, node: Node, x: Node, indices: Sequence[Node | None], values: Node, accumulate: bool = False
) -> ir.Value:
    """``x[..., i0, i1, ...] = values`` with adjacent integer index tensors, as ScatterND.

    Index tensors after skipped leading dimensions (``x[:, :, i] = v``, how a sliding-window cache writes its last
    row) scatter into ``x`` transposed so that the indexed dimensions lead, then transposed back. Negative indices
    count from the end, as in PyTorch; duplicate positions are undefined in PyTorch too. One boolean mask whose
    values do not depend on how many elements it selects (see :func:`_masked_put`) is a Where; other boolean masks
    (data-dependent shapes), index tensors that are not adjacent and ``accumulate=True`` (a sum HTP would take in
    fp16) decline.
    """
    shape = tuple(fake(x).shape)
    dtype = fake(x).dtype
    if accumulate:
        raise Declined("index_put with accumulate=True")
    lead = next((p for p, i in enumerate(indices) if i is not None), len(indices))
    given = [i for i in indices[lead:] if i is not None]
    if not given or len(given) != len(indices) - lead or len(indices) > len(shape):
        raise Declined("index_put with index tensors that are not adjacent")
    if len(given) == 1 and fake(given[0]).dtype == torch.bool:
        return _masked_put(t, x, given[0], lead, values)
    if any(fake(i).dtype not in (torch.int64, torch.int32) for i in given):
        raise Declined("index_put with a boolean mask")
    k = len(given)
    batch = tuple(torch.broadcast_shapes(*(tuple(fake(i).shape) for i in given)))
    columns = []
    for dim, index in enumerate(given, start=lead):
        const = t.constant_of(index)
        if const is not None:
            idx = t.initializer(_in_range(const, shape[dim]).to(torch.int64), "index")
        else:
            ishape = tuple(fake(index).shape)
            idx = _wrapped(t, index, shape[dim])
            # A no-op for every valid index ([-size, size) wraps into [0, size)), and it lets opcheck prove the
            # positions non-negative.
            idx = t.emit1("Max", [idx, t.scalar(0, torch.int64)], dtype=torch.int64, shape=ishape)
        idx = t.emit1("Expand", [idx, t.ints(batch)], dtype=torch.int64, shape=batch)
        columns.append(t.emit1("Unsqueeze", [idx, t.ints([-1], "axes")], dtype=torch.int64, shape=(*batch, 1)))
    stacked = columns[0] if k == 1 else t.emit1("Concat", columns, {"axis": -1}, dtype=torch.int64, shape=(*batch, k))
    skipped, rest = shape[:lead], shape[lead + k :]
    # PyTorch broadcasts the values to the shape of x[..., i0, i1, ...]: the skipped dims, the indices', the rest.
    result_shape = skipped + batch + rest
    updates = t.emit1("Expand", [t.operand(values, dtype), t.ints(result_shape)], dtype=dtype, shape=result_shape)
    if lead == 0:
        return t.out("ScatterND", [t.value(x), stacked, updates])
    rank, b = len(shape), len(batch)
    perm = [*range(lead, lead + k), *range(lead), *range(lead + k, rank)]
    data = t.emit1("Transpose", [t.value(x)], {"perm": perm}, dtype=dtype, shape=tuple(shape[p] for p in perm))
    update_perm = [*range(lead, lead + b), *range(lead), *range(lead + b, len(result_shape))]
    updates = t.emit1(
        "Transpose", [updates], {"perm": update_perm}, dtype=dtype, shape=tuple(result_shape[p] for p in update_perm)
    )
    scattered = t.emit1("ScatterND", [data, stacked, updates], dtype=dtype, shape=tuple(shape[p] for p in perm))
    inverse = sorted(range(rank), key=perm.__getitem__)
    return t.out("Transpose", [scattered], {"perm": inverse})


def _placed(
    t: Translator, base: ir.Value, src: ir.Value, targets: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype
) -> ir.Value:
    """``base`` (``shape``: ``[*lead, M]``) with element ``targets[k]`` of its last axis replaced by ``src[..., k]``
    (``src``: ``[*lead, K]``, distinct constant targets): ``src`` with one zero appended, picked by a constant index
    per position (its ``k``, or the zero), and a constant mask choosing between that and ``base``. Data movement
    only: exact."""
    *lead, m = shape
    k = int(targets.numel())
    index = torch.full((m,), k, dtype=torch.int64)
    index[targets] = torch.arange(k)
    mask = torch.zeros(m, dtype=torch.bool)
    mask[targets] = True
    zero = t.initializer(torch.zeros((*lead, 1), dtype=dtype), "placed_zero")
    axis = len(lead)
    padded = t.emit1("Concat", [src, zero], {"axis": axis}, dtype=dtype, shape=(*lead, k + 1))
    picked = t.emit1("Gather", [padded, t.initializer(index, "placed_index")], {"axis": axis}, dtype=dtype, shape=shape)
    return t.emit1("Where", [t.initializer(mask, "placed_mask"), picked, base], dtype=dtype, shape=shape)


@handles(aten.diagonal_scatter.default)
def _diagonal_scatter(
    t: Translator, node: Node, x: Node, src: Node, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> ir.Value:
    """``x`` with its diagonal (``offset``, over ``dim1`` and ``dim2``) replaced by ``src``: the two dims moved last
    and flattened into one, ``src`` placed on the diagonal's positions there (:func:`_placed`), and moved back."""
    val = node.meta["val"]
    shape, dtype = tuple(val.shape), val.dtype
    if dtype == torch.bool:
        raise Declined("diagonal_scatter on bool tensors")
    rank = len(shape)
    d1, d2 = onnx_axis(dim1, rank), onnx_axis(dim2, rank)
    rest = [d for d in range(rank) if d not in (d1, d2)]
    lead = tuple(shape[d] for d in rest)
    n1, n2 = shape[d1], shape[d2]
    length = int(fake(src).shape[-1])
    if length == 0 or d1 == d2:
        raise Declined("diagonal_scatter of an empty diagonal")
    targets = torch.tensor([(k + max(-offset, 0)) * n2 + k + max(offset, 0) for k in range(length)])
    perm = [*rest, d1, d2]
    moved = t.emit1("Transpose", [t.value(x)], {"perm": perm}, dtype=dtype, shape=(*lead, n1, n2))
    flat = t.emit1("Reshape", [moved, t.ints([*lead, n1 * n2])], dtype=dtype, shape=(*lead, n1 * n2))
    placed = _placed(t, flat, t.operand(src, dtype), targets, (*lead, n1 * n2), dtype)
    plane = t.emit1("Reshape", [placed, t.ints([*lead, n1, n2])], dtype=dtype, shape=(*lead, n1, n2))
    return t.out("Transpose", [plane], {"perm": [perm.index(d) for d in range(rank)]})


@handles(aten.as_strided_scatter.default)
def _as_strided_scatter(
    t: Translator,
    node: Node,
    x: Node,
    src: Node,
    size: Sequence[int],
    stride: Sequence[int],
    storage_offset: int | None = None,
) -> ir.Value:
    """``x`` with the elements of its ``as_strided(size, stride, storage_offset)`` view replaced by ``src``, on ``x``
    contiguous and flattened (its storage order): each element of the view is one constant position there
    (:func:`_placed`). A view that reads a position twice (PyTorch raises for it) or leaves the tensor declines."""
    val = node.meta["val"]
    dtype = val.dtype
    base = fake(x)
    if dtype == torch.bool or not base.is_contiguous() or base.storage_offset() != 0:
        raise Declined("as_strided_scatter on bool, non-contiguous or offset tensors")
    numel = int(base.numel())
    grids = torch.meshgrid(*(torch.arange(n) for n in size), indexing="ij") if size else ()
    targets = (storage_offset or 0) + sum(
        (g * s for g, s in zip(grids, stride, strict=True)), torch.zeros((), dtype=torch.int64)
    )
    targets = targets.reshape(-1)
    if targets.numel() == 0 or int(targets.unique().numel()) != targets.numel() or int(targets.max()) >= numel:
        raise Declined("as_strided_scatter whose view is empty, overlaps itself or leaves the tensor")
    flat = t.emit1("Reshape", [t.value(x), t.ints([numel])], dtype=dtype, shape=(numel,))
    src_flat = t.emit1(
        "Reshape", [t.operand(src, dtype), t.ints([targets.numel()])], dtype=dtype, shape=(targets.numel(),)
    )
    placed = _placed(t, flat, src_flat, targets, (numel,), dtype)
    return t.out("Reshape", [placed, t.ints(list(val.shape))])
