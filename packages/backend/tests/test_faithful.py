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


@given(shape=shapes(min_rank=1, max_side=5), seed=seeds(999), scale=st.sampled_from([1.0, 1e4, 1e6]))
def test_the_export_check_leaves_values_beyond_float16_to_the_range_check(
    shape: list[int], seed: int, scale: float
) -> None:
    """Where eager's value is beyond float16's range (a clipped Exp saturates there on purpose), the CPU check of
    an export takes eager's value; everywhere else the exported model's own value is compared, so an unfaithful
    value within float16's range is still reported."""
    from qnnx_backend._faithful import _within_fp16

    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=g) * scale
    got = torch.full_like(ref, 65504.0)
    kept = _within_fp16(got, ref)
    assert isinstance(kept, torch.Tensor)
    beyond = ref.abs() > 65504
    assert torch.equal(kept[beyond], ref[beyond]) and torch.equal(kept[~beyond], got[~beyond])
    if bool((~beyond).any()) and not torch.equal(got[~beyond], ref[~beyond]):
        assert compare_outputs([kept], [ref], RTOL_FP32) is not None


@given(shapes(max_rank=3), seeds(), st.floats(1e-6, 1e-1))
def test_complex_outputs_are_compared_part_by_part(shape: list[int], seed: int, rel: float) -> None:
    """Complex outputs (a graph returning its real pair, rebuilt) are compared by their real and imaginary parts:
    rounding noise agrees, an error in either part beyond the tolerance is reported (not an exact-equality
    failure), and so is the fp16 accuracy guard's comparison."""
    from qnnx_backend._compare import mismatch

    g = torch.Generator().manual_seed(seed)
    ref = torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) + 4.0
    assert compare_outputs(ref * (1 + 1e-7), ref, RTOL_FP32) is None
    assert mismatch(ref * (1 + 1e-7), ref, 2e-2, 0.999) is None
    scale = float(torch.view_as_real(ref).abs().max())
    bad = ref.clone()
    bad.view(-1)[0] += 1j * (rel + 2 * RTOL_FP32) * scale
    assert "off by" in compare_outputs(bad, ref, RTOL_FP32)
    if rel > 3e-2:
        assert "max|err|" in mismatch(bad, ref, 2e-2, 0.999)


@given(
    lead=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    length=st.integers(2, 12),
    features=st.integers(1, 5),
    data=st.data(),
    seed=seeds(),
)
def test_the_accuracy_guard_leaves_out_the_left_padding_and_nothing_else(
    lead: list[int], length: int, features: int, data: st.DataObject, seed: int
) -> None:
    """While a left padding of ``count`` positions is in force, a difference at those positions (the second-to-last
    dimension, when its size is the prompt's or the cache's length) is not reported; one at any real position still
    is, and so is a NaN at a real position, and every difference outside the padding's scope. (Every QNN run's
    outputs, the padding's included, are also checked for values beyond float16's range, elsewhere.)"""
    from qnnx_backend._compare import left_padding, mismatch

    count = data.draw(st.integers(1, length - 1))
    ref = torch.randn([*lead, length, features], generator=torch.Generator().manual_seed(seed))
    padded = ref.clone()
    padded[..., :count, :] += 10.0  # eager and HTP part ways at the padding
    real = ref.clone()
    real[..., data.draw(st.integers(count, length - 1)), :] += 10.0
    other_size = length + data.draw(st.integers(1, 4))
    with left_padding(count, (other_size, length)):
        assert mismatch(padded, ref, 2e-2, 0.999) is None
        assert mismatch(real, ref, 2e-2, 0.999) is not None
        nonfinite = padded.clone()
        nonfinite[..., count, :] = math.nan
        assert mismatch(nonfinite, ref, 2e-2, 0.999) is not None
    with left_padding(count, (other_size,)):  # not a dimension of positions: compared whole
        assert mismatch(padded, ref, 2e-2, 0.999) is not None
    assert mismatch(padded, ref, 2e-2, 0.999) is not None  # out of scope: compared whole


@given(shapes(max_rank=3, min_side=1), seeds(), st.floats(-40, 2))
def test_first_call_mismatch_names_magnitudes_too_small_for_float16(
    shape: list[int], seed: int, log2_scale: float
) -> None:
    """When eager's outputs are too small for float16 (an untrained deep model's vanishing activations), the first
    call's mismatch says so, in float16's two ranges (below its smallest value; subnormal); at ordinary magnitudes it
    does not."""
    from qnnx_backend._compare import mismatch

    g = torch.Generator().manual_seed(seed)
    ref = (torch.rand(shape, generator=g) + 0.5) * 2.0**log2_scale
    why = mismatch(torch.zeros_like(ref), ref, 2e-2, 0.999)
    assert why is not None and "max|err|" in why
    scale = float(ref.abs().max())
    assert ("below float16's smallest value" in why) == (scale < 2.0**-24)
    assert ("float16's subnormal range" in why) == (2.0**-24 <= scale < 2.0**-14)
