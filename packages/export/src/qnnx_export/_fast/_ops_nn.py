"""Neural-network layers: convolution (with batch norm folded into it), normalization and pooling."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import torch

from qnnx_export._fast._nodes import fake, only_first_output_used
from qnnx_export._fast._pool_windows import Window, max_pool_by_windows
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Attrs, Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

Ints: TypeAlias = int | Sequence[int]  # a pooling argument: one int for every spatial dim, or one each


@handles(aten.convolution.default)
def _convolution(
    t: Translator,
    node: Node,
    x: Node,
    w: Node,
    b: Node | None,
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> ir.Value:
    rank = fake(x).dim() - 2
    if rank < 1 or rank > 3:
        raise Declined(f"convolution over {rank} spatial dims")
    if isinstance(padding, str):
        raise Declined("convolution with string padding")
    # One value stands for every spatial dim: Conv2d(padding="valid") reaches ATen as padding=[0].
    attrs: dict[str, int | list[int]] = {
        "strides": _ntuple(stride, rank),
        "pads": _ntuple(padding, rank) * 2,
        "dilations": _ntuple(dilation, rank),
        "group": int(groups),
        "kernel_shape": list(fake(w).shape[2:]),
    }
    bn = t.folded_batch_norm(node)
    w_real = t.constant_of(w)
    b_real = t.constant_of(b) if b is not None else None
    folded = None
    if bn is not None and w_real is not None and (b is None or b_real is not None):
        try:
            folded = _fold_batchnorm(t, bn, w_real, b_real)
        except KeyError:  # a batch-norm argument computed after the convolution: translate the two nodes apart
            folded = None
    if bn is not None and folded is not None:
        weight, bias = folded
        inputs = [t.value(x), t.initializer(weight, f"{w.name}_bn"), t.initializer(bias, f"{bn.name}_bias")]
        # The fused node computes the batch norm's output: its name and origin follow that node.
        out = t.emit_for_node(bn, "Conv", inputs, attrs)
        t.set_result(bn, (out, None, None))
        return out
    inputs = [t.value(x), t.value(w)] + ([t.value(b)] if b is not None else [])
    if transposed:
        attrs["output_padding"] = _ntuple(output_padding, rank)
        return t.out("ConvTranspose", inputs, attrs)
    return t.out("Conv", inputs, attrs)


def _fold_batchnorm(
    t: Translator, bn: Node, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of the convolution that computes ``bn(conv(x))`` (in float64, then the weight's dtype)."""
    # aten.native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    _, gamma, beta, mean, var, _, _, eps = cast(
        "tuple[Any, Node | None, Node | None, Node | None, Node | None, Any, Any, float]", bn.args
    )
    cout = weight.shape[0]

    def real(x: Node | None, default: float) -> torch.Tensor:
        if x is None:
            return torch.full((cout,), default, dtype=torch.float64)
        got = t.constant_of(x)
        if got is None:
            raise Declined("batch norm with non-constant statistics")
        return got.double()

    scale = real(gamma, 1.0) / torch.sqrt(real(var, 0.0) + eps)
    shift = real(beta, 0.0) - real(mean, 0.0) * scale
    w = (weight.double() * scale.reshape(-1, *([1] * (weight.dim() - 1)))).to(weight.dtype)
    b0 = bias.double() if bias is not None else torch.zeros(cout, dtype=torch.float64)
    return w, (b0 * scale + shift).to(weight.dtype)


@handles(aten.native_batch_norm.default)
def _batch_norm(
    t: Translator,
    node: Node,
    x: Node,
    w: Node | None,
    b: Node | None,
    mean: Node | None,
    var: Node | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[ir.Value, None, None]:
    folded = t.result_of(node)
    if folded is not None:  # folded into the convolution before it
        return folded
    if not only_first_output_used(node):
        raise Declined("batch norm with its statistics used")
    c = fake(x).shape[1]
    dtype = node.meta["val"][0].dtype
    if training and mean is None and var is None:
        return _batch_statistics_norm(t, node, x, w, b, eps)
    if training:
        raise Declined("batch norm in training mode with running statistics (it would update them)")
    if mean is None or var is None:
        raise Declined("batch norm without running statistics")
    scale, shift = _channel_affine(t, w, b, c, dtype)
    val = node.meta["val"][0]
    out = t.emit1(
        "BatchNormalization",
        [t.value(x), scale, shift, t.value(mean), t.value(var)],
        {"epsilon": float(eps)},
        dtype=val.dtype,
        shape=tuple(val.shape),
    )
    return (out, None, None)


def _channel_affine(
    t: Translator, w: Node | None, b: Node | None, c: int, dtype: torch.dtype
) -> tuple[ir.Value, ir.Value]:
    """A batch norm's per-channel scale and shift: its weight and bias, or ones and zeros."""
    scale = t.value(w) if w is not None else t.initializer(torch.ones(c, dtype=dtype), "bn_scale")
    shift = t.value(b) if b is not None else t.initializer(torch.zeros(c, dtype=dtype), "bn_shift")
    return scale, shift


def _batch_statistics_norm(
    t: Translator, node: Node, x: Node, w: Node | None, b: Node | None, eps: float
) -> tuple[ir.Value, None, None]:
    """Batch norm by the input's own statistics (training mode, no running statistics: nothing is updated), over
    every axis but the channels (axis 1). With a batch of one that is ONNX's InstanceNormalization, which is also how
    ATen writes ``instance_norm`` (the input reshaped to ``[1, N * C, ...]``); any other batch is moved behind the
    channels first, ``[N, C, ...]`` -> ``[1, C, N * ...]``, and back after. Only ranks 3 and 4 reach QNN: a batch of
    one of any other rank is flattened to ``[1, C, ...]`` (the QNN EP refuses a rank-5 InstanceNormalization)."""
    shape = tuple(fake(x).shape)
    if len(shape) < 2:
        raise Declined(f"batch norm of a rank-{len(shape)} input")
    c = shape[1]
    dtype = node.meta["val"][0].dtype
    scale, shift = _channel_affine(t, w, b, c, dtype)
    attrs: Attrs = {"epsilon": float(eps)}
    if shape[0] == 1 and len(shape) in (3, 4):
        out = t.emit1("InstanceNormalization", [t.value(x), scale, shift], attrs, dtype=dtype, shape=shape)
        return (out, None, None)
    flat = (1, c, math.prod(shape) // c)
    if shape[0] == 1:
        y = t.emit1("Reshape", [t.value(x), t.ints(list(flat))], dtype=dtype, shape=flat)
        y = t.emit1("InstanceNormalization", [y, scale, shift], attrs, dtype=dtype, shape=flat)
        return (t.emit1("Reshape", [y, t.ints(list(shape))], dtype=dtype, shape=shape), None, None)
    swap = [1, 0, *range(2, len(shape))]  # its own inverse
    swapped = (shape[1], shape[0], *shape[2:])
    y = t.emit1("Transpose", [t.value(x)], {"perm": swap}, dtype=dtype, shape=swapped)
    y = t.emit1("Reshape", [y, t.ints(list(flat))], dtype=dtype, shape=flat)
    y = t.emit1("InstanceNormalization", [y, scale, shift], attrs, dtype=dtype, shape=flat)
    y = t.emit1("Reshape", [y, t.ints(list(swapped))], dtype=dtype, shape=swapped)
    return (t.emit1("Transpose", [y], {"perm": swap}, dtype=dtype, shape=shape), None, None)


@handles(aten.native_layer_norm.default)
def _layer_norm(
    t: Translator, node: Node, x: Node, normalized_shape: Sequence[int], w: Node | None, b: Node | None, eps: float
) -> tuple[ir.Value, ir.Value | None, ir.Value | None]:
    """LayerNormalization with its one output (the QNN EP takes LayerNormalization with one output only). With the
    mean or rstd used, all three are written out (:func:`_mean_rstd`), the output as ``(x - mean) * rstd``, then the
    weight and bias."""
    val = node.meta["val"][0]
    n = len(normalized_shape)
    shape = tuple(val.shape)
    if not only_first_output_used(node):
        d, mean, rstd = _mean_rstd(t, node, x, n, eps)
        out = t.emit1("Mul", [d, rstd], dtype=val.dtype, shape=shape)
        for arg, op in ((w, "Mul"), (b, "Add")):
            if arg is not None:
                out = t.emit1(op, [out, t.value(arg)], dtype=val.dtype, shape=shape)
        want = tuple(node.meta["val"][1].shape)
        if tuple(mean.shape or ()) != want:
            mean = t.emit1("Reshape", [mean, t.ints(want)], dtype=val.dtype, shape=want)
            rstd = t.emit1("Reshape", [rstd, t.ints(want)], dtype=val.dtype, shape=want)
        return (out, mean, rstd)
    scale = (
        t.value(w) if w is not None else t.initializer(torch.ones(tuple(normalized_shape), dtype=val.dtype), "ln_scale")
    )
    inputs = [t.value(x), scale] + ([t.value(b)] if b is not None else [])
    out = t.emit1("LayerNormalization", inputs, {"axis": -n, "epsilon": float(eps)}, dtype=val.dtype, shape=shape)
    return (out, None, None)


def _mean_rstd(t: Translator, node: Node, x: Node, n: int, eps: float) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``d = x - mean`` over the last ``n`` axes of ``x``, the mean and ``rstd = 1 / sqrt(var + eps)`` (both with
    the reduced axes kept), the variance taken on ``d / M`` (``M = max(max|d|, 1)``): ``rstd = (1 / M) /
    sqrt(mean((d / M)^2) + eps / M^2)``. Squared as it is, ``d`` overflows float16 on HTP above 256 and rstd would
    come back 0; every square here is at most 1, the mean of them at least 1/N when ``M > 1`` (the largest ``|d|``
    contributes 1), and ``eps / M^2``, taken as ``eps / M / M``, at most eps (``M^2`` itself would saturate, and HTP
    divides by a saturated value wrongly: 1e-5 / 950^2 came out 1.31). The same function in real arithmetic."""
    dtype = node.meta["val"][0].dtype
    full = tuple(fake(x).shape)
    axes = t.ints(list(range(len(full) - n, len(full))), "axes")
    kept = full[: len(full) - n] + (1,) * n

    def emit(op: str, *inputs: ir.Value, keep: bool = True, attrs: Attrs | None = None) -> ir.Value:
        return t.emit1(op, list(inputs), attrs, dtype=dtype, shape=kept if keep else full)

    xv = t.operand(x, dtype)
    mean = emit("ReduceMean", xv, axes, attrs={"keepdims": 1})
    d = emit("Sub", xv, mean, keep=False)
    m = emit("ReduceMax", emit("Abs", d, keep=False), axes, attrs={"keepdims": 1})
    big = emit("Max", m, t.scalar(1.0, dtype))
    scaled = emit("Div", d, big, keep=False)
    s = emit("ReduceMean", emit("Mul", scaled, scaled, keep=False), axes, attrs={"keepdims": 1})
    small_eps = emit("Div", emit("Div", t.scalar(float(eps), dtype), big), big)  # M^2 would saturate above 256
    rstd = emit("Div", emit("Reciprocal", big), emit("Sqrt", emit("Add", s, small_eps)))
    return d, mean, rstd


@handles(aten.native_group_norm.default)
def _group_norm(
    t: Translator,
    node: Node,
    x: Node,
    w: Node | None,
    b: Node | None,
    n: int,
    c: int,
    hw: int,
    groups: int,
    eps: float,
) -> tuple[ir.Value, None, None]:
    """GroupNorm as torch.onnx writes it: ``[N, C, *]`` viewed as ``[N, groups, C/groups * prod(*)]``, an
    InstanceNormalization (unit scale, zero bias) over its last axis, viewed back, then the per-channel weight and
    bias broadcast over the spatial dims."""
    if not only_first_output_used(node):
        raise Declined("group norm with its mean/rstd used")
    val = node.meta["val"][0]
    shape, dtype = tuple(val.shape), val.dtype
    grouped = (n, groups, (c // groups) * hw)
    view = t.emit1("Reshape", [t.value(x), t.ints(grouped)], dtype=dtype, shape=grouped)
    unit = t.initializer(torch.ones(groups, dtype=dtype), "gn_unit_scale")
    zero = t.initializer(torch.zeros(groups, dtype=dtype), "gn_zero_bias")
    normed = t.emit1("InstanceNormalization", [view, unit, zero], {"epsilon": float(eps)}, dtype=dtype, shape=grouped)
    out = t.emit1("Reshape", [normed, t.ints(shape)], dtype=dtype, shape=shape)
    per_channel = (c,) + (1,) * (len(shape) - 2)
    for arg, op in ((w, "Mul"), (b, "Add")):
        if arg is not None:
            factor = t.emit1("Reshape", [t.value(arg), t.ints(per_channel)], dtype=dtype, shape=per_channel)
            out = t.emit1(op, [out, factor], dtype=dtype, shape=shape)
    return (out, None, None)


def _ntuple(v: Ints, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def _pool_window(kernel: Ints, stride: Ints, padding: Ints, rank: int) -> dict[str, list[int]]:
    """ONNX kernel_shape, strides (PyTorch's empty stride means the kernel size) and symmetric pads over ``rank``
    spatial dims."""
    k = _ntuple(kernel, rank)
    return {"kernel_shape": k, "strides": _ntuple(stride, rank) if stride else k, "pads": _ntuple(padding, rank) * 2}


# The spatial dims of each pool: a tensor of another rank (an unbatched [C, *spatial] one) would be read with C as
# a spatial dim, so it declines (a max pool takes one: see _max_pool).
_POOL_DIMS = {
    aten.max_pool2d_with_indices.default: 2,
    aten.max_pool3d_with_indices.default: 3,
    aten.max_pool2d.default: 2,
    aten.avg_pool2d.default: 2,
    aten.avg_pool3d.default: 3,
}


@handles(*_POOL_DIMS)
def _pool(
    t: Translator, node: Node, x: Node, kernel: Ints, stride: Ints = (), padding: Ints = 0, *rest: Any, **kwargs: Any
) -> ir.Value | tuple[ir.Value, ir.Value | None]:
    """The ATen pools begin with the same window (``kernel_size, stride, padding``); each op's own arguments follow
    (``rest`` and ``kwargs``)."""
    spatial = _POOL_DIMS[node.target]  # type: ignore[index]  # fx types Node.target loosely; here it is an OpOverload
    window = _pool_window(kernel, stride, padding, spatial)
    if node.target in (aten.avg_pool2d.default, aten.avg_pool3d.default):
        if fake(x).dim() != 2 + spatial:
            raise Declined(f"{node.target} of an unbatched {fake(x).dim()}-d tensor")
        return _avg_pool(t, node, x, window, *rest, **kwargs)
    if fake(x).dim() not in (1 + spatial, 2 + spatial):
        raise Declined(f"{node.target} of a {fake(x).dim()}-d tensor")
    return _max_pool(t, node, x, window, *rest, **kwargs)


def _max_pool(
    t: Translator, node: Node, x: Node, window: dict[str, list[int]], dilation: Ints = 1, ceil_mode: bool = False
) -> ir.Value | tuple[ir.Value, ir.Value | None]:
    """ONNX's MaxPool with PyTorch's arguments. ``ceil_mode`` is written as more padding at the end, up to PyTorch's
    output size (which drops a last window that would start in the end padding): the pads read as -inf, so every
    window's maximum is PyTorch's (ONNX's own ceil_mode places the last window differently), and qnnx-export's
    maxpool_padded_input then joins them on for HTP. The indices, when used, are PyTorch's, not ONNX MaxPool's second
    output (QNN does not compute that one, and it numbers positions across the batch), and a pool HTP has no MaxPool
    for (three spatial dims, dilation) is the maximum of its window elements: see _pool_windows. An unbatched
    ``[C, *spatial]`` input is pooled as a batch of one."""
    rank = len(window["kernel_shape"])
    dilations = _ntuple(dilation, rank)
    with_indices = node.target is not aten.max_pool2d.default
    val = node.meta["val"][0] if with_indices else node.meta["val"]
    indices = with_indices and not only_first_output_used(node)
    shape, out_shape = tuple(fake(x).shape), tuple(int(s) for s in val.shape)
    if len(shape) == rank + 1:  # unbatched
        shape, out_shape = (1, *shape), (1, *out_shape)
    pads = window["pads"]
    for i, (size, n) in enumerate(zip(shape[2:], out_shape[2:], strict=True)):
        if ceil_mode:  # the end pads reach PyTorch's last window (a no-op otherwise)
            reach = (n - 1) * window["strides"][i] + dilations[i] * (window["kernel_shape"][i] - 1) + 1
            pads[rank + i] = max(pads[rank + i], reach - size - pads[i])
    result = tuple(int(s) for s in val.shape)
    pooled, where = None, None
    if rank == 2 and all(d == 1 for d in dilations):  # HTP's MaxPool: 2-D, no dilation
        xv = t.value(x)
        if shape != tuple(fake(x).shape):
            xv = t.emit1("Reshape", [xv, t.ints(shape)], dtype=val.dtype, shape=shape)
        attrs: Attrs = {**window, "dilations": dilations}
        pooled = t.emit1("MaxPool", [xv], attrs, dtype=val.dtype, shape=out_shape)
        if not indices and out_shape != result:
            pooled = t.emit1("Reshape", [pooled, t.ints(result)], dtype=val.dtype, shape=result)
    if pooled is None or indices:
        geometry = Window(
            kernel=tuple(window["kernel_shape"]),
            strides=tuple(window["strides"]),
            pads=tuple(pads[:rank]),
            dilations=tuple(dilations),
        )
        pooled, where = max_pool_by_windows(
            t, t.value(x), pooled, shape, out_shape, geometry, val.dtype, indices=indices, result_shape=result
        )
    if not with_indices:
        return pooled
    return (pooled, where)


@handles(aten.max_unpool2d.default, aten.max_unpool3d.default)
def _max_unpool(
    t: Translator,
    node: Node,
    x: Node,
    indices: Node,
    output_size: Sequence[int],
    stride: Sequence[int] | None = None,
    padding: Sequence[int] | None = None,
) -> ir.Value:
    """``max_unpool1d/2d/3d``: each value of ``x`` written at its index in the flat ``[*output_size]`` plane of its
    batch and channel, zeros elsewhere. One ScatterND into the flat zeros of every plane, at the index plus the
    plane's offset (as torch.onnx writes it, but flat to rank 2: no int64 tensor of rank 5, which HTP cannot hold).
    A position that several indices name (windows that overlap) takes one of their values, as in PyTorch, which
    leaves the order of the writes unspecified; ``stride`` and ``padding`` (3-D) do not enter the result."""
    del stride, padding
    val = node.meta["val"]
    dtype, out = val.dtype, tuple(int(s) for s in val.shape)
    shape = tuple(int(s) for s in fake(x).shape)
    spatial = len(output_size)
    if tuple(fake(indices).shape) != shape or fake(indices).dtype != torch.int64:
        raise Declined(f"{node.target} with indices of shape {list(fake(indices).shape)} for values of {list(shape)}")
    lead = math.prod(shape[:-spatial])
    count, plane = math.prod(shape[-spatial:]), math.prod(output_size)
    if lead * plane >= 2**31:
        raise Declined(f"{node.target} into {lead * plane} elements (int32 positions on HTP)")
    flat = t.emit1("Reshape", [t.value(indices), t.ints([lead, count])], dtype=torch.int64, shape=(lead, count))
    offsets = t.initializer((torch.arange(lead, dtype=torch.int64) * plane).reshape(lead, 1), "unpool_plane_offset")
    at = t.emit1("Add", [flat, offsets], dtype=torch.int64, shape=(lead, count))
    at = t.emit1("Reshape", [at, t.ints([lead * count, 1])], dtype=torch.int64, shape=(lead * count, 1))
    updates = t.emit1("Reshape", [t.value(x), t.ints([lead * count])], dtype=dtype, shape=(lead * count,))
    zeros = t.emit1("Expand", [t.scalar(0, dtype), t.ints([lead * plane])], dtype=dtype, shape=(lead * plane,))
    written = t.emit1("ScatterND", [zeros, at, updates], dtype=dtype, shape=(lead * plane,))
    return t.emit1("Reshape", [written, t.ints(out)], dtype=dtype, shape=out)


def _avg_pool(
    t: Translator,
    node: Node,
    x: Node,
    window: dict[str, list[int]],
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> ir.Value:
    """ONNX's AveragePool with PyTorch's arguments, ``ceil_mode`` too: ONNX Runtime drops a ceil window that would
    start in the end padding as PyTorch does, and divides by the same counts (qnnx-export's avgpool_whole_windows
    then writes the windows HTP gets wrong as whole ones).

    With ``divisor_override``, or without count_include_pad over three spatial dims, the pool is written with the
    divisor ONNX Runtime uses for count_include_pad (the window inside the padded input) and multiplied by a
    constant: that divisor over PyTorch's, both counted on the host by PyTorch's own pool of ones. The padding holds
    zeros, so the sum is over the input elements whatever the padding and ceil_mode. HTP averaged a rank-5 pool
    without count_include_pad and with padding of the first spatial axis alone 0.25-0.33 of the scale off (kernel
    ``[3, 2, 2]``, padding ``[1, 0, 0]``); with count_include_pad avgpool_whole_windows rewrites every rank-5 pool."""
    ceil: Attrs = {"ceil_mode": 1} if ceil_mode else {}
    spatial = len(window["kernel_shape"])
    if divisor_override is None and (count_include_pad or spatial < 3):
        return t.out("AveragePool", [t.value(x)], {**window, "count_include_pad": int(bool(count_include_pad)), **ceil})
    if divisor_override == 0:
        raise Declined("avg pool with divisor_override=0")
    val = node.meta["val"]
    pool = aten.avg_pool3d.default if spatial == 3 else aten.avg_pool2d.default
    ones = torch.ones((1, 1, *fake(x).shape[2:]), dtype=torch.float64)
    args = (window["kernel_shape"], window["strides"], window["pads"][:spatial], ceil_mode)
    inputs = pool(ones, *args, False, 1)  # the input elements in each window
    padded = inputs / pool(ones, *args, True)  # the window inside the padded input
    divisor = divisor_override or (padded if count_include_pad else inputs)
    attrs: Attrs = {**window, "count_include_pad": 1, **ceil}
    mean = t.emit1("AveragePool", [t.value(x)], attrs, dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Mul", [mean, t.initializer((padded / divisor).to(val.dtype), "pool_divisor")])


@handles(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool(t: Translator, node: Node, x: Node, output_size: Sequence[int]) -> ir.Value:
    shape = tuple(fake(x).shape)
    spatial = shape[-len(output_size) :]
    if all(o == 1 for o in output_size):
        axes = list(range(len(shape) - len(output_size), len(shape)))
        return t.out("ReduceMean", [t.value(x), t.ints(axes, "axes")], {"keepdims": 1})
    # ONNX pools take [N, C, *spatial]: an unbatched [C, H, W] would read as one spatial dim.
    if len(shape) == 2 + len(output_size) and all(s % o == 0 for s, o in zip(spatial, output_size, strict=True)):
        k = [s // o for s, o in zip(spatial, output_size, strict=True)]
        return t.out("AveragePool", [t.value(x)], {"kernel_shape": k, "strides": k})
    return _adaptive_avg_pool_2d_as_matmuls(t, node, x, spatial, output_size)


@handles(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool(t: Translator, node: Node, x: Node, output_size: Sequence[int]) -> tuple[ir.Value, None]:
    """The maxima over PyTorch's adaptive windows (``[floor(i*size/out), ceil((i+1)*size/out))``) with the indices
    unused, one spatial axis at a time (a maximum over a box is the maximum over its rows of the maxima over its
    columns): a ``Slice`` and a ``ReduceMax`` per window, joined by ``Concat``. Exact."""
    if not only_first_output_used(node):
        raise Declined("adaptive max pool with its indices used")
    val = node.meta["val"][0]
    dtype = val.dtype
    shape = list(fake(x).shape)
    out = t.value(x)
    for axis, n in zip(range(len(shape) - len(output_size), len(shape)), output_size, strict=True):
        size, parts = shape[axis], []
        shape[axis] = 1
        for i in range(n):
            start, end = (i * size) // n, -(-(i + 1) * size // n)
            window = t.emit1(
                "Slice",
                [out, t.ints([start], "starts"), t.ints([end], "ends"), t.ints([axis], "axes")],
                dtype=dtype,
                shape=tuple(end - start if d == axis else s for d, s in enumerate(shape)),
            )
            reduced = t.ints([axis], "axes")
            parts.append(t.emit1("ReduceMax", [window, reduced], {"keepdims": 1}, dtype=dtype, shape=tuple(shape)))
        shape[axis] = n
        out = parts[0] if n == 1 else t.emit1("Concat", parts, {"axis": axis}, dtype=dtype, shape=tuple(shape))
    return (out, None)


def window_means(size: int, out: int, dtype: torch.dtype) -> torch.Tensor:
    """``[out, size]``: row ``i`` averages PyTorch's adaptive window ``[floor(i*size/out), ceil((i+1)*size/out))``."""
    m = torch.zeros(out, size, dtype=torch.float64)
    for i in range(out):
        start, end = (i * size) // out, -(-(i + 1) * size // out)
        m[i, start:end] = 1.0 / (end - start)
    return m.to(dtype)


def _adaptive_avg_pool_2d_as_matmuls(
    t: Translator, node: Node, x: Node, spatial: Sequence[int], output_size: Sequence[int]
) -> ir.Value:
    """Overlapping or uneven windows (a size the output does not divide): ``P_h @ x @ P_w^T`` with constant
    averaging matrices, the windows PyTorch uses, where ONNX has no pooling and torch.onnx writes rank-6 Gathers."""
    (h, w), (oh, ow) = spatial, output_size
    dtype = node.meta["val"].dtype
    if not dtype.is_floating_point:
        raise Declined(f"adaptive average pool on {dtype}")
    cols = t.initializer(window_means(w, ow, dtype).T.contiguous(), "adaptive_cols")
    rows = t.initializer(window_means(h, oh, dtype), "adaptive_rows")
    lead = tuple(fake(x).shape)[:-2]
    across = t.emit1("MatMul", [t.value(x), cols], dtype=dtype, shape=(*lead, h, ow))
    return t.out("MatMul", [rows, across])


@handles(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss(
    t: Translator, node: Node, x: Node, target: Node, weight: Node | None, reduction: int, ignore_index: int
) -> tuple[ir.Value, None]:
    """``nll_loss`` (its output; ``total_weight`` unused) without a gather of runtime indices: the class axis
    compared with the target gives a one-hot mask, and ``-x[t] * w[t]`` is the masked sum over it (0 for an
    ignored target, which matches no class or is zeroed). ``reduction``: none, sum, or mean (the sum over the sum
    of the picked weights; NaN where every target is ignored, as in eager, written as a NaN constant that HTP holds
    beyond float16's range, so the backend computes that call in PyTorch)."""
    if not only_first_output_used(node):
        raise Declined(f"{node.target} with total_weight used")
    val = node.meta["val"][0]
    dtype = val.dtype
    shape = tuple(int(s) for s in fake(x).shape)
    if dtype not in (torch.float32, torch.float16) or fake(x).dtype != dtype or 0 in shape:
        raise Declined(f"{node.target} of {fake(x).dtype}{list(shape)}")
    if reduction not in (0, 1, 2):
        raise Declined(f"{node.target} with reduction {reduction}")
    axis = 0 if len(shape) == 1 else 1
    classes = shape[axis]
    rows = shape[:axis] + shape[axis + 1 :]  # the target's shape
    kept = tuple(1 if i == axis else s for i, s in enumerate(shape))
    on_axis = tuple(classes if i == axis else 1 for i in range(len(shape)))
    labels = t.emit1("Unsqueeze", [t.value(target), t.ints([axis], "axes")], dtype=fake(target).dtype, shape=kept)
    ids = t.initializer(torch.arange(classes, dtype=fake(target).dtype).reshape(on_axis), "nll_classes")
    hot = t.emit1("Equal", [labels, ids], dtype=torch.bool, shape=shape)
    zero = t.scalar(0.0, dtype)
    axes = t.ints([axis], "axes")

    def picked(values: ir.Value) -> ir.Value:
        masked = t.emit1("Where", [hot, values, zero], dtype=dtype, shape=shape)
        return t.emit1("ReduceSum", [masked, axes], {"keepdims": 0}, dtype=dtype, shape=rows)

    if weight is None:
        w_row = picked(t.scalar(1.0, dtype))
    else:
        w_row = picked(t.emit1("Reshape", [t.value(weight), t.ints(on_axis)], dtype=dtype, shape=on_axis))
    if 0 <= ignore_index < classes:  # an ignored class matches the mask: zero its rows
        ignored = t.emit1(
            "Equal", [t.value(target), t.scalar(ignore_index, fake(target).dtype)], dtype=torch.bool, shape=rows
        )
        w_row = t.emit1("Where", [ignored, zero, w_row], dtype=dtype, shape=rows)
    losses = t.emit1(
        "Neg", [t.emit1("Mul", [picked(t.value(x)), w_row], dtype=dtype, shape=rows)], dtype=dtype, shape=rows
    )
    if reduction == 0:
        return (losses, None)
    every = t.ints(list(range(len(rows))), "axes")
    total = t.emit1("ReduceSum", [losses, every], {"keepdims": 0}, dtype=dtype, shape=()) if rows else losses
    if reduction == 2:
        return (total, None)
    count = t.emit1("ReduceSum", [w_row, every], {"keepdims": 0}, dtype=dtype, shape=()) if rows else w_row
    none = t.emit1("Equal", [count, zero], dtype=torch.bool, shape=())
    mean = t.emit1("Div", [total, count], dtype=dtype, shape=())
    return (t.emit1("Where", [none, t.scalar(float("nan"), dtype), mean], dtype=dtype, shape=()), None)
