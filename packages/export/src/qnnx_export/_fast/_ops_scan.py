"""Running reductions whose every position needs the ones before it: ``logcumsumexp``, ``cummax``, ``cummin``.

Each is written over an ``[..., n, n]`` view of its axis with the constant lower-triangular mask ``j <= i``: the
row ``i`` holds the positions ``j`` a prefix reads, the others are masked out. ONNX has no running maximum, and
torch.onnx's ``logcumsumexp`` subtracts the maximum of the whole axis (its early positions then underflow in float16
on HTP: 1.4-3.1% off at OpInfo samples); the running maximum of each prefix keeps every exponent at most 0 and the
sum at least 1. The ``n x n`` view bounds the axis (``MAX_SCAN_LENGTH``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake, onnx_axis
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten

MAX_SCAN_LENGTH = 256
"""The longest axis a running reduction is written for (its ``[..., n, n]`` intermediate holds ``n`` times the
input's elements)."""

# Stands for "no value" in a masked running maximum: float16's lowest finite number (HTP has no infinities).
_LOWEST = -65504.0


class _Prefixes:
    """The input (rank 1 or more) moved to ``[..., n]`` (its axis last) and its views over ``[..., n_i, n_j]`` with
    ``j <= i``."""

    def __init__(self, t: Translator, node: Node, x: Node, dim: int) -> None:
        val = fake(x)
        if val.dtype not in (torch.float32, torch.float16):
            raise Declined(f"{node.target} of {val.dtype}")
        self.t, self.dtype, self.rank = t, val.dtype, val.dim()
        self.axis = onnx_axis(dim, self.rank)
        self.shape = tuple(int(s) for s in val.shape)
        self.n = self.shape[self.axis]
        if self.n > MAX_SCAN_LENGTH:
            raise Declined(f"{node.target} over {self.n} positions (up to {MAX_SCAN_LENGTH})")
        self.perm = [i for i in range(self.rank) if i != self.axis] + [self.axis]
        moved = t.value(x)
        if self.rank > 1 and self.axis != self.rank - 1:
            moved = t.emit1("Transpose", [moved], {"perm": self.perm}, dtype=self.dtype, shape=self.last_shape)
        self.moved = moved
        self.rows = (*self.last_shape, 1)  # [..., n_i, 1]
        self.square = (*self.last_shape, self.n)  # [..., n_i, n_j]
        # x_j for every row i: [..., 1, n_j], broadcast against the mask [n_i, n_j]
        self.columns = t.emit1(
            "Unsqueeze", [moved, t.ints([-2], "axes")], dtype=self.dtype, shape=(*self.last_shape[:-1], 1, self.n)
        )
        self.mask = t.initializer(torch.ones(self.n, self.n, dtype=torch.bool).tril(), "prefix_mask")

    @property
    def last_shape(self) -> tuple[int, ...]:
        """The input's shape with the axis moved last."""
        return tuple(self.shape[i] for i in self.perm)

    def masked(self, fill: float) -> ir.Value:
        """``x_j`` where ``j <= i``, else ``fill``: ``[..., n_i, n_j]``."""
        t = self.t
        return t.emit1(
            "Where", [self.mask, self.columns, t.scalar(fill, self.dtype)], dtype=self.dtype, shape=self.square
        )

    def running(self, op: str, fill: float) -> ir.Value:
        """The running ``op`` (ReduceMax, ReduceMin) of each prefix: ``[..., n_i, 1]``."""
        t = self.t
        return t.emit1(
            op, [self.masked(fill), t.ints([-1], "axes")], {"keepdims": 1}, dtype=self.dtype, shape=self.rows
        )

    def back(self, value: ir.Value, dtype: torch.dtype) -> ir.Value:
        """``value`` (``[..., n_i, 1]``) in the input's layout."""
        t = self.t
        squeezed = t.emit1("Squeeze", [value, t.ints([-1], "axes")], dtype=dtype, shape=self.last_shape)
        if self.axis == self.rank - 1:
            return squeezed
        inverse = [self.perm.index(i) for i in range(self.rank)]
        return t.emit1("Transpose", [squeezed], {"perm": inverse}, dtype=dtype, shape=self.shape)


@handles(aten.logcumsumexp.default)
def _logcumsumexp(t: Translator, node: Node, x: Node, dim: int) -> ir.Value:
    """``log(sum_{j <= i} exp(x_j))`` as ``m_i + log(sum_{j <= i} exp(x_j - m_i))`` with ``m_i`` the running maximum:
    every exponent is at most 0 and the sum at least 1, so nothing overflows or underflows to a wrong value."""
    if fake(x).dim() == 0:
        return t.value(x)
    p = _Prefixes(t, node, x, dim)
    top = p.running("ReduceMax", _LOWEST)
    dtype, square = p.dtype, p.square
    shifted = t.emit1("Sub", [p.columns, top], dtype=dtype, shape=square)
    # Masked-out positions exponentiate 0 and are then multiplied by 0 (an exp of a huge negative number would be
    # clipped by the Exp-input pass, not zero).
    safe = t.emit1("Where", [p.mask, shifted, t.scalar(0.0, dtype)], dtype=dtype, shape=square)
    exp = t.emit1("Exp", [safe], dtype=dtype, shape=square)
    weights = t.emit1("Where", [p.mask, exp, t.scalar(0.0, dtype)], dtype=dtype, shape=square)
    total = t.emit1("ReduceSum", [weights, t.ints([-1], "axes")], {"keepdims": 1}, dtype=dtype, shape=p.rows)
    log = t.emit1("Log", [total], dtype=dtype, shape=p.rows)
    return p.back(t.emit1("Add", [top, log], dtype=dtype, shape=p.rows), dtype)
