"""Resampling: interpolation (trilinear, antialiased bilinear, 1-d nearest) and 3-d adaptive average pooling.

Each of these computes every output as a weighted sum of inputs whose weights factor by axis, so it is written as
one constant ``[out, in]`` matrix per spatial axis, applied in turn by MatMuls of rank 3 at most (QNN's Resize is
wrong for every rank-5 linear mode and for many ratios, and declines antialiasing). The matrices come from
PyTorch's own kernels, run on the host on an identity in float64: the weights are PyTorch's, whatever its
coordinate rules (align_corners, given scales, the antialiasing filter). A nearest resample is a Gather of a
constant index, found the same way: exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake
from qnnx_export._fast._ops_nn import window_means
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

# The largest axis a resampling matrix is made for (its [out, in] constant grows with the product).
MAX_RESAMPLE_SIDE = 2048
# The most elements of the float64 probes an antialiased resample's matrices are read from ([h, 1, h, w]).
_MAX_PROBE_ELEMENTS = 1 << 22


def _apply_per_axis(t: Translator, node: Node, x: Node, matrices: Sequence[torch.Tensor]) -> ir.Value:
    """``x`` (``[*lead, s_1 .. s_k]``) with the ``[o_i, s_i]`` matrix ``matrices[i]`` applied along its spatial axis
    ``i``, the last axis first: ``[rows, s_k] @ M_k^T``, then ``M_i @ [rows, s_i, after]`` for each earlier one."""
    val = node.meta["val"]
    dtype = val.dtype
    if dtype not in (torch.float32, torch.float16) or fake(x).dtype != dtype:
        raise Declined(f"{node.target} of {fake(x).dtype}")
    shape = [int(s) for s in fake(x).shape]
    if 0 in shape:
        raise Declined(f"{node.target} of an empty tensor")
    k = len(matrices)
    lead, sides = shape[: len(shape) - k], shape[len(shape) - k :]
    if max(max(m.shape) for m in matrices) > MAX_RESAMPLE_SIDE:
        raise Declined(f"{node.target} of an axis over {MAX_RESAMPLE_SIDE}")
    current = list(sides)
    v = t.value(x)
    for i in reversed(range(k)):
        m = matrices[i]
        rows = math.prod(lead) * math.prod(current[:i])
        after = math.prod(current[i + 1 :])
        if after == 1:
            v = t.emit1("Reshape", [v, t.ints([rows, current[i]])], dtype=dtype, shape=(rows, current[i]))
            weights = t.initializer(m.T.contiguous().to(dtype), "resample_weights")
            v = t.emit1("MatMul", [v, weights], dtype=dtype, shape=(rows, m.shape[0]))
        else:
            flat = (rows, current[i], after)
            v = t.emit1("Reshape", [v, t.ints(flat)], dtype=dtype, shape=flat)
            weights = t.initializer(m.contiguous().to(dtype), "resample_weights")
            v = t.emit1("MatMul", [weights, v], dtype=dtype, shape=(rows, m.shape[0], after))
        current[i] = int(m.shape[0])
    return t.out("Reshape", [v, t.ints(tuple(val.shape))])


def _matrix(resample: Callable[[torch.Tensor], torch.Tensor], side: int) -> torch.Tensor:
    """The ``[out, side]`` matrix of a 1-d resample: ``resample`` of the identity laid out as ``[side, 1, side]``
    (batch = input position)."""
    eye = torch.eye(side, dtype=torch.float64)
    return resample(eye.reshape(side, 1, side)).reshape(side, -1).T


def _verified(
    matrices: Sequence[torch.Tensor], op: Callable[[torch.Tensor], torch.Tensor], sides: Sequence[int]
) -> None:
    """Decline unless applying ``matrices`` axis by axis gives ``op``'s output on a random ``[1, 1, *sides]``
    input, in float64 on the host (to 1e-9 of its scale): the weights must be PyTorch's."""
    probe = torch.rand((1, 1, *sides), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = op(probe)
    got = probe
    for axis, m in enumerate(matrices):
        got = torch.movedim(torch.movedim(got, 2 + axis, -1) @ m.T, -1, 2 + axis)
    if got.shape != want.shape or float((got - want).abs().max()) > 1e-9 * max(float(want.abs().max()), 1.0):
        raise Declined("its weights do not factor by axis here")


@handles(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(t: Translator, node: Node, x: Node, output_size: Sequence[int]) -> ir.Value:
    """``adaptive_avg_pool3d`` (batched or not): the mean over every spatial axis for a ``1 x 1 x 1`` output, else
    one averaging matrix per axis (row ``i`` averages PyTorch's window ``[floor(i*s/o), ceil((i+1)*s/o))``)."""
    sides = [int(s) for s in fake(x).shape[-3:]]
    if all(int(o) == 1 for o in output_size):
        rank = fake(x).dim()
        return t.out("ReduceMean", [t.value(x), t.ints(list(range(rank - 3, rank)), "axes")], {"keepdims": 1})
    matrices = [window_means(s, int(o), torch.float64) for s, o in zip(sides, output_size, strict=True)]
    _verified(matrices, lambda p: aten._adaptive_avg_pool3d.default(p, list(output_size)), sides)
    return _apply_per_axis(t, node, x, matrices)


@handles(aten.upsample_trilinear3d.default)
def _upsample_trilinear3d(
    t: Translator,
    node: Node,
    x: Node,
    output_size: Sequence[int],
    align_corners: bool,
    scales_d: float | None = None,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ir.Value:
    """Trilinear interpolation as three linear ones (its weights are the products of theirs), each axis's matrix
    PyTorch's ``upsample_linear1d`` of the identity with that axis's size and scale."""
    sides = [int(s) for s in fake(x).shape[-3:]]
    matrices = []
    for n, o, scale in zip(sides, output_size, (scales_d, scales_h, scales_w), strict=True):

        def linear(e: torch.Tensor, o: int = int(o), scale: float | None = scale) -> torch.Tensor:
            return aten.upsample_linear1d.default(e, [o], align_corners, scale)

        matrices.append(_matrix(linear, n))
    _verified(
        matrices,
        lambda p: aten.upsample_trilinear3d.default(p, list(output_size), align_corners, scales_d, scales_h, scales_w),
        sides,
    )
    return _apply_per_axis(t, node, x, matrices)


@handles(aten._upsample_bilinear2d_aa.default)
def _upsample_bilinear2d_aa(
    t: Translator,
    node: Node,
    x: Node,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ir.Value:
    """Antialiased bilinear resampling, which PyTorch computes as two separable passes. Each axis's matrix is read
    from the op on rows (columns) of ones, one per input position (the other pass keeps a constant row constant),
    and checked against the op on a random input."""
    h, w = (int(s) for s in fake(x).shape[-2:])
    if max(h, w) * h * w > _MAX_PROBE_ELEMENTS:
        raise Declined(f"antialiased resample of {h} x {w} (its weights are read from {max(h, w)} such images)")

    def op(e: torch.Tensor) -> torch.Tensor:
        return aten._upsample_bilinear2d_aa.default(e, list(output_size), align_corners, scales_h, scales_w)

    rows = op(torch.eye(h, dtype=torch.float64)[:, None, :, None].expand(h, 1, h, w).contiguous())
    columns = op(torch.eye(w, dtype=torch.float64)[:, None, None, :].expand(w, 1, h, w).contiguous())
    matrices = [rows[:, 0, :, 0].T, columns[:, 0, 0, :].T]
    _verified(matrices, op, (h, w))
    return _apply_per_axis(t, node, x, matrices)


@handles(aten.upsample_nearest1d.default)
def _upsample_nearest1d(
    t: Translator, node: Node, x: Node, output_size: Sequence[int], scales: float | None = None
) -> ir.Value:
    """1-d nearest resampling as a Gather along the last axis of the source positions PyTorch's own kernel picks
    (its output on ``0, 1, ..., n - 1`` in float32: PyTorch computes the positions of float32 and float16 inputs in
    float32, and a floor can change with the precision). Exact."""
    n = int(fake(x).shape[-1])
    if fake(x).dtype not in (torch.float32, torch.float16):
        raise Declined(f"upsample_nearest1d of {fake(x).dtype}")
    if n == 0 or 0 in fake(x).shape or n > MAX_RESAMPLE_SIDE:
        raise Declined(f"upsample_nearest1d of {tuple(fake(x).shape)}")
    positions = torch.arange(n, dtype=torch.float32).reshape(1, 1, n)
    index = aten.upsample_nearest1d.default(positions, list(output_size), scales).reshape(-1).to(torch.int64)
    return t.out("Gather", [t.value(x), t.initializer(index, "nearest_index")], {"axis": fake(x).dim() - 1})
