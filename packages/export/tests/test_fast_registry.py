"""The fast path's op registry: each registered ATen overload translates a small example that matches eager on
ORT's CPU EP, the examples cover exactly the registered overloads, and the table is built once, lazily."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import onnx_ir as ir
import pytest
import torch
import torch.fx
from export_qnn_helpers import cpu_session, rel_err
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import qnnx_export as qe
from qnnx_export import _fast
from qnnx_export._fast._registry import OP_MODULES, Registry

aten = torch.ops.aten

Make = Callable[[], torch.Tensor]


@attrs.frozen
class _Example:
    """``fn`` calls ATen overloads directly; its arguments are the runtime inputs, then the constants (weights)."""

    fn: Callable[..., Any]
    inputs: tuple[tuple[int, ...] | Make, ...]
    params: tuple[tuple[int, ...] | Make, ...] = ()

    def build(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The tensors (a shape is a randn tensor), made under a fixed seed."""
        torch.manual_seed(0)
        tensors = [torch.randn(*i) if isinstance(i, tuple) else i() for i in (*self.inputs, *self.params)]
        return tensors[: len(self.inputs)], tensors[len(self.inputs) :]


def _ex(
    fn: Callable[..., Any], *inputs: tuple[int, ...] | Make, params: Sequence[tuple[int, ...] | Make] = ()
) -> _Example:
    return _Example(fn, inputs, tuple(params))


def _ints(*shape: int, high: int = 4) -> Make:
    return lambda: torch.randint(0, high, shape)


def _bools(*shape: int) -> Make:
    return lambda: torch.rand(shape) > 0.5


def _unit(*shape: int) -> Callable[[], torch.Tensor]:
    """Values in (-1, 1), the domain of asin and acos."""
    return lambda: torch.rand(*shape) * 1.98 - 0.99


def _positive(*shape: int) -> Make:
    return lambda: torch.rand(shape) + 0.5


def _wide(*shape: int) -> Make:
    return lambda: torch.randn(shape) * 4


def _scalar() -> Make:
    """A 0-d float tensor (an endpoint)."""
    return lambda: torch.randn(())


def _int_scalar(v: int) -> Make:
    return lambda: torch.tensor(v)


def _sorted(*shape: int) -> Make:
    """Rows sorted along the last dim (a searchsorted sequence)."""
    return lambda: torch.randn(shape).sort(-1).values


def _items(seq: Any, n: int) -> tuple[Any, ...]:
    """The first ``n`` outputs of a multi-output op (``getitem`` nodes when traced)."""
    return tuple(seq[i] for i in range(n))


_X = (3, 4)
_NCHW = (2, 4, 6, 6)

# One example a registered overload (str(overload) -> example): adding a handler without an example fails
# test_examples_cover_exactly_the_registered_overloads.
EXAMPLES: dict[str, _Example] = {
    # binary elementwise
    "aten.add.Tensor": _ex(lambda x, y: aten.add.Tensor(x, y, alpha=2), _X, (4,)),
    "aten.add.Scalar": _ex(lambda x: aten.add.Scalar(x, 1.5), _X),
    "aten.sub.Tensor": _ex(lambda x, y: aten.sub.Tensor(x, y), _X, _X),
    "aten.sub.Scalar": _ex(lambda x: aten.sub.Scalar(x, 2), _ints(3, 4)),
    "aten.rsub.Scalar": _ex(lambda x: aten.rsub.Scalar(x, 2.0), _X),
    "aten.mul.Tensor": _ex(lambda i, x: aten.mul.Tensor(i, x), _ints(3, 4), _X),
    "aten.mul.Scalar": _ex(lambda x: aten.mul.Scalar(x, -3), _X),
    "aten.div.Tensor": _ex(lambda x, y: aten.div.Tensor(x, y), _X, _positive(3, 4)),
    "aten.div.Scalar": _ex(lambda x: aten.div.Scalar(x, 4.0), _X),
    "aten.div.Tensor_mode": _ex(lambda x, y: aten.div.Tensor_mode(x, y, rounding_mode=None), _X, _positive(4)),
    "aten.floor_divide.default": _ex(
        lambda x, y: aten.floor_divide.default(x, y),
        lambda: torch.randint(-9, 10, (3, 4)),
        lambda: torch.tensor([3, -2, 4, -5]),
    ),
    "aten.fmax.default": _ex(lambda x, y: aten.fmax.default(x, y), _X, (1, 4)),
    "aten.fmin.default": _ex(lambda x, y: aten.fmin.default(x, y), _X, _X),
    "aten.hypot.default": _ex(lambda x, y: aten.hypot.default(x, y), _X, (1, 4)),
    "aten.maximum.default": _ex(lambda x, y: aten.maximum.default(x, y), _X, _X),
    "aten.minimum.default": _ex(lambda x, y: aten.minimum.default(x, y), _X, (1, 4)),
    "aten.pow.Tensor_Scalar": _ex(
        lambda x: (aten.pow.Tensor_Scalar(x, 2), aten.pow.Tensor_Scalar(x, 1.5)), _positive(3, 4)
    ),
    "aten.pow.Tensor_Tensor": _ex(lambda x, y: aten.pow.Tensor_Tensor(x, y), _positive(3, 4), _X),
    "aten.eq.Tensor": _ex(lambda i, j: aten.eq.Tensor(i, j), _ints(3, 4), _ints(3, 4)),
    "aten.eq.Scalar": _ex(lambda i: aten.eq.Scalar(i, 2), _ints(3, 4)),
    "aten.ne.Tensor": _ex(lambda i, j: aten.ne.Tensor(i, j), _ints(3, 4), _ints(4)),
    "aten.ne.Scalar": _ex(lambda b: aten.ne.Scalar(b, True), _bools(3, 4)),
    "aten.lt.Tensor": _ex(lambda x, y: aten.lt.Tensor(x, y), _X, _X),
    "aten.lt.Scalar": _ex(lambda x: aten.lt.Scalar(x, 0.1), _X),
    "aten.le.Tensor": _ex(lambda i, x: aten.le.Tensor(i, x), _ints(3, 4), _X),
    "aten.le.Scalar": _ex(lambda i: aten.le.Scalar(i, 1), _ints(3, 4)),
    "aten.gt.Tensor": _ex(lambda x, y: aten.gt.Tensor(x, y), _X, (4,)),
    "aten.gt.Scalar": _ex(lambda x: aten.gt.Scalar(x, 0), _X),
    "aten.ge.Tensor": _ex(lambda x, y: aten.ge.Tensor(x, y), _X, _X),
    "aten.ge.Scalar": _ex(lambda x: aten.ge.Scalar(x, -0.2), _X),
    "aten.logical_and.default": _ex(lambda a, b: aten.logical_and.default(a, b), _bools(3, 4), _ints(3, 4, high=2)),
    "aten.logical_or.default": _ex(lambda a, b: aten.logical_or.default(a, b), _bools(3, 4), _bools(4)),
    "aten.logical_xor.default": _ex(lambda a, b: aten.logical_xor.default(a, b), _X, _bools(3, 4)),
    "aten.logical_not.default": _ex(
        lambda a, b: (aten.logical_not.default(a), aten.logical_not.default(b)), _X, _bools(3, 4)
    ),
    "aten.copysign.Tensor": _ex(lambda x, y: aten.copysign.Tensor(x, y), _X, (4,)),
    "aten.copysign.Scalar": _ex(lambda x: aten.copysign.Scalar(x, -0.0), _X),
    "aten.adaptive_max_pool2d.default": _ex(lambda x: aten.adaptive_max_pool2d.default(x, [2, 3])[0], (1, 2, 5, 4)),
    "aten.diagonal_scatter.default": _ex(lambda x, s: aten.diagonal_scatter.default(x, s, 1, 2, 0), (4, 2, 3), (2, 3)),
    "aten.as_strided_scatter.default": _ex(
        lambda x, s: aten.as_strided_scatter.default(x, s, [2, 2], [3, 1], 1), (3, 4), (2, 2)
    ),
    "aten.all.default": _ex(lambda x: aten.all.default(x), _ints(3, 4, high=2)),
    "aten.all.dim": _ex(lambda x: aten.all.dim(x, 1, True), (3, 4)),
    "aten.all.dims": _ex(lambda b: aten.all.dims(b, [0, 1]), _bools(3, 4)),
    "aten.any.default": _ex(lambda b: aten.any.default(b), _bools(3, 4)),
    "aten.any.dim": _ex(lambda i: aten.any.dim(i, 0), _ints(3, 4, high=2)),
    "aten.any.dims": _ex(lambda x: aten.any.dims(x, None, True), (3, 4)),
    "aten.bitwise_and.Tensor": _ex(lambda a, b: aten.bitwise_and.Tensor(a, b), _bools(3, 4), _bools(3, 4)),
    "aten.bitwise_or.Tensor": _ex(lambda a, b: aten.bitwise_or.Tensor(a, b), _bools(3, 4), _bools(3, 4)),
    "aten.bitwise_xor.Tensor": _ex(lambda a, b: aten.bitwise_xor.Tensor(a, b), _bools(3, 4), _bools(3, 4)),
    "aten.bitwise_not.default": _ex(lambda a: aten.bitwise_not.default(a), _bools(3, 4)),
    "aten.where.self": _ex(lambda c, x, y: aten.where.self(c, x, y), _bools(3, 4), _X, (4,)),
    "aten.masked_fill.Scalar": _ex(lambda x, m: aten.masked_fill.Scalar(x, m, -2.0), _X, _bools(3, 4)),
    "aten.masked_fill.Tensor": _ex(
        lambda x, m, v: aten.masked_fill.Tensor(x, m, v), _X, _bools(4), lambda: torch.tensor(7.0)
    ),
    "aten.clamp.Tensor": _ex(lambda x, lo, hi: aten.clamp.Tensor(x, lo, hi), _X, (4,), lambda: torch.tensor(0.5)),
    "aten.clamp_min.Tensor": _ex(lambda x, lo: aten.clamp_min.Tensor(x, lo), _X, lambda: torch.tensor(0.1)),
    "aten.clamp_max.Tensor": _ex(lambda x, hi: aten.clamp_max.Tensor(x, hi), (4,), _X),
    "aten.triu.default": _ex(lambda x: (aten.triu.default(x), aten.triu.default(x, -1)), (2, 3, 5)),
    "aten.tril.default": _ex(lambda x: (aten.tril.default(x), aten.tril.default(x, 2)), (2, 5, 3)),
    # unary elementwise
    "aten.relu.default": _ex(lambda x: aten.relu.default(x), _X),
    "aten.neg.default": _ex(lambda i: aten.neg.default(i), _ints(3, 4)),
    "aten.abs.default": _ex(lambda x: aten.abs.default(x), _X),
    "aten.sigmoid.default": _ex(lambda x: aten.sigmoid.default(x), _X),
    "aten.tanh.default": _ex(lambda x: aten.tanh.default(x), _X),
    "aten.exp.default": _ex(lambda x: aten.exp.default(x), _X),
    "aten.expm1.default": _ex(lambda x: aten.expm1.default(x), _X),
    "aten.softplus.default": _ex(lambda x: aten.softplus.default(x, 2.0, 20.0), _X),
    "aten.log.default": _ex(lambda x: aten.log.default(x), _positive(3, 4)),
    "aten.sqrt.default": _ex(lambda x: aten.sqrt.default(x), _positive(3, 4)),
    "aten.rsqrt.default": _ex(lambda x: aten.rsqrt.default(x), _positive(3, 4)),
    "aten.reciprocal.default": _ex(lambda x: aten.reciprocal.default(x), _positive(3, 4)),
    "aten.sin.default": _ex(lambda x: aten.sin.default(x), _X),
    "aten.cos.default": _ex(lambda x: aten.cos.default(x), _X),
    "aten.erf.default": _ex(lambda i: aten.erf.default(i), _ints(3, 4)),
    "aten.asin.default": _ex(lambda x: aten.asin.default(x), _unit(3, 4)),
    "aten.acos.default": _ex(lambda x: aten.acos.default(x), _unit(3, 4)),
    "aten.atan.default": _ex(lambda x: aten.atan.default(x), _X),
    "aten.floor.default": _ex(lambda x: aten.floor.default(x), _wide(3, 4)),
    "aten.ceil.default": _ex(lambda x: aten.ceil.default(x), _wide(3, 4)),
    "aten.clamp.default": _ex(lambda x: aten.clamp.default(x, -0.5, 0.75), _X),
    "aten.clamp_min.default": _ex(lambda x: aten.clamp_min.default(x, 0.1), _X),
    "aten.clamp_max.default": _ex(lambda i: aten.clamp_max.default(i, 2), _ints(3, 4)),
    "aten.hardtanh.default": _ex(lambda x: aten.hardtanh.default(x, -0.3, 0.6), _X),
    "aten.gelu.default": _ex(lambda x: (aten.gelu.default(x), aten.gelu.default(x, approximate="tanh")), _X),
    "aten.silu.default": _ex(lambda x: aten.silu.default(x), _X),
    "aten.leaky_relu.default": _ex(lambda x: aten.leaky_relu.default(x, 0.2), _X),
    "aten.hardsigmoid.default": _ex(lambda x: aten.hardsigmoid.default(x), _wide(3, 4)),
    "aten.hardswish.default": _ex(lambda x: aten.hardswish.default(x), _wide(3, 4)),
    "aten.elu.default": _ex(lambda x: aten.elu.default(x, 0.7), _X),
    "aten.celu.default": _ex(lambda x: aten.celu.default(x, 0.6), _X),
    "aten.log_sigmoid_forward.default": _ex(lambda x: aten.log_sigmoid_forward.default(x)[0], _wide(3, 4)),
    # reductions
    "aten.mean.dim": _ex(lambda x: aten.mean.dim(x, [-1], True), (2, 3, 4)),
    "aten.mean.default": _ex(lambda x: aten.mean.default(x), (2, 3, 4)),
    "aten.sum.dim_IntList": _ex(lambda b: aten.sum.dim_IntList(b, [0, 2]), _bools(2, 3, 4)),
    "aten.sum.default": _ex(lambda i: aten.sum.default(i), _ints(2, 3, 4)),
    "aten.amax.default": _ex(lambda x: aten.amax.default(x, [1]), (2, 3, 4)),
    "aten.amin.default": _ex(lambda i: aten.amin.default(i, [0], True), _ints(2, 3, 4)),
    "aten.linalg_vector_norm.default": _ex(
        lambda x, z: (
            aten.linalg_vector_norm.default(x),
            aten.linalg_vector_norm.default(x, 1, [1], True),
            aten.linalg_vector_norm.default(x, float("inf"), [0, 2]),
            aten.linalg_vector_norm.default(x, float("-inf"), [-1]),
            aten.linalg_vector_norm.default(z, 0, [1]),
            aten.linalg_vector_norm.default(z, 3.5, [1, 2], dtype=torch.float32),
            aten.linalg_vector_norm.default(aten.unsqueeze.default(aten.unsqueeze.default(x, 1), 3), 2, [2, 4]),
        ),
        (2, 3, 4),
        lambda: torch.randn(2, 3, 4) * (torch.arange(3) != 1)[None, :, None],
    ),
    "aten._softmax.default": _ex(lambda x: aten._softmax.default(x, 1, False), (2, 3, 4)),
    "aten._log_softmax.default": _ex(lambda x: aten._log_softmax.default(x, -1, False), (2, 3, 4)),
    "aten.logsumexp.default": _ex(
        lambda x: (aten.logsumexp.default(x, [1]), aten.logsumexp.default(x, [0, -1], True)), (2, 3, 4)
    ),
    "aten._safe_softmax.default": _ex(
        lambda x, m: aten._safe_softmax.default(aten.masked_fill.Scalar(x, m, float("-inf")), -1),
        (2, 3, 4),
        lambda: torch.tensor([True, False, False])[None, :, None].expand(2, 3, 4).contiguous(),
    ),
    # layout
    "aten.view.default": _ex(lambda x: aten.view.default(x, [4, 3]), _X),
    "aten._unsafe_view.default": _ex(lambda x: aten._unsafe_view.default(x, [12]), _X),
    "aten.reshape.default": _ex(lambda x: aten.reshape.default(x, [2, 6]), _X),
    "aten.unsqueeze.default": _ex(lambda x: aten.unsqueeze.default(x, -1), _X),
    "aten.squeeze.dim": _ex(lambda x: aten.squeeze.dim(x, 1), (3, 1, 4)),
    "aten.squeeze.dims": _ex(lambda x: aten.squeeze.dims(x, [0, 2]), (1, 3, 1, 4)),
    "aten.squeeze.default": _ex(lambda x: aten.squeeze.default(x), (1, 3, 1, 4)),
    "aten.flatten.using_ints": _ex(lambda x: aten.flatten.using_ints(x, 1, 2), (2, 3, 4)),
    "aten.t.default": _ex(lambda x: aten.t.default(x), _X),
    "aten.transpose.int": _ex(lambda x: aten.transpose.int(x, 0, -1), (2, 3, 4)),
    "aten.permute.default": _ex(lambda x: aten.permute.default(x, [2, 0, 1]), (2, 3, 4)),
    "aten.as_strided.default": _ex(lambda x: aten.as_strided.default(x, [2, 1, 6], [6, 1, 1]), _X),
    # how adaptive_avg_pool2d to 1x1 restrides its mean in place (the channels-last strides of a [N, C, 1, 1] tensor)
    "aten.as_strided_.default": _ex(
        lambda x: aten.as_strided_.default(aten.mean.dim(x, [-1, -2], True), [2, 4, 1, 1], [4, 1, 4, 4]), (2, 4, 3, 3)
    ),
    "aten.expand.default": _ex(lambda x: aten.expand.default(x, [3, 4, 5]), (1, 4, 1)),
    "aten.repeat.default": _ex(lambda x: aten.repeat.default(x, [2, 1, 3, 2]), (3, 1, 4)),
    "aten.slice.Tensor": _ex(lambda x: aten.slice.Tensor(x, 1, 1, 9, 3), (3, 10)),
    "aten.unfold.default": _ex(
        lambda x, i: (
            aten.unfold.default(x, 1, 3, 2),
            aten.unfold.default(x, -1, 2, 1),
            aten.unfold.default(i, 0, 2, 3),
        ),
        (2, 7, 4),
        _ints(8, 2),
    ),
    "aten.unfold_copy.default": _ex(lambda x: aten.unfold_copy.default(x, 0, 2, 2), (5, 3)),
    "aten.roll.default": _ex(lambda x: aten.roll.default(x, [1, -3], [0, 1]), _X),
    "aten.cat.default": _ex(lambda x, i: aten.cat.default([x, i, x], 1), (2, 3), _ints(2, 4)),
    "aten.stack.default": _ex(lambda x, y: aten.stack.default([x, y, x], -2), (2, 3), (2, 3)),
    "aten.split.Tensor": _ex(lambda x: _items(aten.split.Tensor(x, 2, 1), 3), (2, 5)),
    "aten.split_with_sizes.default": _ex(lambda x: _items(aten.split_with_sizes.default(x, [1, 3], -1), 2), _X),
    "aten.unsafe_split.Tensor": _ex(lambda x: _items(aten.unsafe_split.Tensor(x, 3, 0), 1), _X),
    "aten.unsafe_split_with_sizes.default": _ex(
        lambda x: _items(aten.unsafe_split_with_sizes.default(x, [2, 1], 0), 2), _X
    ),
    "aten.unbind.int": _ex(lambda x: _items(aten.unbind.int(x, 1), 3), (2, 3, 4)),
    "aten.constant_pad_nd.default": _ex(lambda x: aten.constant_pad_nd.default(x, [1, 2, 0, 3], 0.5), (1, 2, 3, 4)),
    "aten.replication_pad1d.default": _ex(lambda x: aten.replication_pad1d.default(x, [2, -1]), (2, 3, 4)),
    "aten.replication_pad2d.default": _ex(lambda x: aten.replication_pad2d.default(x, [1, 2, 0, 3]), (1, 2, 3, 4)),
    "aten.replication_pad3d.default": _ex(
        lambda x: aten.replication_pad3d.default(x, [1, 0, 2, 1, 0, 1]), (1, 2, 3, 4, 2)
    ),
    "aten.cumprod.default": _ex(lambda x: aten.cumprod.default(x, 1), (2, 5, 3)),
    "aten.prod.default": _ex(lambda x: aten.prod.default(x), _positive(2, 3)),
    "aten.prod.dim_int": _ex(lambda x: aten.prod.dim_int(x, 1, True), _positive(2, 5, 3)),
    "aten._cdist_forward.default": _ex(lambda a, b: aten._cdist_forward.default(a, b, 1.5, None), (2, 5, 3), (4, 3)),
    "aten._pdist_forward.default": _ex(lambda x: aten._pdist_forward.default(x, 2.0), (5, 3)),
    "aten.logcumsumexp.default": _ex(lambda x: aten.logcumsumexp.default(x, 1), (2, 5, 3)),
    "aten.aminmax.default": _ex(lambda x: (aten.aminmax.default(x)[0], aten.aminmax.default(x, dim=1)[1]), (2, 5, 3)),
    # indexing
    "aten.select.int": _ex(lambda x: aten.select.int(x, 1, -1), _X),
    "aten.embedding.default": _ex(lambda i, w: aten.embedding.default(w, i), _ints(2, 5, high=10), params=[(10, 4)]),
    "aten._embedding_bag_forward_only.default": _ex(
        lambda i, o, w: aten._embedding_bag_forward_only.default(w, i, o, False, 1)[0],
        _ints(7, high=10),
        lambda: torch.tensor([0, 2, 2, 5]),
        params=[(10, 4)],
    ),
    "aten._embedding_bag.default": _ex(
        lambda i, o, w: aten._embedding_bag.default(w, i, o, False, 2, False, None, True)[0],
        _ints(7, high=10),
        lambda: torch.tensor([0, 3, 7]),
        params=[(10, 4)],
    ),
    "aten.gather.default": _ex(lambda x, i: aten.gather.default(x, 1, i), (3, 6), _ints(3, 4, high=6)),
    "aten.index_select.default": _ex(lambda x, i: aten.index_select.default(x, 1, i), (3, 6), _ints(4, high=6)),
    "aten.index.Tensor": _ex(lambda x, i: aten.index.Tensor(x, [None, i]), (3, 6), _ints(2, 2, high=6)),
    # KV-cache writes: distinct positions (duplicates are undefined in PyTorch too)
    "aten.median.default": _ex(lambda x: aten.median.default(x), (3, 5)),
    "aten.median.dim": _ex(lambda x: (*_items(aten.median.dim(x, 1), 2), aten.median.dim(x, 0)[0]), (3, 1)),
    "aten.nanmedian.default": _ex(lambda x: aten.nanmedian.default(x), (1, 1)),
    "aten.max.dim": _ex(lambda x: _items(aten.max.dim(x, 1), 2), _X),
    "aten.min.dim": _ex(lambda x: _items(aten.min.dim(x, 0, True), 2), _X),
    "aten.max.default": _ex(lambda x: aten.max.default(x), _X),
    "aten.min.default": _ex(lambda x: aten.min.default(x), _X),
    "aten.argmax.default": _ex(lambda x: (aten.argmax.default(x), aten.argmax.default(x, 1, True)), _X),
    "aten.argmin.default": _ex(lambda x: (aten.argmin.default(x), aten.argmin.default(x, 0)), _X),
    # expert counts: integer ids converted to float
    "aten.linspace.Tensor_Tensor": _ex(lambda s, e: aten.linspace.Tensor_Tensor(s, e, 7), _scalar(), _int_scalar(5)),
    "aten.linspace.Tensor_Scalar": _ex(lambda s: aten.linspace.Tensor_Scalar(s, 2.5, 6), _scalar()),
    "aten.linspace.Scalar_Tensor": _ex(lambda e: aten.linspace.Scalar_Tensor(-1, e, 1), _scalar()),
    "aten.logspace.Tensor_Tensor": _ex(lambda s, e: aten.logspace.Tensor_Tensor(s, e, 5, 2.0), _scalar(), _scalar()),
    "aten.logspace.Tensor_Scalar": _ex(lambda s: aten.logspace.Tensor_Scalar(s, 1.5, 3, 3.0), _int_scalar(-1)),
    "aten.logspace.Scalar_Tensor": _ex(lambda e: aten.logspace.Scalar_Tensor(0, e, 2), _scalar()),
    "aten.searchsorted.Tensor": _ex(
        lambda s, v: (aten.searchsorted.Tensor(s, v), aten.searchsorted.Tensor(s, v, out_int32=True, right=True)),
        _sorted(3, 7),
        (3, 4),
    ),
    "aten.searchsorted.Scalar": _ex(lambda s: aten.searchsorted.Scalar(s, 0.25, side="right"), _sorted(9)),
    "aten.bucketize.Tensor": _ex(lambda v, b: aten.bucketize.Tensor(v, b, right=True), (2, 3, 4), _sorted(5)),
    "aten.bucketize.Scalar": _ex(lambda b: aten.bucketize.Scalar(-0.5, b, out_int32=True), _sorted(6)),
    "aten.segment_reduce.default": _ex(
        lambda d, n: aten.segment_reduce.default(d, "max", lengths=n, axis=0, initial=0.5),
        (6, 3),
        lambda: torch.tensor([2, 0, 4]),
    ),
    "aten.squeeze_.dim": _ex(lambda x: aten.squeeze_.dim(aten.mul.Tensor(x, 2), 0), (1, 4)),
    "aten.squeeze_.dims": _ex(lambda x: aten.squeeze_.dims(aten.mul.Tensor(x, 2), [0, 2]), (1, 4, 1)),
    "aten.squeeze_.default": _ex(lambda x: aten.squeeze_.default(aten.mul.Tensor(x, 2)), (1, 4, 1)),
    "aten.unsqueeze_.default": _ex(lambda x: aten.unsqueeze_.default(aten.mul.Tensor(x, 2), 1), _X),
    "aten.t_.default": _ex(lambda x: aten.t_.default(aten.mul.Tensor(x, 2)), _X),
    "aten.transpose_.default": _ex(lambda x: aten.transpose_.default(aten.mul.Tensor(x, 2), 0, 2), (2, 3, 4)),
    "aten.dist.default": _ex(lambda x, y: (aten.dist.default(x, y), aten.dist.default(x, y, 3.0)), _X, (4,)),
    "aten.nonzero_static.default": _ex(
        lambda x: (aten.nonzero_static.default(x, size=4), aten.nonzero_static.default(x, size=9, fill_value=5)),
        _ints(2, 3, high=2),
    ),
    "aten.histc.default": _ex(
        lambda i: aten.histc.default(aten._to_copy.default(i, dtype=torch.float32), 3, 0, 4), _ints(10, high=6)
    ),
    "aten.scatter.value": _ex(lambda x, i: aten.scatter.value(x, 1, i, 1.5), (3, 6), _ints(3, 2, high=6)),
    "aten.scatter.src": _ex(lambda x, i, s: aten.scatter.src(x, 1, i, s), (3, 6), _ints(3, 4, high=6), (3, 5)),
    "aten.nanmedian.dim": _ex(lambda x: _items(aten.nanmedian.dim(x, 0, True), 2), (1, 4)),
    "aten.scatter_add.default": _ex(
        lambda x, i, s: aten.scatter_add.default(x, 1, i, s), (3, 6), _ints(2, 4, high=6), (3, 5)
    ),
    "aten.scatter_reduce.two": _ex(
        lambda x, i, s: aten.scatter_reduce.two(x, 0, i, s, "mean", include_self=False), (4, 3), _ints(5, 3), (5, 3)
    ),
    "aten.scatter.reduce": _ex(
        lambda x, i, s: aten.scatter.reduce(x, 0, i, s, reduce="add"), (4, 3), _ints(2, 3), (2, 3)
    ),
    "aten.index_reduce.default": _ex(
        lambda x, i, s: aten.index_reduce.default(x, 1, i, s, "amax", include_self=False),
        (2, 6, 3),
        _ints(4, high=6),
        (2, 4, 3),
    ),
    "aten.index_copy.default": _ex(
        lambda x, i, s: aten.index_copy.default(x, 1, i, s), (2, 6, 3), lambda: torch.randperm(6)[:2], (2, 2, 3)
    ),
    "aten.copy.default": _ex(lambda x, s: aten.copy.default(x, s), (3, 6), (1, 6)),
    "aten.fill.Scalar": _ex(lambda x: aten.fill.Scalar(x, 2.5), (3, 6)),
    "aten.fill.Tensor": _ex(lambda x, v: aten.fill.Tensor(x, v), (3, 6), lambda: torch.tensor(1.5)),
    "aten.slice_scatter.default": _ex(
        lambda x, s: (aten.slice_scatter.default(x, s, 1, 1, 3), aten.slice_scatter.default(x, s, 1, -2)),
        (3, 4),
        (3, 2),
    ),
    "aten.select_scatter.default": _ex(lambda x, s: aten.select_scatter.default(x, s, 0, -1), (3, 4), (4,)),
    "aten.index_put.default": _ex(
        lambda x, i, j, row, v, m: (
            aten.index_put.default(x, [i], row),
            aten.index_put.default(x, [i, j], v),
            aten.index_put.default(x, [m], row),
        ),
        (5, 4),
        lambda: torch.tensor([3, -1]),
        lambda: torch.tensor([0, 2]),
        (4,),
        lambda: torch.tensor(0.5),
        lambda: torch.tensor([True, False, False, True, True]),
    ),
    # matrix products
    "aten.mm.default": _ex(lambda a, b: aten.mm.default(a, b), _X, (4, 5)),
    "aten.bmm.default": _ex(lambda a, b: aten.bmm.default(a, b), (2, 3, 4), (2, 4, 5)),
    "aten.addmm.default": _ex(
        lambda x, bias, w: aten.addmm.default(bias, x, aten.t.default(w)), _X, params=[(5,), (5, 4)]
    ),
    "aten.baddbmm.default": _ex(
        lambda bias, a, b: aten.baddbmm.default(bias, a, b, beta=1.0, alpha=0.25), (2, 1, 5), (2, 3, 4), (2, 4, 5)
    ),
    # nn
    "aten.convolution.default": _ex(
        lambda x, w, b: aten.convolution.default(x, w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], 2),
        _NCHW,
        params=[(6, 2, 3, 3), (6,)],
    ),
    "aten.native_batch_norm.default": _ex(
        lambda x, w, b, mean, var: aten.native_batch_norm.default(x, w, b, mean, var, False, 0.1, 1e-5)[0],
        _NCHW,
        params=[(4,), (4,), (4,), _positive(4)],
    ),
    "aten.native_layer_norm.default": _ex(
        lambda x, w, b: aten.native_layer_norm.default(x, [4], w, b, 1e-5)[0], (2, 3, 4), params=[(4,), (4,)]
    ),
    "aten.native_group_norm.default": _ex(
        lambda x, w, b: aten.native_group_norm.default(x, w, b, 2, 6, 15, 3, 1e-5)[0], (2, 6, 3, 5), params=[(6,), (6,)]
    ),
    "aten.nll_loss_forward.default": _ex(
        lambda x, i, w: (
            aten.nll_loss_forward.default(x, i, None, 1, -100)[0],
            aten.nll_loss_forward.default(x, i, w, 0, 2)[0],
            aten.nll_loss_forward.default(x, i, w, 2, -100)[0],
            aten.nll_loss_forward.default(aten.select.int(x, 0, 0), aten.select.int(i, 0, 1), w, 1, -100)[0],
        ),
        _X,
        _ints(3),
        params=[_positive(4)],
    ),
    "aten.nll_loss2d_forward.default": _ex(
        lambda x, i: (
            aten.nll_loss2d_forward.default(x, i, None, 0, 1)[0],
            aten.nll_loss2d_forward.default(x, i, None, 1, -100)[0],
        ),
        (2, 3, 4, 5),
        _ints(2, 4, 5, high=3),
    ),
    "aten.im2col.default": _ex(lambda x: aten.im2col.default(x, [2, 3], [1, 1], [0, 0], [2, 3]), (2, 3, 4, 9)),
    "aten.col2im.default": _ex(lambda x: aten.col2im.default(x, [4, 9], [2, 3], [1, 1], [0, 0], [2, 3]), (2, 18, 6)),
    "aten.max_pool2d_with_indices.default": _ex(
        lambda x: (
            aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0],
            *_items(aten.max_pool2d_with_indices.default(x, [2, 2], [1, 1], [1, 1], [2, 2], True), 2),
        ),
        _NCHW,
    ),
    "aten.max_pool3d_with_indices.default": _ex(
        lambda x: (
            aten.max_pool3d_with_indices.default(x, [2, 2, 2], [2, 2, 2])[0],
            *_items(
                aten.max_pool3d_with_indices.default(
                    aten.select.int(x, 0, 0), [3, 2, 2], [1, 2, 2], [1, 1, 0], [1, 1, 2], True
                ),
                2,
            ),
        ),
        (2, 3, 5, 6, 6),
    ),
    "aten.max_unpool2d.default": _ex(
        lambda x: aten.max_unpool2d.default(
            *_items(aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2]), 2), [6, 6]
        ),
        _NCHW,
    ),
    "aten.max_unpool3d.default": _ex(
        lambda x: aten.max_unpool3d.default(
            *_items(aten.max_pool3d_with_indices.default(x, [2, 2, 2], [2, 2, 2]), 2), [4, 6, 6], [2, 2, 2], [0, 0, 0]
        ),
        (3, 4, 6, 6),
    ),
    "aten.max_pool2d.default": _ex(lambda x: aten.max_pool2d.default(x, [2, 2]), _NCHW),
    "aten.avg_pool2d.default": _ex(
        lambda x: (
            aten.avg_pool2d.default(x, [3, 3], [2, 2], [1, 1], False, False),
            aten.avg_pool2d.default(x, [4, 4], [2, 3], [1, 1], True, False, 2),
        ),
        _NCHW,
    ),
    "aten.avg_pool3d.default": _ex(
        lambda x: (
            aten.avg_pool3d.default(x, [2, 3, 2], [1, 2, 2], [0, 1, 1], True, True),
            aten.avg_pool3d.default(x, [2, 2, 2], [], 0, False, True, 3),
        ),
        (1, 2, 4, 5, 5),
    ),
    "aten._adaptive_avg_pool2d.default": _ex(
        lambda x: (aten._adaptive_avg_pool2d.default(x, [2, 3]), aten._adaptive_avg_pool2d.default(x, [3, 4])), _NCHW
    ),
    "aten._adaptive_avg_pool3d.default": _ex(
        lambda x: (aten._adaptive_avg_pool3d.default(x, [2, 3, 1]), aten._adaptive_avg_pool3d.default(x, [1, 1, 1])),
        (2, 3, 5, 4, 3),
    ),
    "aten.upsample_trilinear3d.default": _ex(
        lambda x: (
            aten.upsample_trilinear3d.default(x, [4, 3, 5], False),
            aten.upsample_trilinear3d.default(x, [6, 2, 4], True, 2.0, 0.5, 1.7),
        ),
        (1, 2, 3, 4, 2),
    ),
    "aten._upsample_bilinear2d_aa.default": _ex(
        lambda x: (
            aten._upsample_bilinear2d_aa.default(x, [3, 4], False),
            aten._upsample_bilinear2d_aa.default(x, [7, 2], True, 1.2, 0.3),
        ),
        (1, 2, 6, 9),
    ),
    "aten.upsample_nearest1d.default": _ex(
        lambda x: (aten.upsample_nearest1d.default(x, [7]), aten.upsample_nearest1d.default(x, [3], 0.7)), (2, 3, 5)
    ),
    # copies, casts, constants
    "aten.clone.default": _ex(lambda x: aten.clone.default(x), _X),
    "aten.alias.default": _ex(lambda x: aten.alias.default(x), _X),
    "aten.detach.default": _ex(lambda x: aten.detach.default(x), _X),
    "aten.lift_fresh_copy.default": _ex(lambda x: aten.lift_fresh_copy.default(x), _X),
    "aten._to_copy.default": _ex(lambda x: aten._to_copy.default(x, dtype=torch.float16), _X),
    "aten.zeros_like.default": _ex(lambda x: aten.zeros_like.default(x), _X),
    "aten.ones_like.default": _ex(lambda i: aten.ones_like.default(i), _ints(3, 4)),
    "aten.full_like.default": _ex(lambda x: aten.full_like.default(x, 2.5), _X),
    "aten.new_zeros.default": _ex(lambda x: aten.add.Tensor(x, aten.new_zeros.default(x, [4])), _X),
    "aten.new_ones.default": _ex(lambda x: aten.add.Tensor(x, aten.new_ones.default(x, [1, 4])), _X),
    "aten.new_full.default": _ex(lambda x: aten.mul.Tensor(x, aten.new_full.default(x, [3, 1], -1.5)), _X),
    # every position of the uninitialized tensor written
    "aten.new_empty.default": _ex(lambda x: aten.copy.default(aten.new_empty.default(x, [3, 4]), x), _X),
    # every position of the uninitialized tensor written (how transformers inverts a permutation)
    "aten.empty_like.default": _ex(
        lambda p, r: aten.index_put.default(aten.empty_like.default(p), [p], r),
        lambda: torch.randperm(6),
        lambda: torch.arange(6) * 3,
    ),
    # scans and orderings (distinct values: the order of equal ones is not promised)
    "aten.cumsum.default": _ex(
        lambda x, i: (aten.cumsum.default(x, 1), aten.cumsum.default(i, 0, dtype=torch.int32)), _X, _ints(5)
    ),
    "aten.topk.default": _ex(
        lambda x: (*_items(aten.topk.default(x, 2), 2), *_items(aten.topk.default(x, 2, 0, False), 2)), _X
    ),
    "aten.sort.default": _ex(
        lambda x, p: (*_items(aten.sort.default(x, 0, True), 2), *_items(aten.sort.default(p), 2)),
        _X,
        lambda: torch.randperm(7),
    ),
}


@pytest.fixture
def translated_overloads(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The overloads whose handler the fast path calls while the test runs."""
    seen: set[str] = set()
    table = _fast._op_table()

    def recording(op: Any, handler: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.add(str(op))
            return handler(*args, **kwargs)

        return call

    handlers = {op: recording(op, handler) for op, handler in table.handlers.items()}
    monkeypatch.setattr(_fast, "_op_table", lambda: attrs.evolve(table, handlers=handlers))
    return seen


def _aten_graph(example: _Example, inputs: list[torch.Tensor], params: list[torch.Tensor]) -> torch.fx.GraphModule:
    """``example.fn`` as an ATen graph returning a tuple, each node's fake value in ``meta["val"]``."""
    gm = torch.fx.symbolic_trace(example.fn)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(output.args[0], tuple):
        output.args = ((output.args[0],),)
    gm.recompile()
    FakeTensorProp(gm, FakeTensorMode()).propagate(*inputs, *params)
    return gm


@pytest.mark.parametrize("overload", sorted(EXAMPLES))
def test_registered_overload_translates_and_matches_eager(overload: str, translated_overloads: set[str]) -> None:
    """The overload's handler writes ONNX that ORT's CPU EP runs to eager's dtypes, shapes and values."""
    example = EXAMPLES[overload]
    inputs, params = example.build()
    gm = _aten_graph(example, inputs, params)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    constants = {len(inputs) + i: p for i, p in enumerate(params)}
    model, _ = _fast.translate_aten(
        gm, constants, user_inputs=[(names[i], i) for i in range(len(inputs))], opset=qe.ExportOptions().opset
    )
    assert overload in translated_overloads
    outs = cpu_session(ir.to_proto(model).SerializeToString()).run(
        None, {name: x.numpy() for name, x in zip(names[: len(inputs)], inputs, strict=True)}
    )
    refs = example.fn(*inputs, *params)
    for out, ref in zip(outs, refs if isinstance(refs, tuple) else (refs,), strict=True):
        got = torch.from_numpy(np.asarray(out))
        assert (got.dtype, got.shape) == (ref.dtype, ref.shape)
        assert rel_err(got, ref) <= 1e-5 if ref.dtype.is_floating_point else torch.equal(got, ref)


def test_examples_cover_exactly_the_registered_overloads() -> None:
    """A handler registered without an example here, or an example of an overload nobody handles, fails."""
    registered = set(_fast.supported_ops())
    assert not registered - set(EXAMPLES), f"registered without an example: {sorted(registered - set(EXAMPLES))}"
    assert not set(EXAMPLES) - registered, f"examples of unregistered overloads: {sorted(set(EXAMPLES) - registered)}"


def test_every_op_module_is_in_the_table() -> None:
    """Each _ops_*.py module of the package is imported by the registry (its handlers would be missing otherwise)."""
    package = Path(_fast.__file__).parent
    assert {p.stem for p in package.glob("_ops_*.py")} == set(OP_MODULES)


def test_registry_is_built_once_for_concurrent_first_uses() -> None:
    """Eight threads asking a fresh registry for its table at once: one load, one table, every handler in it."""
    registry = Registry()
    loads: list[str] = []
    start = threading.Barrier(8)
    tables: list[Any] = []

    def load() -> None:
        loads.append(threading.current_thread().name)
        time.sleep(0.05)  # holds the others at the lock while the "modules" are imported
        registry.handles(aten.add.Tensor, aten.add.Scalar)(lambda t, node, a, b: None)
        registry.handles(aten.relu.default)(lambda t, node, x: None)

    def use() -> None:
        start.wait()
        tables.append(registry.table(load))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1
    assert len(tables) == 8 and all(table is tables[0] for table in tables)
    assert set(tables[0].handlers) == {aten.add.Tensor, aten.add.Scalar, aten.relu.default}


def test_an_overload_registered_twice_is_an_error() -> None:
    """Two handlers for one overload raise at registration (which one won would depend on the import order)."""

    def relu(t: Any, node: Any, x: Any) -> None: ...

    def other_relu(t: Any, node: Any, x: Any) -> None: ...

    registry = Registry()
    registry.handles(aten.relu.default)(relu)
    registry.handles(aten.relu.default)(relu)  # the same function: its module imported again after a failure
    with pytest.raises(RuntimeError, match=r"aten\.relu\.default has two handlers"):
        registry.handles(aten.relu.default)(other_relu)


def test_import_loads_no_op_module_until_first_use() -> None:
    """`import qnnx_export` imports neither torch nor an op module; the first fast_path_ops() imports them all."""
    script = (
        "import json, sys, qnnx_export\n"
        "before = sorted(m for m in sys.modules if m == 'torch' or m.startswith('qnnx_export._fast._ops'))\n"
        "n = len(qnnx_export.fast_path_ops())\n"
        "after = sorted(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('qnnx_export._fast._ops'))\n"
        "print(json.dumps([before, n, after]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, n, after = json.loads(proc.stdout)
    assert before == []
    assert n == len(EXAMPLES) and after == sorted(OP_MODULES)
