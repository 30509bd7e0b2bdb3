"""The export check: an exported model is compared with eager PyTorch before QNN sees it."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend._compare import RTOL_FP32, compare_outputs
from qnnx_testkit.strategies import seeds, shapes


@given(shape=shapes(), seed=seeds())
def test_identical_outputs_agree(shape: list[int], seed: int) -> None:
    """An output compared with itself (NaN and inf included) agrees."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    if x.numel():
        x.view(-1)[0] = math.nan
    assert compare_outputs((x, x.to(torch.int64)), (x.clone(), x.to(torch.int64)), RTOL_FP32) is None


@given(shape=shapes(min_rank=1), rel=st.floats(1e-2, 10.0))
def test_error_beyond_tolerance_is_reported(shape: list[int], rel: float) -> None:
    """An element off by more than rtol of the output's scale is reported with its size."""
    ref = torch.rand(shape) + 0.5
    got = ref.clone()
    got.view(-1)[-1] += rel * ref.abs().max()
    problem = compare_outputs(got, ref, RTOL_FP32)
    assert problem is not None and "off by" in problem


def test_noise_within_tolerance_agrees() -> None:
    """Float reassociation noise (1e-6 relative) is not a difference."""
    ref = torch.randn(64)
    assert compare_outputs(ref * (1 + 1e-6), ref, RTOL_FP32) is None


def test_nonfinite_and_structure_mismatches_are_reported() -> None:
    """A NaN where PyTorch has a number, inf for -inf, another shape, dtype or count: each is reported."""
    ref = torch.tensor([1.0, -math.inf])
    assert "NaN" in compare_outputs(torch.tensor([math.nan, -math.inf]), ref, RTOL_FP32)
    assert "infinities" in compare_outputs(torch.tensor([1.0, math.inf]), ref, RTOL_FP32)
    assert "shape" in compare_outputs(torch.ones(3), ref, RTOL_FP32)
    assert "dtype" in compare_outputs(ref.double(), ref, RTOL_FP32)
    assert "outputs" in compare_outputs((ref, ref), (ref,), RTOL_FP32)
    assert "differs" in compare_outputs(torch.tensor([1, 2]), torch.tensor([1, 3]), RTOL_FP32)
