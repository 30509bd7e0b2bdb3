"""The HTP facts qnnx-export's passes and qnnx-opcheck's rules both read: AveragePool windows HTP averages wrongly,
heads merged before a MatMul, and the ops no constant folding evaluates."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

import qnnx_clikit as clikit

_SIDE = st.integers(1, 12)


@st.composite
def _pool(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int], list[int], list[int]]:
    """A static [N, C, *spatial] shape (rank 3-5) with a kernel that fits, strides and explicit pads."""
    spatial = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(2, 16), min_size=spatial, max_size=spatial))
    kernel = [draw(st.integers(1, size)) for size in sizes]
    strides = draw(st.lists(st.integers(1, 4), min_size=spatial, max_size=spatial))
    pads = [draw(st.integers(0, k)) for k in kernel] + [draw(st.integers(0, k)) for k in kernel]
    return (1, 2, *sizes), kernel, strides, pads


@given(_pool())
def test_a_rank_5_pool_padded_at_the_start_of_its_first_axis_alone_is_averaged_wrongly(pool: tuple) -> None:
    """Property: at rank 5 without count_include_pad or ceil_mode, pads within half the kernel are a defect exactly
    when the first spatial axis has a begin pad and no other axis has any; below rank 5 such pads are fine."""
    shape, kernel, strides, pads = pool
    spatial = len(kernel)
    pads = [min(p, (kernel[i % spatial] - 1) // 2) for i, p in enumerate(pads)]  # below half the kernel
    expected = spatial == 3 and pads[0] > 0 and not any(pads[1:3] + pads[4:6])
    assert clikit.htp_averages_wrongly(shape, kernel, strides, pads, ceil=False, count_pad=False) == expected


@given(_pool(), st.booleans())
def test_a_pool_without_padding_ceil_or_count_pad_is_averaged_right(pool: tuple, count_pad: bool) -> None:
    """Property: no pads and no ceil_mode is a pool HTP averages right, below rank 5 with or without
    count_include_pad (there is nothing to count)."""
    shape, kernel, strides, pads = pool
    zeros = [0] * len(pads)
    wrong = clikit.htp_averages_wrongly(shape, kernel, strides, zeros, ceil=False, count_pad=count_pad)
    assert wrong == (count_pad and len(kernel) >= 3)


@given(_pool(), st.booleans())
def test_count_include_pad_with_any_pad_is_averaged_wrongly(pool: tuple, ceil: bool) -> None:
    """Property: count_include_pad with a nonzero pad is always a defect, whatever the rest."""
    shape, kernel, strides, pads = pool
    assert clikit.htp_averages_wrongly(shape, kernel, strides, pads, ceil=ceil, count_pad=True) == (
        any(pads) or len(kernel) >= 3
    )


@given(_pool())
def test_ceil_mode_is_a_defect_exactly_when_a_window_hangs_over_the_end(pool: tuple) -> None:
    """Property: without pads, ceil_mode is a defect exactly when some axis's windows do not tile it (the last
    window would hang over the end)."""
    shape, kernel, strides, _ = pool
    zeros = [0] * (2 * len(kernel))
    overhang = any((shape[i + 2] - k) % s for i, (k, s) in enumerate(zip(kernel, strides, strict=True)))
    assert clikit.htp_averages_wrongly(shape, kernel, strides, zeros, ceil=True, count_pad=False) == overhang


def test_efficientnet_pool_is_averaged_wrongly() -> None:
    """AvgPool2d(3, 2, padding=1, ceil_mode=True) on 16x16 (EfficientNet-style): the last window hangs over."""
    assert clikit.htp_averages_wrongly((2, 3, 16, 16), [3, 3], [2, 2], [1, 1, 1, 1], ceil=True, count_pad=False)
    assert not clikit.htp_averages_wrongly((2, 3, 16, 16), [3, 3], [2, 2], [1, 1, 1, 1], ceil=False, count_pad=False)


def test_a_pad_of_half_the_kernel_is_averaged_wrongly() -> None:
    """A pad of half the kernel or more is a defect even without ceil_mode and count_include_pad."""
    assert clikit.htp_averages_wrongly((1, 1, 8), [2], [1], [1, 0], ceil=False, count_pad=False)
    assert not clikit.htp_averages_wrongly((1, 1, 8), [3], [1], [1, 0], ceil=False, count_pad=False)


_PADS = st.integers(1, 5).flatmap(
    lambda rank: st.tuples(
        st.lists(st.integers(0, 3), min_size=rank, max_size=rank),
        st.lists(st.integers(0, 3), min_size=rank, max_size=rank),
    )
)


@given(_PADS, st.booleans())
def test_a_pad_is_a_defect_exactly_when_it_pads_the_end_of_the_last_axis(pads: tuple, half: bool) -> None:
    """Property: below rank 5 (and at rank 5 in float32) a constant Pad is named exactly when it pads the end of the
    last axis, whatever it does to the others; begin pads alone are not."""
    begin, end = pads
    if half and len(end) >= 5:
        return
    expected = end[-1] > 0
    assert clikit.htp_pads_wrongly(begin, end, half=half) == expected
    assert not clikit.htp_pads_wrongly(end, [0] * len(end), half=half)  # begin pads only


@given(_PADS)
def test_every_float16_pad_of_rank_5_is_a_defect(pads: tuple) -> None:
    """Property: at rank 5 in float16 any pad at all is named (HTP padded the second or third axis wrongly
    whatever the others); no pad is no defect."""
    begin, end = pads
    if len(end) == 5:
        assert clikit.htp_pads_wrongly(begin, end, half=True) == (any(begin) or any(end))


def test_the_measured_pads() -> None:
    """F.pad(x, (0, 3)) and F.pad(x, (0, 2, 0, 1)) are the class; (1, 0), (0, 0, 1, 2) and (0, 0, 0, 2) are not."""
    assert clikit.htp_pads_wrongly([0, 0], [0, 3])
    assert clikit.htp_pads_wrongly([0, 0], [1, 2])
    assert not clikit.htp_pads_wrongly([0, 1], [0, 0])
    assert not clikit.htp_pads_wrongly([1, 0], [2, 0])
    assert not clikit.htp_pads_wrongly([0, 0], [2, 0])


@given(a=st.integers(2, 8), d=st.integers(1, 16), ones=st.integers(0, 2))
def test_heads_merged_as_many_as_the_leading_dims_are_the_class(a: int, d: int, ones: int) -> None:
    """Property: [A, A, A, D] (A > 1) reshaped to [A, A, A*D], with any leading 1s, is the class."""
    assert clikit.merges_heads((a, a, a, d), (1,) * ones + (a, a, a * d))


@given(
    source=st.lists(_SIDE, min_size=1, max_size=5).map(tuple),
    merged=st.lists(_SIDE, min_size=1, max_size=5).map(tuple),
)
def test_the_class_keeps_the_elements_and_needs_three_equal_leading_dims(source: tuple, merged: tuple) -> None:
    """Property: anything in the class is a reshape of a rank-4 source with three equal dims > 1 and the same
    element count."""
    if clikit.merges_heads(source, merged):
        assert len(source) == 4 and source[0] == source[1] == source[2] > 1
        assert math.prod(source) == math.prod(merged)


def test_unknown_shapes_and_single_heads_are_not_the_class() -> None:
    """An unknown shape, or A = 1, is not the class."""
    assert not clikit.merges_heads(None, (2, 2, 8))
    assert not clikit.merges_heads((2, 2, 2, 4), None)
    assert not clikit.merges_heads((1, 1, 1, 4), (1, 1, 4))


def test_random_ops_are_the_onnx_sampling_ops() -> None:
    """The ops no constant folding evaluates are ONNX's sampling ops, and only those."""
    assert {"RandomNormal", "RandomUniform", "Multinomial", "Bernoulli"} <= clikit.RANDOM_OPS
    assert not clikit.RANDOM_OPS & {"Add", "Shape", "QuantizeLinear"}
