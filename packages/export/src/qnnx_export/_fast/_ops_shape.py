"""Layout ops: views and reshapes, transposes, expand, slice, concatenation, splits and padding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis, out_shape
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


@handles(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.flatten.using_ints,
)
def _reshape(t: Translator, node: Node, x: Node, *args: object, **kwargs: object) -> ir.Value:
    """Any op that keeps the elements in order and only changes the shape: a Reshape to PyTorch's output shape."""
    return _to_out_shape(t, node, x, "Reshape")


def _to_out_shape(t: Translator, node: Node, x: Node, op_type: str) -> ir.Value:
    """``x`` itself when it already has ``node``'s output shape, else ``op_type`` (Reshape, Expand) to that shape."""
    shape = out_shape(node)
    if shape == tuple(fake(x).shape):
        return t.value(x)
    return t.out(op_type, [t.value(x), t.ints(shape)])


def _in_order(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether ``stride`` lays ``size`` out contiguously (row-major), the strides of dims of size 1 aside."""
    want = 1
    for n, s in zip(reversed(tuple(size)), reversed(tuple(stride)), strict=True):
        if n != 1 and s != want:
            return False
        want *= n
    return True


@handles(aten.as_strided.default, aten.as_strided_.default)
def _as_strided(
    t: Translator, node: Node, x: Node, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> ir.Value:
    """A view of ``x``'s storage that reads its elements in order, from its first one: a Reshape (or ``x`` itself).

    That is the case when ``x`` is laid out contiguously and so is the view, the strides of dims of size 1 aside:
    PyTorch's adaptive average pool to 1x1 of a channels-last-looking input restrides its ``[N, C, 1, 1]`` mean in
    place to ``(C, 1, C, C)`` (Hiera's and MaskFormer-Swin's poolers). Any other view (a reorder, a repeat, a window
    of the storage) declines."""
    fx = fake(x)
    offset = fx.storage_offset() if storage_offset is None else storage_offset
    if offset != fx.storage_offset() or math.prod(size) != fx.numel():
        raise Declined("as_strided that does not read the whole tensor from its first element")
    if not (_in_order(fx.shape, fx.stride()) and _in_order(size, stride)):
        raise Declined("as_strided that reorders or repeats elements")
    return _to_out_shape(t, node, x, "Reshape")


@handles(aten.permute.default)
def _permute(t: Translator, node: Node, x: Node, dims: Sequence[int]) -> ir.Value:
    rank = fake(x).dim()
    perm = [onnx_axis(d, rank) for d in dims]
    if perm == list(range(rank)):
        return t.value(x)
    return t.out("Transpose", [t.value(x)], {"perm": perm})


@handles(aten.transpose.int)
def _transpose(t: Translator, node: Node, x: Node, d0: int, d1: int) -> ir.Value:
    rank = fake(x).dim()
    perm = list(range(rank))
    a, b = onnx_axis(d0, rank), onnx_axis(d1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(t, node, x, perm)


@handles(aten.t.default)
def _t(t: Translator, node: Node, x: Node) -> ir.Value:
    rank = fake(x).dim()
    return _permute(t, node, x, [1, 0] if rank == 2 else list(range(rank)))


@handles(
    aten.squeeze_.dim,
    aten.squeeze_.dims,
    aten.squeeze_.default,
    aten.unsqueeze_.default,
    aten.t_.default,
    aten.transpose_.default,
)
def _reshape_in_place(t: Translator, node: Node, x: Node, *args: object) -> ir.Value:
    """An in-place view op of a tensor the graph computed (``mm(x.unsqueeze(0), w.t()).squeeze_(0)``, how ATen writes
    a Linear of an unbatched input): the traced graph's later uses read this node, not ``x``, so it is the op
    itself. An argument of the graph is declined: the caller's tensor would change shape."""
    if x.op == "placeholder":
        raise Declined(f"{node.target} of the graph's argument {x.name} (it changes the caller's tensor)")
    if node.target is aten.t_.default:
        return _t(t, node, x)
    if node.target is aten.transpose_.default:
        return _transpose(t, node, x, *args)  # type: ignore[arg-type]  # (dim0, dim1)
    return _to_out_shape(t, node, x, "Reshape")


@handles(aten.expand.default)
def _expand(t: Translator, node: Node, x: Node, size: Sequence[int], **kwargs: object) -> ir.Value:
    return _to_out_shape(t, node, x, "Expand")


@handles(aten.repeat.default)
def _repeat(t: Translator, node: Node, x: Node, repeats: Sequence[int]) -> ir.Value:
    """``x.repeat(*repeats)``: ONNX Tile, after prepending size-1 dims when ``repeats`` is longer than x's rank."""
    shape = tuple(fake(x).shape)
    value = t.value(x)
    if len(repeats) > len(shape):
        shape = (1,) * (len(repeats) - len(shape)) + shape
        if all(r == 1 for r in repeats):
            return t.out("Reshape", [value, t.ints(shape)])
        value = t.emit1("Reshape", [value, t.ints(shape)], dtype=fake(x).dtype, shape=shape)
    elif all(r == 1 for r in repeats):
        return value
    return t.out("Tile", [value, t.ints(list(repeats), "repeats")])


@handles(aten.slice.Tensor)
def _slice(
    t: Translator, node: Node, x: Node, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> ir.Value:
    shape = tuple(fake(x).shape)
    d = onnx_axis(dim, len(shape))
    size = shape[d]
    s, e, _ = slice(start, end, step).indices(size)
    if step < 1:
        raise Declined("slice with step < 1")
    if out_shape(node) == shape:
        return t.value(x)
    return t.out(
        "Slice",
        [t.value(x), t.ints([s], "starts"), t.ints([max(e, s)], "ends"), t.ints([d], "axes"), t.ints([step], "steps")],
    )


@handles(aten.cat.default)
def _cat(t: Translator, node: Node, tensors: Sequence[Node], dim: int = 0) -> ir.Value:
    dtype = node.meta["val"].dtype
    rank = node.meta["val"].dim()
    # torch.cat skips 1-D empty tensors whatever the other shapes; ONNX Concat would reject them.
    parts = [t.operand(x, dtype) for x in tensors if fake(x).numel() > 0]
    if not parts:
        raise Declined("cat of empty tensors only")
    if len(parts) == 1:
        return parts[0]
    return t.out("Concat", parts, {"axis": onnx_axis(dim, rank)})


@handles(aten.roll.default)
def _roll(t: Translator, node: Node, x: Node, shifts: int | Sequence[int], dims: int | Sequence[int] = ()) -> ir.Value:
    """``torch.roll`` as two Slices and a Concat per rolled dim (data movement, exact); with no dims, of the
    flattened tensor. A sliding-window KV cache rolls its rows this way."""
    val = node.meta["val"]
    shape, dtype = tuple(val.shape), val.dtype
    shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
    dim_list = [dims] if isinstance(dims, int) else list(dims)
    if not dim_list:
        if len(shift_list) != 1:
            raise Declined("roll of the flattened tensor by several shifts")
        n = math.prod(shape)
        flat = t.emit1("Reshape", [t.value(x), t.ints([n])], dtype=dtype, shape=(n,))
        rolled = _roll_axis(t, flat, (n,), 0, shift_list[0], dtype)
        return t.out("Reshape", [rolled, t.ints(list(shape))])
    if len(shift_list) != len(dim_list):
        raise Declined(f"roll with {len(shift_list)} shifts for {len(dim_list)} dims")
    value = t.value(x)
    for shift, dim in zip(shift_list, dim_list, strict=True):
        value = _roll_axis(t, value, shape, onnx_axis(dim, len(shape)), shift, dtype)
    return value


def _roll_axis(
    t: Translator, value: ir.Value, shape: tuple[int, ...], axis: int, shift: int, dtype: torch.dtype
) -> ir.Value:
    """``value`` rolled by ``shift`` along ``axis``: its last ``shift`` (mod size) entries, then the others."""
    n = shape[axis]
    s = shift % n if n else 0
    if s == 0:
        return value
    parts = []
    for start, end in ((n - s, n), (0, n - s)):
        part_shape = (*shape[:axis], end - start, *shape[axis + 1 :])
        inputs = [value, t.ints([start], "starts"), t.ints([end], "ends"), t.ints([axis], "axes")]
        parts.append(t.emit1("Slice", inputs, dtype=dtype, shape=part_shape))
    return t.emit1("Concat", parts, {"axis": axis}, dtype=dtype, shape=shape)


@handles(aten.stack.default)
def _stack(t: Translator, node: Node, tensors: Sequence[Node], dim: int = 0) -> ir.Value:
    """``torch.stack``: each tensor viewed with a size-1 dim at ``dim`` (a Reshape: Unsqueeze of int64 data stops
    the process on HTP), then one Concat along it."""
    val = node.meta["val"]
    axis = onnx_axis(dim, val.dim())
    parts = []
    for x in tensors:
        shape = list(fake(x).shape)
        shape.insert(axis, 1)
        parts.append(t.emit1("Reshape", [t.operand(x, val.dtype), t.ints(shape)], dtype=val.dtype, shape=tuple(shape)))
    if len(parts) == 1:
        return t.out("Identity", parts)
    return t.out("Concat", parts, {"axis": axis})


@handles(
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unsafe_split.Tensor,
    aten.unsafe_split_with_sizes.default,
)
def _split(t: Translator, node: Node, x: Node, sizes: int | Sequence[int], dim: int = 0) -> list[ir.Value]:
    shape = tuple(fake(x).shape)
    d = onnx_axis(dim, len(shape))
    vals = node.meta["val"]
    lengths = [int(v.shape[d]) for v in vals]
    outs = [(v.dtype, tuple(v.shape)) for v in vals]
    return t.emit("Split", [t.value(x), t.ints(lengths, "split")], {"axis": d}, outputs=outs)


@handles(aten.unbind.int)
def _unbind(t: Translator, node: Node, x: Node, dim: int = 0) -> tuple[ir.Value, ...]:
    """Split into slices of size 1 along ``dim``, each reshaped without that axis."""
    shape = tuple(fake(x).shape)
    d = onnx_axis(dim, len(shape))
    kept = (*shape[:d], 1, *shape[d + 1 :])
    dtype = fake(x).dtype
    pieces = t.emit(
        "Split", [t.value(x), t.ints([1] * shape[d], "split")], {"axis": d}, outputs=[(dtype, kept)] * shape[d]
    )
    return tuple(
        t.emit1("Reshape", [p, t.ints(tuple(v.shape))], dtype=v.dtype, shape=tuple(v.shape))
        for p, v in zip(pieces, node.meta["val"], strict=True)
    )


@handles(aten.constant_pad_nd.default)
def _constant_pad(t: Translator, node: Node, x: Node, pad: Sequence[int], value: float = 0.0) -> ir.Value:
    rank = fake(x).dim()
    if any(p < 0 for p in pad):
        raise Declined("negative padding")
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        d = rank - 1 - i
        begins[d], ends[d] = pad[2 * i], pad[2 * i + 1]
    dtype = node.meta["val"].dtype
    return t.out("Pad", [t.value(x), t.ints(begins + ends, "pads"), t.scalar(value, dtype)], {"mode": "constant"})


@handles(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def _replication_pad(t: Translator, node: Node, x: Node, pad: Sequence[int]) -> ir.Value:
    """``F.pad(x, pad, mode="replicate")`` as data movement: along each padded axis, a Gather by the constant
    indices ``clamp(i - before, 0, size - 1)`` (PyTorch's own mapping, negative widths included). QNN HTP computes
    ONNX's Pad(mode='edge') wrongly (6.6e4 times the output's scale), so it is not written."""
    shape = list(fake(x).shape)
    if 0 in shape:
        raise Declined("replication pad of an empty tensor")
    dtype = node.meta["val"].dtype
    value = t.value(x)
    for i in range(len(pad) // 2):
        d = len(shape) - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        width = shape[d] + before + after
        if width <= 0:
            raise Declined("replication pad to an empty dimension")
        index = (torch.arange(width) - before).clamp(0, shape[d] - 1)
        if width == shape[d] and bool((index == torch.arange(width)).all()):
            continue
        shape[d] = width
        value = t.emit1("Gather", [value, t.initializer(index, "index")], {"axis": d}, dtype=dtype, shape=tuple(shape))
    return value


def _patch_grid(
    shape: tuple[int, ...],
    kernel: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> tuple[int, int, int, int, int, int]:
    """``(N, C, rows, kh, cols, kw)`` of an ``[N, C, H, W]`` image cut into whole, non-overlapping patches: what
    ``F.unfold``/``F.fold`` do when the kernel equals the stride (MobileViT's patches), a pure layout change.

    Raises:
        Declined: overlapping or dilated windows, padding, or a size the kernel does not divide.
    """
    kh, kw = kernel
    if list(stride) != [kh, kw] or list(dilation) != [1, 1] or any(padding) or len(shape) != 4:
        raise Declined("unfold/fold other than whole non-overlapping patches of a batched image")
    n, c, h, w = shape
    if h % kh or w % kw:
        raise Declined(f"unfold/fold of {h}x{w} by a {kh}x{kw} kernel that does not divide it")
    return n, c, h // kh, kh, w // kw, kw


def _relayout(
    t: Translator, node: Node, x: Node, shape: tuple[int, ...], perm: list[int], moved: tuple[int, ...]
) -> ir.Value:
    """``x`` reshaped to ``shape`` (rank 5, HTP's limit), transposed by ``perm`` to ``moved``, and reshaped to the
    node's output: the one layout change between an image and its patches, either way."""
    dtype = fake(x).dtype
    cut = t.emit1("Reshape", [t.value(x), t.ints(shape)], dtype=dtype, shape=shape)
    turned = t.emit1("Transpose", [cut], {"perm": perm}, dtype=dtype, shape=moved)
    return t.out("Reshape", [turned, t.ints(out_shape(node))])


@handles(aten.im2col.default)
def _im2col(
    t: Translator,
    node: Node,
    x: Node,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> ir.Value:
    """``F.unfold``. Into whole patches: ``[N, C, H, W]`` -> ``[N*C, rows, kh, cols, kw]`` -> patch-major
    ``[N*C, kh, kw, rows, cols]`` -> ``[N, C*kh*kw, rows*cols]``, every tensor of rank <= 5 (HTP's limit). Any other
    windows (overlapping, dilated, padded, strided): :func:`_gathered_windows`."""
    try:
        n, c, rows, kh, cols, kw = _patch_grid(tuple(fake(x).shape), kernel_size, dilation, padding, stride)
    except Declined:
        return _gathered_windows(t, node, x, kernel_size, dilation, padding, stride)
    return _relayout(t, node, x, (n * c, rows, kh, cols, kw), [0, 2, 4, 1, 3], (n * c, kh, kw, rows, cols))


def _gathered_windows(
    t: Translator,
    node: Node,
    x: Node,
    kernel: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> ir.Value:
    """``F.unfold`` of any windows: the image zero-padded, viewed as ``[N*C, Hp*Wp]``, a Gather along its pixels of
    the constant index of every window's elements (kernel row, kernel column, then window: the order of unfold's
    ``C*kh*kw`` rows within one channel), and the output's shape. Data movement only: exact."""
    shape = tuple(int(s) for s in fake(x).shape)
    if len(shape) not in (3, 4) or 0 in shape or 0 in out_shape(node):
        raise Declined(f"unfold of a {shape} input")
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    *lead, h, w = shape
    planes = math.prod(lead)
    hp, wp = h + 2 * ph, w + 2 * pw
    rows, cols = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    dtype = fake(x).dtype
    image = t.value(x)
    if ph or pw:
        pads = [0] * (len(shape) - 2) + [ph, pw]
        image = t.emit1(
            "Pad",
            [image, t.ints(pads + pads, "pads"), t.scalar(0, dtype)],
            {"mode": "constant"},
            dtype=dtype,
            shape=(*lead, hp, wp),
        )
    flat = t.emit1("Reshape", [image, t.ints((planes, hp * wp))], dtype=dtype, shape=(planes, hp * wp))
    at_row = (torch.arange(kh) * dh)[:, None, None, None] + (torch.arange(rows) * sh)[None, None, :, None]
    at_col = (torch.arange(kw) * dw)[None, :, None, None] + (torch.arange(cols) * sw)[None, None, None, :]
    index = (at_row * wp + at_col).reshape(-1)  # [kh, kw, rows, cols], flattened
    windows = t.emit1(
        "Gather",
        [flat, t.initializer(index, "im2col_index")],
        {"axis": 1},
        dtype=dtype,
        shape=(planes, int(index.numel())),
    )
    return t.out("Reshape", [windows, t.ints(out_shape(node))])


@handles(aten.col2im.default)
def _col2im(
    t: Translator,
    node: Node,
    x: Node,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> ir.Value:
    """``F.fold`` of whole patches (no window overlaps another, so nothing is summed): the inverse of
    :func:`_im2col`'s layout change."""
    n, c, rows, kh, cols, kw = _patch_grid(out_shape(node), kernel_size, dilation, padding, stride)
    return _relayout(t, node, x, (n * c, kh, kw, rows, cols), [0, 3, 1, 4, 2], (n * c, rows, kh, cols, kw))


@handles(aten.unfold.default, aten.unfold_copy.default)
def _unfold(t: Translator, node: Node, x: Node, dimension: int, size: int, step: int) -> ir.Value:
    """``Tensor.unfold(dim, size, step)`` (and ``unfold_copy``): the windows ``x[..., i * step : i * step + size, ...]`` along ``dim``, each
    window's elements on a new last axis. ``x`` viewed as ``[before, n_dim, after]``, a Gather along its middle
    axis of the constant index ``[n, size]`` (``i * step + j``), a Transpose moving the window axis last when
    ``after > 1`` (rank 4, where a rank-5 Transpose failed QNN's graph finalize), then the output's shape. Data
    movement only: exact."""
    val = node.meta["val"]
    shape = tuple(int(s) for s in fake(x).shape)
    out = tuple(int(s) for s in val.shape)
    if 0 in shape or 0 in out:
        raise Declined("unfold of an empty tensor")
    if len(out) > 5:
        raise Declined(f"unfold to rank {len(out)} (QNN takes rank 5 at most)")
    if val.dtype == torch.int64 and len(out) == 5:
        raise Declined("unfold of int64 data to 5-d (a Reshape of int64 data to 5-d has stopped QNN)")
    if not shape:  # a 0-d tensor unfolds into its one element
        return t.out("Reshape", [t.value(x), t.ints(out)])
    d = onnx_axis(dimension, len(shape))
    before, after, n = math.prod(shape[:d]), math.prod(shape[d + 1 :]), out[d]
    index = (torch.arange(n) * step)[:, None] + torch.arange(size)[None, :]
    dtype = val.dtype
    flat = t.emit1(
        "Reshape", [t.value(x), t.ints((before, shape[d], after))], dtype=dtype, shape=(before, shape[d], after)
    )
    windows = t.emit1(
        "Gather", [flat, t.initializer(index, "unfold_index")], {"axis": 1}, dtype=dtype, shape=(before, n, size, after)
    )
    if after > 1:
        windows = t.emit1("Transpose", [windows], {"perm": [0, 1, 3, 2]}, dtype=dtype, shape=(before, n, after, size))
    return t.out("Reshape", [windows, t.ints(out)])
