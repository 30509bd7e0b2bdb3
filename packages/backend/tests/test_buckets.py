"""Bucket arithmetic: which bucket a size takes, and padding then slicing gives back the original tensors."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend import _buckets

PLAN = _buckets.BucketPlan(sym_positions=(0,), padded=((1, 1, 0), (2, 1, 0)), sliced=((0, 1, 0),), upper=(None,))


@given(size=st.integers(1, 5000))
def test_auto_ladder_is_the_next_power_of_two_from_16(size: int) -> None:
    """'auto' picks the smallest power of two >= the size, and never less than 16."""
    (bucket,) = _buckets.choose([size], PLAN, "auto")
    assert bucket >= max(size, 16)
    assert bucket & (bucket - 1) == 0
    assert bucket == 16 or bucket // 2 < size


def test_auto_ladder_is_bounded_by_dynamos_maximum() -> None:
    """With mark_dynamic(max=...), a bucket never exceeds the maximum (but covers the size)."""
    bounded = _buckets.BucketPlan(sym_positions=(0,), padded=PLAN.padded, sliced=PLAN.sliced, upper=(40,))
    assert _buckets.choose([33], bounded, "auto") == (40,)
    assert _buckets.choose([12], bounded, "auto") == (16,)


def test_explicit_ladder_and_sizes_past_it() -> None:
    """A list of sizes: the smallest that fits; a size past every bucket compiles exactly (None)."""
    assert _buckets.choose([20], PLAN, (16, 32, 64)) == (32,)
    assert _buckets.choose([64], PLAN, (16, 32, 64)) == (64,)
    assert _buckets.choose([65], PLAN, (16, 32, 64)) is None


@given(batch=st.integers(1, 3), size=st.integers(1, 20), extra=st.integers(0, 12), width=st.integers(1, 4))
def test_pad_then_slice_round_trips(batch: int, size: int, extra: int, width: int) -> None:
    """Padding grows only the dynamic dims (zeros, False for bools); slicing the output restores the true size."""
    x = torch.randn(batch, size, width)
    mask = torch.ones(batch, size, dtype=torch.bool)
    padded = _buckets.pad([size, x, mask], PLAN, [size + extra])
    assert padded[0] == size + extra
    assert padded[1].shape == (batch, size + extra, width) and padded[2].shape == (batch, size + extra)
    assert torch.equal(padded[1][:, :size], x) and not padded[2][:, size:].any()
    assert float(padded[1][:, size:].abs().sum()) == 0.0
    out = _buckets.slice_outputs((padded[1] * 2,), PLAN, [size])
    assert torch.equal(out[0], x * 2)
