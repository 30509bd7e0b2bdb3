"""HTP's stand-in for NaN and infinities (a float beyond float16's range) never reaches the caller: the call is
computed in PyTorch, or raises in strict mode, with the caller's tensors untouched."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import qnnx_backend
from qnnx_backend._compare import FP16_MAX
from qnnx_backend._untrusted import BeyondHalfRange, BeyondHalfRangeInput, NaNInput, check_half_range, check_inputs
from qnnx_backend.errors import QnnFallbackWarning, QnnRuntimeError

_floats = st.one_of(
    st.floats(-FP16_MAX, FP16_MAX, width=32),
    st.sampled_from([np.nan, np.inf, -np.inf, 131008.0, -131008.0, 65505.0, -70000.0, FP16_MAX, -FP16_MAX]),
)


_ARRAYS = st.lists(
    hnp.arrays(st.sampled_from([np.float32, np.float16]), hnp.array_shapes(min_dims=0, max_side=4), elements=_floats),
    min_size=1,
    max_size=3,
)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@given(arrays=_ARRAYS)
def test_raises_exactly_when_a_float_is_outside_half_range(arrays):
    """Any NaN, infinity or magnitude beyond 65504 in any float output is reported with its output's name; values
    within +-65504 (the limits included) are not."""
    names = [f"out{k}" for k in range(len(arrays))]
    bad = [n for n, a in zip(names, arrays) if not np.all(np.abs(a.astype(np.float64)) <= FP16_MAX)]
    if bad:
        with pytest.raises(BeyondHalfRange) as info:
            check_half_range(names, arrays)
        assert info.value.output == bad[0]
        assert np.isnan(info.value.value) or abs(info.value.value) > FP16_MAX
    else:
        check_half_range(names, arrays)


def test_integer_and_empty_outputs_are_not_checked():
    """Integer outputs may hold any value, and an empty output holds none."""
    check_half_range(["i", "e"], [np.array([10**9, -(10**9)], dtype=np.int64), np.zeros((0, 3), np.float32)])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@given(arrays=_ARRAYS)
def test_nan_inputs_are_found_and_out_of_range_inputs_are_clipped(arrays):
    """The first input holding a NaN is named. Otherwise every input reaches HTP within +-65504: an array within
    range is fed as it is (the same object), one with an infinity or a larger magnitude as a clipped copy (the
    caller's array untouched)."""
    feed = {f"in{k}": a for k, a in enumerate(arrays)}
    kept = {n: a.copy() for n, a in feed.items()}
    bad = [n for n, a in feed.items() if np.isnan(a).any()]
    if bad:
        with pytest.raises(NaNInput) as info:
            check_inputs(list(feed), feed)
        assert info.value.input == bad[0]
        return
    given_arrays = dict(feed)
    check_inputs(list(feed), feed)
    for name, array in feed.items():
        original = given_arrays[name]
        np.testing.assert_array_equal(original, kept[name])
        assert array.dtype == original.dtype and array.shape == original.shape
        if np.all(np.abs(original.astype(np.float64)) <= FP16_MAX):
            assert array is original
        else:
            np.testing.assert_array_equal(array, np.clip(original, -FP16_MAX, FP16_MAX))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@given(arrays=_ARRAYS)
def test_without_clipping_the_first_nan_or_out_of_range_input_is_named(arrays):
    """With ``clip=False`` (a graph whose clipped call differed from eager) the first input holding a NaN or a value
    beyond +-65504 is named, as NaNInput or BeyondHalfRangeInput with its worst value; the feed is left as given."""
    feed = {f"in{k}": a for k, a in enumerate(arrays)}
    given_arrays = dict(feed)
    first = next(
        ((n, a) for n, a in feed.items() if not np.all(np.abs(a.astype(np.float64)) <= FP16_MAX)), None
    )  # NaN fails the comparison too
    if first is None:
        assert check_inputs(list(feed), feed, clip=False) is False
    elif np.isnan(first[1]).any():
        with pytest.raises(NaNInput) as nan_info:
            check_inputs(list(feed), feed, clip=False)
        assert nan_info.value.input == first[0]
    else:
        with pytest.raises(BeyondHalfRangeInput) as info:
            check_inputs(list(feed), feed, clip=False)
        assert info.value.input == first[0] and abs(info.value.value) > FP16_MAX
        assert info.value.value in (float(first[1].max()), float(first[1].min()))
    assert all(feed[n] is a for n, a in given_arrays.items())


def _signs(m: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return m < 0, m > 0, torch.softmax(x + m, dim=-1)


def test_an_input_beyond_half_range_is_compared_as_eager_compares_it():
    """A float input beyond float16's range on a later call (an attention mask of float32's minimum, -inf, 1e5)
    is compared as eager PyTorch compares it, on the NPU; HTP alone read ``x < 0`` as False for each of them."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    fn = torch.compile(_signs, backend="qnn", options={"soc_model": 60, "device": "npu", "strict": True})
    x = torch.linspace(-1, 1, 8).reshape(1, 8)
    fn(torch.zeros(1, 8), x)
    lowest = torch.finfo(torch.float32).min
    m = torch.tensor([[lowest, -1e5, -70000.0, -FP16_MAX, float("-inf"), 0.0, 1e5, 3.0]])
    got, ref = fn(m, x), _signs(m, x)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    torch.testing.assert_close(got[2], ref[2], atol=2e-3, rtol=2e-3)
    assert [r.device for r in qnnx_backend.compile_reports()] == ["npu"]


def _gate(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * 2.0 + torch.softmax(x + mask, dim=-1)


def test_a_nan_input_is_computed_in_pytorch_and_an_infinite_mask_stays_on_the_npu():
    """An input NaN (which HTP would read as 131008 and turn into finite numbers) gives eager's NaN with one warning
    naming the input; a -inf mask runs on the NPU and matches eager; strict mode raises for the NaN."""
    for strict in (False, True):
        torch._dynamo.reset()
        qnnx_backend.clear_compile_reports()
        fn = torch.compile(_gate, backend="qnn", options={"soc_model": 60, "device": "npu", "strict": strict})
        x, mask = torch.linspace(-2, 2, 32).reshape(4, 8), torch.zeros(4, 8)
        fn(x, mask)
        mask[:, 5:] = float("-inf")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(fn(x, mask), _gate(x, mask), atol=2e-3, rtol=2e-3)
        poisoned = x.clone()
        poisoned[2, 3] = float("nan")
        if strict:
            with pytest.raises(QnnRuntimeError, match="holds NaN"):
                fn(poisoned, mask)
        else:
            with pytest.warns(QnnFallbackWarning, match="holds NaN"):
                got = fn(poisoned, mask)
            torch.testing.assert_close(got, _gate(poisoned, mask), equal_nan=True)
        assert [r.device for r in qnnx_backend.compile_reports()] == ["npu"]


def _divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a / b) * 2.0 + 1.0


def test_a_nan_call_is_computed_in_pytorch_and_later_calls_stay_on_the_npu():
    """A division by zero on a later call (inf and NaN in eager) returns eager's values with one warning naming the
    output, and the graph keeps running on the NPU for finite calls."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    fn = torch.compile(_divide, backend="qnn", options={"soc_model": 60, "device": "npu"})
    ones = torch.ones(4, 8)
    fn(ones, ones + 1)
    zeros = torch.zeros(4, 8)
    zeros[0, 0] = 1.0
    a = torch.ones(4, 8)
    a[1] = 0.0  # 0/0: NaN
    with pytest.warns(QnnFallbackWarning, match="beyond float16's"):
        got = fn(a, zeros)
    torch.testing.assert_close(got, _divide(a, zeros), equal_nan=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(fn(ones, ones * 4), _divide(ones, ones * 4), atol=1e-3, rtol=1e-3)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu"


class _Accumulate(torch.nn.Module):
    """Writes a ratio into its buffer and returns it scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 8))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.state.copy_(a / b)
        return self.state * 3.0


@pytest.mark.parametrize("strict", [False, True])
def test_a_graph_that_writes_leaves_the_buffer_as_eager_does_or_untouched(strict):
    """A writing graph's bad call: in auto mode the buffer and result are eager's; in strict mode the call raises
    a QnnRuntimeError that names the fix, and the buffer keeps the value of the previous call."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    model = _Accumulate().eval()
    fn = torch.compile(model, backend="qnn", options={"soc_model": 60, "device": "npu", "strict": strict})
    ones = torch.ones(4, 8)
    with torch.no_grad():
        fn(ones, ones * 2)
        assert [r.device for r in qnnx_backend.compile_reports()] == ["npu"]
        kept = model.state.clone()
        assert torch.allclose(kept, torch.full((4, 8), 0.5))
        if strict:
            with pytest.raises(QnnRuntimeError, match=r"arguments are unchanged.*device='auto'"):
                fn(ones, torch.zeros(4, 8))
            assert torch.equal(model.state, kept)
        else:
            with pytest.warns(QnnFallbackWarning, match="beyond float16's"):
                got = fn(ones, torch.zeros(4, 8))
            assert torch.isinf(model.state).all() and torch.isinf(got).all()


def _scaled(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # Exact for inputs within float16's range; with one beyond it, clipping to +-65504 changes each result.
    return x * 0.5, (x < -1e6).float() + x.abs().clamp(max=10.0)


@pytest.mark.parametrize("strict", [False, True])
def test_inputs_whose_clipping_changes_the_result_are_computed_in_pytorch(strict):
    """Clipping an input beyond float16's range to +-65504 is exact for a mask, not for ``x * 0.5`` or ``x < -1e6``
    (HTP gave -32752 and False for x = -inf). The first such call is compared with eager PyTorch: here it differs,
    so it and every later such call are eager's (one warning; strict raises naming the fix), while calls within
    range still run on the NPU."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    fn = torch.compile(_scaled, backend="qnn", options={"soc_model": 60, "device": "npu", "strict": strict})
    x = torch.linspace(-4, 4, 32).reshape(4, 8)
    fn(x)
    far = x.clone()
    far[0, 0], far[1, 1], far[2, 2], far[3, 3] = float("-inf"), 1e5, -3.0e38, float("inf")
    if strict:
        with pytest.raises(QnnRuntimeError, match=r"clipped to it for HTP.*device='auto'"):
            fn(far)
    else:
        with pytest.warns(QnnFallbackWarning, match="clipped to it for HTP"):
            got = fn(far)
        for g, r in zip(got, _scaled(far)):
            assert torch.equal(g, r)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = far * 2
            for g, r in zip(fn(again), _scaled(again)):
                assert torch.equal(g, r)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        near = x.flip(0)
        for g, r in zip(fn(near), _scaled(near)):
            torch.testing.assert_close(g, r, atol=2e-2, rtol=2e-3)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu"


@pytest.mark.parametrize("fp16", [False, True])
def test_a_clipped_first_call_that_differs_leaves_the_written_buffer_as_eager_does(fp16):
    """A writing graph's first call with an input beyond float16's range that clipping would change: the buffer
    and the result are eager's, and a later call within range runs on the NPU and is checked like a first call;
    also with fp16=True, whose float16 inputs are cast at the boundary."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    model = _Accumulate().eval()
    fn = torch.compile(model, backend="qnn", options={"soc_model": 60, "device": "npu", "fp16": fp16})
    ones = torch.ones(4, 8)
    big = torch.full((4, 8), 2.0e5)
    with torch.no_grad():
        with pytest.warns(QnnFallbackWarning, match="clipped to it for HTP"):
            got = fn(big, ones * 4)
        assert torch.equal(model.state, torch.full((4, 8), 5.0e4)) and torch.equal(got, model.state * 3.0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn(ones, ones * 2)
        torch.testing.assert_close(model.state, torch.full((4, 8), 0.5), atol=1e-3, rtol=1e-3)
    assert [r.device for r in qnnx_backend.compile_reports()] == ["npu"]
