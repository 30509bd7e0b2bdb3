"""The translator's ops of mixture-of-experts routers and decoder position math: max/min with indices, argmax,
histc of expert ids, scatter of a value (a group mask) or of a source (a sampler's mask) and floor of an integer
quotient. Each equals eager exactly
on the CPU EP, declines what it cannot compute exactly, and runs wholly on the HTP simulator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_flatten

import qnnx_export as qe
from qnnx_export.errors import ExportError
from qnnx_testkit.strategies import seeds, shapes

FAST = qe.ExportOptions(exporter="fast")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it."""
    with torch.no_grad():
        yield


def _exactly_as_eager(fn: Callable[..., Any], *inputs: torch.Tensor) -> None:
    """``fn`` translated (no fallback) and run on the CPU EP gives eager's outputs bit for bit, dtypes included."""
    ref = fn(*inputs)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, inputs, backend)
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    outs, refs = tree_flatten(out)[0], tree_flatten(ref)[0]
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs, strict=True):
        assert o.dtype == r.dtype and o.shape == r.shape, (o.dtype, o.shape, r.dtype, r.shape)
        assert torch.equal(o, r), (o, r)


def _declines(fn: Callable[..., Any], *inputs: torch.Tensor, match: str) -> None:
    """The translator declines ``fn`` with a reason matching ``match`` (the fast exporter alone then raises)."""
    cap = only(capture(fn, *inputs)[0])
    with pytest.raises(ExportError, match=match):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


def _with_ties(dims: list[int], seed: int) -> torch.Tensor:
    """Values from a handful of levels, so that most rows repeat their extremum."""
    return torch.randint(-2, 3, dims, generator=torch.Generator().manual_seed(seed)).float() / 4


@settings(max_examples=25, deadline=None)
@given(dims=shapes(max_rank=3, max_side=5), data=st.data(), seed=seeds())
def test_max_and_min_along_an_axis_give_eagers_values_and_first_indices(
    dims: list[int], data: st.DataObject, seed: int
) -> None:
    """max(x, dim) and min(x, dim) (keepdim or not) of a rank 0-3 tensor with repeated extrema give eager's values
    and int64 indices exactly: the first position on ties."""
    x = _with_ties(dims, seed)
    rank = max(len(dims), 1)
    dim = data.draw(st.integers(-rank, rank - 1))
    keepdim = data.draw(st.booleans())
    _exactly_as_eager(lambda t: (tuple(torch.max(t, dim, keepdim)), tuple(torch.min(t, dim, keepdim))), x)


@settings(max_examples=25, deadline=None)
@given(dims=shapes(min_rank=1, max_rank=3, max_side=5), data=st.data(), seed=seeds())
def test_argmax_argmin_and_max_of_all_give_eagers_results(dims: list[int], data: st.DataObject, seed: int) -> None:
    """argmax/argmin along an axis or of the flattened tensor (keepdim or not), and max/min of every element, equal
    eager exactly with repeated values (the first position on ties)."""
    x = _with_ties(dims, seed)
    dim = data.draw(st.one_of(st.none(), st.integers(-len(dims), len(dims) - 1)))
    keepdim = data.draw(st.booleans())
    _exactly_as_eager(lambda t: (t.argmax(dim, keepdim), t.argmin(dim, keepdim), torch.max(t) * 1, torch.min(t) * 1), x)


@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(1, 40),
    low=st.integers(-6, 6),
    span=st.integers(1, 12),
    bins=st.integers(1, 16),
    int32=st.booleans(),
    seed=seeds(),
)
def test_histc_of_integer_ids_counts_exactly(
    count: int, low: int, span: int, bins: int, int32: bool, seed: int
) -> None:
    """histc(ids.float(), bins, min, max) of int32/int64 ids, some outside [min, max], with any number of bins
    over the range (one integer per bin, several, or bins that hold none), equals eager's counts exactly."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low - 2, low + span + 3, (count,), generator=g).to(torch.int32 if int32 else torch.int64)
    _exactly_as_eager(lambda i: torch.histc(i.float(), bins=bins, min=low, max=low + span), ids)


def test_histc_of_one_bin_over_the_datas_range_counts_every_element() -> None:
    """histc(ids.float(), bins=1) with min == max (a router of one expert) counts every element, as eager does."""
    _exactly_as_eager(lambda i: torch.histc(i.float(), bins=1, min=0, max=0), torch.tensor([[3, 0], [5, 5]]))


def test_histc_declines_what_it_cannot_count_exactly() -> None:
    """Float values (bin edges at float16 precision would move them), a range from the data over several bins and
    fractional bounds are declined, each naming why."""
    ids = torch.tensor([0, 1, 3, 3])
    _declines(lambda x: torch.histc(x * 0.5, bins=4, min=0, max=2), torch.randn(6), match="float values")
    _declines(lambda i: torch.histc(i.float(), bins=4, min=0, max=0), ids, match="depends on the data")
    _declines(lambda i: torch.histc(i.float(), bins=4, min=0, max=2.5), ids, match="integer bounds")


@settings(max_examples=30, deadline=None)
@given(dims=shapes(min_rank=1, max_rank=3, max_side=5), data=st.data(), seed=seeds(), fill=st.sampled_from([1, -2.5]))
def test_scatter_of_a_value_equals_eager(dims: list[int], data: st.DataObject, seed: int, fill: float) -> None:
    """x.scatter(dim, index, value) along any axis of a rank 1-3 tensor, with an index narrower than the input and
    repeated positions, equals eager exactly; so does the in-place form on a fresh mask (a router's group mask)."""
    g = torch.Generator().manual_seed(seed)
    dim = data.draw(st.integers(-len(dims), len(dims) - 1))
    index_shape = [
        data.draw(st.integers(1, d + 2)) if i == dim % len(dims) else data.draw(st.integers(1, d))
        for i, d in enumerate(dims)
    ]
    x = torch.randn(dims, generator=g)
    index = torch.randint(0, dims[dim], index_shape, generator=g)
    _exactly_as_eager(lambda a, i: (a.scatter(dim, i, fill), torch.zeros_like(a).scatter_(dim, i, 1)), x, index)


@settings(max_examples=30, deadline=None)
@given(
    dims=shapes(min_rank=1, max_rank=5, max_side=4),
    data=st.data(),
    seed=seeds(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bool]),
)
def test_scatter_of_a_source_equals_eager(dims: list[int], data: st.DataObject, seed: int, dtype: torch.dtype) -> None:
    """x.scatter(dim, index, src) along any axis of a rank 1-5 tensor (size-1 axes included), with an index narrower
    than the input, a source wider than the index and repeated positions (the last write along dim stays, as in
    eager), equals eager exactly for float32, float16 and bool; so does the in-place form."""
    g = torch.Generator().manual_seed(seed)
    dim = data.draw(st.integers(-len(dims), len(dims) - 1))
    axis = dim % len(dims)
    index_shape = [
        data.draw(st.integers(1, d + 2)) if i == axis else data.draw(st.integers(1, d)) for i, d in enumerate(dims)
    ]
    src_shape = [s + data.draw(st.integers(0, 1)) for s in index_shape]
    x = torch.randn(dims, generator=g)
    src = torch.randn(src_shape, generator=g)
    if dtype is torch.bool:
        x, src = x > 0, src > 0
    else:
        x, src = x.to(dtype), src.to(dtype)
    index = torch.randint(0, dims[dim], index_shape, generator=g)
    _exactly_as_eager(lambda a, i, s: (a.scatter(dim, i, s), a.clone().scatter_(dim, i, s)), x, index, src)


def test_scatter_of_a_source_declines_integers_and_long_indices() -> None:
    """Integer tensors and an index of 2048 or more positions along dim are declined, naming why."""
    x = torch.zeros(4, 3, dtype=torch.int64)
    _declines(lambda a, i, s: a.scatter(0, i, s), x, torch.zeros(2, 3, dtype=torch.int64), x, match="int64")
    long_index = torch.zeros(2048, 1, dtype=torch.int64)
    _declines(lambda a, i, s: a.scatter(0, i, s), torch.zeros(4, 1), long_index, torch.zeros(2048, 1), match="2048")


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.integers(-(2**24) + 2, 2**24 - 2), min_size=1, max_size=12),
    divisor=st.integers(1, 20000),
    int32=st.booleans(),
)
def test_floor_of_an_integer_quotient_equals_eager(values: list[int], divisor: int, int32: bool) -> None:
    """floor(i / n) of int32/int64 integers (negative ones too) by a positive integer equals eager's float32 result
    exactly below 2**24 in magnitude, computed by integer division instead of a float quotient."""
    i = torch.tensor(values, dtype=torch.int32 if int32 else torch.int64)
    _exactly_as_eager(lambda p: torch.floor(p / divisor), i)


_DIVISORS = st.one_of(st.integers(-20000, 20000).filter(bool), st.sampled_from([2, 4, 16, 64, 16384, -2, -16, 1, -1]))


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(-(2**30), 2**30), min_size=1, max_size=12),
    divisor=_DIVISORS,
    runtime=st.lists(_DIVISORS, min_size=1, max_size=12),
    mode=st.sampled_from(["trunc", "floor"]),
    int32=st.booleans(),
)
def test_integer_division_with_a_rounding_mode_equals_eager(
    values: list[int], divisor: int, runtime: list[int], mode: str, int32: bool
) -> None:
    """``torch.div(a, b, rounding_mode=...)`` and ``a // b`` of int32/int64 tensors, by a Python integer of either
    sign (powers of two included) and by a tensor of divisors, equal eager bit for bit (the translator divides
    magnitudes and puts the sign back)."""
    dtype = torch.int32 if int32 else torch.int64
    a = torch.tensor(values, dtype=dtype)
    b = torch.tensor((runtime * len(values))[: len(values)], dtype=dtype)

    def divide(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.div(x, divisor, rounding_mode=mode), torch.div(x, y, rounding_mode=mode), x // divisor, x // y

    _exactly_as_eager(divide, a, b)


def test_float_division_with_a_rounding_mode_is_declined() -> None:
    """Float floor division is not ``floor(a / b)`` in PyTorch (``1 // 0.1`` is 9), so the translator leaves it."""
    x = torch.tensor([1.0, 2.5])
    _declines(lambda a: torch.div(a, 0.1, rounding_mode="floor"), x, match="float32")


def test_integer_division_with_a_rounding_mode_runs_exactly_on_the_htp_simulator() -> None:
    """The magnitudes' quotients run wholly on the HTP simulator (no CPU fallback) and give eager's integers
    exactly: HTP's own Div by a constant power of two rounds negative quotients down (-70001 // -16 and
    ``trunc(-1 / 16384)`` included), and by a tensor of divisors."""
    a = torch.tensor([-70001, -33, -17, -16, -15, -9, -8, -5, -1, 0, 1, 5, 8, 9, 15, 16, 17, 33, 70001])
    b = torch.tensor([3, -3, 4, -4, 2, -2, 7, -7, 1, -1, 16, -16, 5, -5, 8, -8, 64, -64, 2])

    def divide(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x // 4,
            x // -16,
            torch.div(x, 16384, rounding_mode="trunc"),
            torch.div(x.int(), -3, rounding_mode="trunc"),
            x // y,
            torch.div(x, y, rounding_mode="trunc"),
        )

    backend = Capture(qnn_session, FAST)
    out = compile_and_run(divide, (a, b), backend)
    assert backend.exported[0].exporter == "fast"
    for got, want in zip(out, divide(a, b), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


def test_router_and_position_ops_run_wholly_on_the_htp_simulator() -> None:
    """max with indices (ties included), argmax, histc of expert ids, a scattered group mask and the floor of
    position quotients run in one graph wholly on the HTP simulator (no CPU fallback): eager's int64 indices exactly,
    and counts, mask and floors that round to eager's integers (HTP's float outputs carry float16-level noise)."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 5, generator=g)
    scores[1, 1] = scores[1, 3] = scores[1].max() + 1  # a tie: the first index wins
    ids = torch.randint(0, 4, (6, 2), generator=g)
    positions = torch.tensor([[0, 1, 16383, 16384, 40000, -1, -16385]])

    def router(s: torch.Tensor, i: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, index = torch.max(s, -1)
        counts = torch.histc(i.reshape(-1).float(), bins=4, min=0, max=3)
        mask = torch.zeros_like(s).scatter_(1, i, 1.0)
        return values, index, s.argmin(0), counts, mask, 1 + torch.floor(p / 16384)

    backend = Capture(qnn_session, FAST)
    out = compile_and_run(router, (scores, ids, positions), backend)
    ref = router(scores, ids, positions)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out[0], ref[0]) <= 2e-3
    assert torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2]), (out[1:3], ref[1:3])
    for got, want in zip(out[3:], ref[3:], strict=True):
        assert torch.equal(got.round(), want) and rel_err(got, want) <= 1e-3, (got, want)


def test_scatters_of_a_source_run_wholly_on_the_htp_simulator() -> None:
    """A sampler's ``sorted_mask.scatter(1, sorted_indices, sorted_mask)`` (bool, a permutation) and a float scatter
    whose index repeats positions run in one graph wholly on the HTP simulator with eager's values: the mask
    exactly, the floats within 1e-3 (HTP's float outputs carry float16-level noise; the values are quarters, so a
    wrong pick would be 0.25 or more off)."""
    g = torch.Generator().manual_seed(3)
    sorted_mask = torch.rand(2, 7, generator=g) > 0.5
    sorted_indices = torch.stack([torch.randperm(7, generator=g) for _ in range(2)])
    x = torch.randint(-8, 8, (5, 3), generator=g).float() / 4
    index = torch.tensor([[0, 4, 4], [4, 1, 0], [2, 4, 0], [4, 3, 3]])
    src = torch.randint(-8, 8, (4, 3), generator=g).float() / 4

    def scatter(m: torch.Tensor, i: torch.Tensor, a: torch.Tensor, j: torch.Tensor, b: torch.Tensor) -> Any:
        return m.scatter(1, i, m), a.scatter(0, j, b)

    backend = Capture(qnn_session, FAST)
    out = compile_and_run(scatter, (sorted_mask, sorted_indices, x, index, src), backend)
    assert backend.exported[0].exporter == "fast"
    mask, values = scatter(sorted_mask, sorted_indices, x, index, src)
    assert out[0].dtype == torch.bool and torch.equal(out[0], mask), (out[0], mask)
    assert float((out[1] - values).abs().max()) <= 1e-3, (out[1], values)


def test_gathering_by_an_argmax_runs_on_htp_without_a_clamp() -> None:
    """A router's ``scores.gather(-1, max(scores, -1, keepdim=True)[1])`` and a gather by ``argmax`` take the
    positions as they are (no Max(i, 0) clamp: qnnx-opcheck knows ArgMax results non-negative) and run wholly on the HTP
    simulator with eager's values; other runtime indices keep their clamp."""
    scores = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))

    def pick(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return s.gather(-1, torch.max(s, -1, keepdim=True)[1]), s.gather(0, s.argmin(0, keepdim=True))

    backend = Capture(qnn_session, FAST)
    out = compile_and_run(pick, (scores,), backend)
    (exported,) = backend.exported
    assert "Max" not in {n.op_type for n in exported.model.graph.node}
    for got, want in zip(out, pick(scores), strict=True):
        assert rel_err(got, want) <= 2e-3
    clamped = Capture(cpu_session, FAST)
    compile_and_run(lambda s, i: s.gather(1, i), (scores, torch.tensor([[0], [5], [2]])), clamped)
    assert "Max" in {n.op_type for n in clamped.exported[0].model.graph.node}
