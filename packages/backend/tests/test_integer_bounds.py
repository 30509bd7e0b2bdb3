"""A call whose integer inputs are larger than the graph's int32 arithmetic takes on HTP is computed in PyTorch,
never returned saturated; calls within the bound stay on the NPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend._untrusted import IntegerBeyondBound, check_integer_inputs
from qnnx_backend.errors import QnnFallbackWarning, QnnRuntimeError


@given(
    bound=st.integers(0, 2**31 - 1),
    values=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=6),
)
def test_the_check_names_exactly_the_inputs_beyond_their_bound(bound, values):
    """Property: an array is refused exactly when one of its magnitudes exceeds the bound, and the error names it."""
    feed = {"ids": np.array(values, dtype=np.int32), "free": np.array(values, dtype=np.int32)}
    if max(abs(v) for v in values) > bound:
        with pytest.raises(IntegerBeyondBound) as info:
            check_integer_inputs([("ids", bound)], feed)
        assert info.value.input == "ids"
    else:
        check_integer_inputs([("ids", bound)], feed)


def _hash(x: torch.Tensor) -> torch.Tensor:
    return x * 1000003 % 65521


def _sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def _running(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0)


_INDEX = torch.tensor([0, 1, 0, 2, 1, 0, 2, 1, 0, 2])


def _index_add(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(3, dtype=torch.int64).index_add(0, _INDEX, x)


def _below(x: torch.Tensor) -> torch.Tensor:
    return x.float() < 16777217.0


@pytest.mark.parametrize(
    ("fn", "small", "large"),
    [
        (_hash, (torch.arange(8),), (torch.arange(8) + 10**6,)),
        (_sum, (torch.arange(4), torch.arange(4)), (torch.full((4,), 2**31 - 1), torch.full((4,), 5))),
        (_running, (torch.arange(10),), (torch.arange(10) * 1000003 + 1,)),
        (_index_add, (torch.arange(10),), (torch.arange(10) * 1000003 + 1,)),
        (_below, (torch.arange(10),), (torch.arange(10) * 1000003 + 1,)),
    ],
)
def test_a_later_call_beyond_int32_arithmetic_is_computed_in_pytorch(fn, small, large):
    """The first call fits int32 and passes the accuracy guard; a later call whose arithmetic leaves int32 (HTP
    returned 32872 for every element of the hash, and 2**31 - 1 for the sum), float32's exact integers (HTP's
    integer running sum rounded 17920949 to 17920948, and so did its index_add) or float16's range (an integer cast
    to float saturated at 65504, so 1000004 < 16777217.0 came out False) gets eager's values, and the graph stays on
    the NPU for the calls after it."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    compiled = torch.compile(fn, backend="qnn", options={"soc_model": 60, "device": "npu"})
    with torch.no_grad():
        assert torch.equal(compiled(*small), fn(*small))
        with pytest.warns(QnnFallbackWarning, match="beyond"):
            assert torch.equal(compiled(*large), fn(*large))
        assert torch.equal(compiled(*small), fn(*small))
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu"


def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 1000003 + 7


def test_under_strict_a_call_beyond_the_bound_raises_and_names_it():
    """Strict computes nothing elsewhere: the call raises, naming the input and its bound ((2**31 - 8) // 1000003)."""
    torch._dynamo.reset()
    compiled = torch.compile(_scale, backend="qnn", options={"soc_model": 60, "device": "npu", "strict": True})
    with torch.no_grad():
        assert torch.equal(compiled(torch.arange(8) + 2140), _scale(torch.arange(8) + 2140))
        with pytest.raises(QnnRuntimeError, match="beyond 2147 in magnitude"):
            compiled(torch.arange(8) + 2141)


def test_after_a_first_call_beyond_the_bound_the_next_call_is_the_one_checked():
    """A first call computed in PyTorch (an integer input beyond its bound) has not checked the device against
    eager: the accuracy guard checks the next call that runs on it."""
    from qnnx_backend._compiled import live_graphs

    torch._dynamo.reset()
    compiled = torch.compile(_scale, backend="qnn", options={"soc_model": 60, "device": "npu"})
    with torch.no_grad():
        with pytest.warns(QnnFallbackWarning, match="beyond"):
            assert torch.equal(compiled(torch.arange(8) + 10**6), _scale(torch.arange(8) + 10**6))
        (variant,) = live_graphs()[-1].variants.values()
        assert not variant._verified
        assert torch.equal(compiled(torch.arange(8)), _scale(torch.arange(8)))
        assert variant._verified
