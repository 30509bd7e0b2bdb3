"""The translator on the HTP simulator: logic (logical_and/or/xor/not of any dtype, all, any), copysign, layer
norm's mean and rstd, adaptive max pooling, and the constant-position scatters (diagonal_scatter,
as_strided_scatter)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
from export_qnn_helpers import Capture, compile_and_run, qnn_session
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_testkit.strategies import seeds, shapes

FAST = qe.ExportOptions(exporter="fast")

_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "and": torch.logical_and,
    "or": torch.logical_or,
    "xor": torch.logical_xor,
}


def _values(kind: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Bools, small integers, or floats: a third exactly zero (some -0.0), the rest of magnitude 1e-6 to 1e4 with
    either sign (every one of them nonzero in float16), with a NaN and an infinity when there is room."""
    g = torch.Generator().manual_seed(seed)
    if kind == "bool":
        return torch.rand(shape, generator=g) > 0.5
    if kind == "int":
        return torch.randint(-3, 4, shape, generator=g)
    magnitude = 10 ** (torch.rand(shape, generator=g) * 10 - 6)
    sign = torch.where(torch.rand(shape, generator=g) > 0.5, 1.0, -1.0)
    x = torch.where(torch.rand(shape, generator=g) < 1 / 3, 0.0 * sign, magnitude * sign)
    flat = x.view(-1)
    if flat.numel() >= 4:
        flat[1], flat[2] = float("nan"), float("-inf")
    return x


def _on_qnn(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    """Run ``fn`` through the translator on the HTP simulator (CPU fallback off) and check it equals eager."""
    ref = fn(*inputs)
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(fn, inputs, backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast" and exported.fast_path_declined is None
    assert out.dtype == ref.dtype == torch.bool and out.shape == ref.shape
    assert torch.equal(out, ref)


def _close_on_qnn(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    """Run ``fn`` through the translator on the HTP simulator (CPU fallback off): eager's shape, and its values to
    float16 rounding (1e-3 of the output's scale)."""
    ref = fn(*inputs)
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(fn, inputs, backend)
    assert backend.exported[0].fast_path_declined is None and out.shape == ref.shape
    assert float((out - ref).abs().max()) <= 1e-3 * float(ref.abs().max())


@settings(max_examples=12, deadline=None)
@given(
    shape=shapes(max_rank=3, max_side=5),
    op=st.sampled_from([*_BINARY, "not"]),
    kinds=st.tuples(*(st.sampled_from(["float", "int", "bool"]),) * 2),
    broadcast=st.booleans(),
    seed=seeds(),
)
def test_logical_ops_of_any_dtype_equal_eager_on_qnn(
    shape: list[int], op: str, kinds: tuple[str, str], broadcast: bool, seed: int
) -> None:
    """logical_and/or/xor/not read floats (zeros, -0.0, NaN, infinities, values down to 1e-6), integers and bools
    as PyTorch does, with broadcasting, wholly on the HTP simulator and equal to eager."""
    a = _values(kinds[0], tuple(shape), seed)
    if op == "not":
        _on_qnn(torch.logical_not, a)
    else:
        b = _values(kinds[1], tuple(shape[1:]) if broadcast else tuple(shape), seed + 1)
        _on_qnn(_BINARY[op], a, b)


@settings(max_examples=12, deadline=None)
@given(
    shape=shapes(min_rank=1, max_rank=3, max_side=5),
    which=st.sampled_from(["all", "any"]),
    kind=st.sampled_from(["float", "int", "bool"]),
    dims=st.sampled_from(["none", "one", "many"]),
    keepdim=st.booleans(),
    data=st.data(),
    seed=seeds(),
)
def test_all_any_equal_eager_on_qnn(
    shape: list[int], which: str, kind: str, dims: str, keepdim: bool, data: st.DataObject, seed: int
) -> None:
    """all and any over every axis, one axis or several (keepdim or not) of floats, integers and bools run wholly
    on the HTP simulator and equal eager, rows of all zeros and all nonzeros included."""
    x = _values(kind, tuple(shape), seed)
    if data.draw(st.booleans()):  # a row that is all zero and one that is all nonzero along the first axis
        x[0] = 0
        if shape[0] > 1:
            x[-1] = 1
    rank = len(shape)
    reduce = getattr(torch, which)
    if dims == "none":
        _on_qnn(reduce, x)
    elif dims == "one":
        d = data.draw(st.integers(-rank, rank - 1))
        _on_qnn(lambda t: reduce(t, d, keepdim=keepdim), x)
    else:
        chosen = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        _on_qnn(lambda t: reduce(t, dim=tuple(chosen), keepdim=keepdim), x)


def test_bitwise_not_of_integers_stays_declined() -> None:
    """``~`` of an integer tensor is a bit operation, not a truth test: the translator declines it by name."""
    from export_capture import capture, only

    x = torch.arange(-3, 3)
    cap = only(capture(lambda t: ~t, x)[0])
    with pytest.raises(qe.errors.ExportError, match="bitwise_not"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


@settings(max_examples=10, deadline=None)
@given(
    shape=shapes(min_rank=1, max_rank=3, max_side=6),
    data=st.data(),
    scale=st.sampled_from([1e-3, 1.0, 1000.0]),
    eps=st.sampled_from([1e-5, 0.5]),
    affine=st.booleans(),
    seed=seeds(),
)
def test_layer_norm_with_mean_and_rstd_on_qnn(
    shape: list[int], data: st.DataObject, scale: float, eps: float, affine: bool, seed: int
) -> None:
    """native_layer_norm with its mean and rstd used runs wholly on the HTP simulator over the last 1-3 axes; the
    output, mean and rstd are each within fp16 tolerance of eager's scale, for inputs of 1e-3 (rstd near
    1/sqrt(eps)) up to 1000 (whose squares would overflow float16)."""
    n = data.draw(st.integers(1, len(shape)))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale + scale
    w, b = (torch.randn(shape[-n:], generator=g) for _ in range(2))

    def fn(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.native_layer_norm(a, shape[-n:], w if affine else None, b if affine else None, eps)

    refs = fn(x, w, b)
    backend = Capture(qnn_session, FAST)
    outs = compile_and_run(fn, (x, w, b), backend)
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
    for out, ref in zip(outs, refs, strict=True):
        assert out.shape == ref.shape
        assert float((out - ref).abs().max()) <= 5e-3 * float(ref.abs().max()) + 1e-6


def _signed(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values of either sign from 1e-9 (below float16's range) to 1e4, with 0.0 and -0.0 when there is room."""
    g = torch.Generator().manual_seed(seed)
    x = 10 ** (torch.rand(shape, generator=g) * 13 - 9) * torch.where(torch.rand(shape, generator=g) > 0.5, 1.0, -1.0)
    flat = x.view(-1)
    if flat.numel() >= 3:
        flat[0], flat[1] = 0.0, -0.0
    return x


@settings(max_examples=10, deadline=None)
@given(shape=shapes(max_rank=3, max_side=5), broadcast=st.booleans(), scalar=st.booleans(), seed=seeds())
def test_copysign_reads_the_sign_bit_on_qnn(shape: list[int], broadcast: bool, scalar: bool, seed: int) -> None:
    """copysign takes the sign of ``b`` (a tensor, broadcast or not, or a Python scalar) wholly on the HTP simulator:
    -0.0 and negative values below float16's range give a negative result, as in eager."""
    a = _signed(tuple(shape), seed).abs() + 0.5  # nonzero where b holds its zeros: the sign shows
    if scalar:
        ref, fn = torch.copysign(a, -0.0), lambda x: torch.copysign(x, -0.0)
        backend = Capture(qnn_session, FAST)
        out = compile_and_run(fn, (a,), backend)
    else:
        b = _signed(tuple(shape[1:]) if broadcast else tuple(shape), seed + 1)
        ref = torch.copysign(a, b)
        backend = Capture(qnn_session, FAST)
        out = compile_and_run(torch.copysign, (a, b), backend)
    assert backend.exported[0].fast_path_declined is None
    assert torch.equal(torch.signbit(out), torch.signbit(ref))
    assert float((out - ref).abs().max()) <= 1e-3 * float(ref.abs().max()) + 1e-7


@settings(max_examples=10, deadline=None)
@given(
    sides=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    out=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    batched=st.booleans(),
    seed=seeds(),
)
def test_adaptive_max_pool_values_on_qnn(
    sides: tuple[int, int], out: tuple[int, int], batched: bool, seed: int
) -> None:
    """adaptive_max_pool2d's values (indices unused), over even, uneven, overlapping and repeated windows, batched or
    not, run wholly on the HTP simulator and equal eager's to float16 rounding, all-negative windows included."""
    x = torch.randn((2, 3, *sides) if batched else (3, *sides), generator=torch.Generator().manual_seed(seed)) - 3

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_max_pool2d(t, out)

    _close_on_qnn(fn, x)


@settings(max_examples=6, deadline=None)
@given(dims=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(), seed=seeds())
def test_boolean_mask_put_on_qnn(dims: list[int], data: st.DataObject, seed: int) -> None:
    """``x[..., mask] = v`` with one boolean mask over any run of dims (after skipped ones or not) and values that
    broadcast to the dims after it (a scalar, a row, unit dims, a leading 1) runs wholly on the HTP simulator as a
    Where and equals eager: masks with no, some and every position set."""
    lead = data.draw(st.integers(0, len(dims) - 1))
    k = data.draw(st.integers(1, len(dims) - lead))
    rest = tuple(dims[lead + k :])
    v_shape = data.draw(st.sampled_from([(), rest[-1:], (1,) * len(rest), (1, *rest)]))
    fill = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    gen = torch.Generator().manual_seed(seed)
    x, v = torch.randn(*dims, generator=gen), torch.randn(v_shape, generator=gen) * 4
    mask = torch.rand(*dims[lead : lead + k], generator=gen) < fill
    skip = (slice(None),) * lead

    def fn(t: torch.Tensor, vals: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[(*skip, m)] = vals
        return t

    _close_on_qnn(fn, x, v, mask)


@settings(max_examples=6, deadline=None)
@given(shape=shapes(min_rank=1, max_rank=4, max_side=5), data=st.data(), seed=seeds())
def test_as_strided_in_order_on_qnn(shape: list[int], data: st.DataObject, seed: int) -> None:
    """as_strided views that read a contiguous tensor's elements in order (any sizes of its element count, any
    strides on dims of size 1) run wholly on the HTP simulator as a Reshape and equal eager."""
    numel = math.prod(shape)
    size = [numel]
    while data.draw(st.booleans()) and len(size) < 5:  # split a dim, or add a dim of size 1
        d = data.draw(st.integers(0, len(size) - 1))
        f = data.draw(st.sampled_from([k for k in range(1, size[d] + 1) if size[d] % k == 0]))
        size[d : d + 1] = [f, size[d] // f]
    stride, step = [0] * len(size), 1
    for d in reversed(range(len(size))):
        stride[d] = step if size[d] != 1 else data.draw(st.integers(1, 9))
        step *= size[d]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) + 3

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.as_strided(t * 2, size, stride) - 1

    _close_on_qnn(fn, x)


@settings(max_examples=10, deadline=None)
@given(shape=shapes(min_rank=2, max_rank=4, max_side=5), data=st.data(), seed=seeds())
def test_diagonal_scatter_on_qnn(shape: list[int], data: st.DataObject, seed: int) -> None:
    """diagonal_scatter over any two dims (either order) and any offset that leaves a diagonal runs wholly on the
    HTP simulator and writes exactly eager's elements (every other element kept)."""
    rank = len(shape)
    dim1, dim2 = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=2, max_size=2, unique_by=lambda d: d % rank))
    offset = data.draw(st.integers(-shape[dim1] + 1, shape[dim2] - 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    src = torch.randn(torch.diagonal(x, offset, dim1, dim2).shape, generator=g) * 100

    def fn(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.diagonal_scatter(a, s, offset, dim1, dim2)

    _close_on_qnn(fn, x, src)


@settings(max_examples=10, deadline=None)
@given(shape=shapes(min_rank=1, max_rank=3, max_side=6), data=st.data(), seed=seeds())
def test_as_strided_scatter_on_qnn(shape: list[int], data: st.DataObject, seed: int) -> None:
    """as_strided_scatter with a view of distinct positions (any sizes, strides and storage offset inside the
    tensor) runs wholly on the HTP simulator and writes eager's elements."""
    numel = math.prod(shape)
    rank = data.draw(st.integers(1, 2))
    size = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    stride = sorted(data.draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)), reverse=True)
    span = sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    positions = {sum(i * s for i, s in zip(idx, stride, strict=True)) for idx in itertools.product(*map(range, size))}
    assume(span < numel and len(positions) == math.prod(size))
    offset = data.draw(st.integers(0, numel - 1 - span))
    g = torch.Generator().manual_seed(seed)
    x, src = torch.randn(shape, generator=g), torch.randn(size, generator=g) * 100

    def fn(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(a, s, size, stride, offset)

    _close_on_qnn(fn, x, src)
