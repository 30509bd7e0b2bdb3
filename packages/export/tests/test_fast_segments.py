"""The translator's ``segment_reduce`` (``_ops_segment``): sum, mean, max and min over consecutive segments whose
lengths or offsets are constants or runtime inputs, along any axis, with and without ``initial``: eager's values on
the CPU EP (NaN and infinities of empty segments included), and wholly on QNN on the HTP simulator."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export.errors import ExportError

FAST = qe.ExportOptions(exporter="fast")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it."""
    with torch.no_grad():
        yield


def _same(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Eager's shape and dtype, NaN and infinities where eager has them, the finite values within ``tol`` of the
    largest."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.isinf(), ref.isinf())
    finite = ref.isfinite()
    assert torch.equal(got[ref.isinf()], ref[ref.isinf()])
    if finite.any():
        scale = float(ref[finite].abs().max()) + 1
        assert float((got[finite] - ref[finite]).abs().max()) <= tol * scale


@st.composite
def _segments(draw: st.DrawFn) -> dict[str, object]:
    """Data of rank 1-3, an axis, and per leading index the lengths of segments that cover the axis (some empty)."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    axis = draw(st.integers(0, len(shape) - 1))
    segments = draw(st.integers(1, 5))
    lead = shape[:axis]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    rows = []
    for _ in range(int(torch.tensor(lead).prod()) if lead else 1):
        cuts = torch.randint(0, shape[axis] + 1, (segments - 1,), generator=g).sort().values
        bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([shape[axis]])])
        rows.append(bounds.diff())
    lengths = torch.stack(rows).reshape(*lead, segments)
    return {"data": torch.randn(shape, generator=g), "axis": axis, "lengths": lengths}


@settings(max_examples=80, deadline=None)
@given(
    case=_segments(),
    reduce=st.sampled_from(["sum", "mean", "max", "min"]),
    initial=st.sampled_from([None, 0.5, -2.0]),
    runtime=st.booleans(),
    by_offsets=st.booleans(),
)
def test_segments_equal_eager_on_the_cpu_ep(
    case: dict[str, object], reduce: str, initial: float | None, runtime: bool, by_offsets: bool
) -> None:
    """Any data, axis and covering segments (empty ones too), by lengths or offsets, given as runtime inputs or as
    constants: translated (no fallback) and eager's values, also where an empty segment gives NaN or an infinity."""
    data, axis, lengths = case["data"], case["axis"], case["lengths"]
    assert isinstance(data, torch.Tensor) and isinstance(lengths, torch.Tensor) and isinstance(axis, int)
    bounds = torch.nn.functional.pad(lengths.cumsum(-1), (1, 0)) if by_offsets else lengths
    key = "offsets" if by_offsets else "lengths"

    def given_bounds(d: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(d, reduce, axis=axis, initial=initial, **{key: b})

    def fixed_bounds(d: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(d, reduce, axis=axis, initial=initial, **{key: bounds})

    fn: Callable[..., torch.Tensor] = given_bounds if runtime else fixed_bounds
    args = (data, bounds) if runtime else (data,)
    ref = fn(*args)
    backend = Capture(cpu_session, FAST)
    got = compile_and_run(fn, args, backend)  # type: ignore[arg-type]  # a function of its tensors
    assert all(x.exporter == "fast" and x.fast_path_declined is None for x in backend.exported)
    _same(got, ref, 1e-5)


def test_a_product_is_declined() -> None:
    """``prod`` is left to another exporter (a float16 product can saturate part-way on HTP)."""
    cap = only(capture(lambda d: torch.segment_reduce(d, "prod", lengths=torch.tensor([1, 2])), torch.randn(3))[0])
    with pytest.raises(ExportError, match="reduce='prod'"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


_LENGTHS = torch.tensor([[2, 0, 3, 0], [0, 1, 2, 2], [3, 0, 2, 0], [1, 1, 1, 2], [0, 1, 2, 2]])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_segments_run_wholly_on_the_htp_simulator(reduce: str) -> None:
    """Segments along axis 1 with runtime lengths (empty ones, ``initial`` given) and along axis 0 by runtime
    offsets run wholly on the HTP simulator (no CPU fallback), within float16's rounding of eager."""
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = [
        (
            lambda d, n: torch.segment_reduce(d, reduce, lengths=n, axis=1, initial=1.0),
            (torch.randn(5, 5, 3, generator=g), _LENGTHS),
        ),
        (
            lambda d, o: torch.segment_reduce(d, reduce, offsets=o, axis=0),
            (torch.randn(10, 6, generator=g), torch.tensor([0, 1, 3, 4, 9, 10])),
        ),
    ]
    for fn, args in cases:
        backend = Capture(qnn_session, FAST)
        got = compile_and_run(fn, args, backend)  # type: ignore[arg-type]  # a function of its tensors
        assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
        _same(got, fn(*args), 3e-3)
