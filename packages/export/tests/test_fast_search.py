"""The translator's ``searchsorted`` and ``bucketize`` (``_ops_search``), written as counts of the row's elements
before each value: eager's indices exactly on the CPU EP (ties, NaN values, integers, sorters, one row or a row per
leading index), and wholly on QNN on the HTP simulator."""

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


@st.composite
def _searches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """A sorted sequence (one row, or one per leading index of the values) and values, of one dtype; a third of
    the values are elements of the sequence (ties), and float values may be NaN or infinite."""
    dtype = draw(st.sampled_from([torch.float32, torch.int64, torch.int32]))
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    width = draw(st.integers(1, 8))
    per_row = draw(st.booleans())
    value_shape = [*lead, draw(st.integers(1, 6))] if per_row or lead else [draw(st.integers(1, 6))]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    row_shape = [*lead, width] if per_row else [width]
    sequence = (torch.randn(row_shape, generator=g) * 4).round().to(dtype).sort(-1).values
    values = (torch.randn(value_shape, generator=g) * 4).to(dtype)
    if sequence.dim() == 1:
        picks = sequence[torch.randint(0, width, value_shape, generator=g)]
    else:
        picks = sequence.gather(-1, torch.randint(0, width, value_shape, generator=g))
    values = torch.where(torch.rand(value_shape, generator=g) < 0.33, picks, values)
    if dtype.is_floating_point and draw(st.booleans()):
        special = torch.tensor([float("nan"), float("inf"), -float("inf")])
        values = torch.where(torch.rand(value_shape, generator=g) < 0.2, special[values.long().abs() % 3], values)
    return sequence, values


@settings(max_examples=80, deadline=None)
@given(
    case=_searches(),
    side=st.sampled_from(["left", "right"]),
    out_int32=st.booleans(),
    sorted_by=st.booleans(),
    op=st.sampled_from(["searchsorted", "bucketize"]),
)
def test_indices_equal_eager_on_the_cpu_ep(
    case: tuple[torch.Tensor, torch.Tensor], side: str, out_int32: bool, sorted_by: bool, op: str
) -> None:
    """Any sorted sequence and values, with ties, NaN and infinite values: translated (no fallback), eager's dtype,
    shape and indices exactly, for either side, a sorter (the sequence shuffled and its argsort given) and bucketize
    (1-d boundaries)."""
    sequence, values = case
    right = side == "right"
    if op == "bucketize":
        if sequence.dim() != 1:
            sequence = sequence.flatten().sort().values

        def fn(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.bucketize(v, s, right=right, out_int32=out_int32)

    elif sorted_by:
        perm = torch.randperm(sequence.shape[-1], generator=torch.Generator().manual_seed(1))
        sequence = sequence[..., perm]
        sorter = torch.argsort(sequence, stable=True)  # a runtime input of the graph, as a caller passes one

        def fn(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.searchsorted(s, v, side=side, out_int32=out_int32, sorter=sorter)

    else:

        def fn(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.searchsorted(s, v, right=right, out_int32=out_int32)

    ref = fn(sequence, values)
    backend = Capture(cpu_session, FAST)
    got = compile_and_run(fn, (sequence, values), backend)  # type: ignore[arg-type]  # a function of two tensors
    assert all(x.exporter == "fast" and x.fast_path_declined is None for x in backend.exported)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


def test_a_search_beyond_the_pair_limit_is_declined() -> None:
    """A search that would compare more (value, element) pairs than one tensor holds is left to another exporter,
    with the count named."""
    sequence, values = torch.arange(4096.0), torch.randn(2048)
    cap = only(capture(lambda s, v: torch.searchsorted(s, v), sequence, values)[0])
    with pytest.raises(ExportError, match="8388608 pairs"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


_ON_QNN: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    "one row, left": (
        lambda s, v: torch.searchsorted(s, v),
        (torch.arange(-4.0, 4.0, 0.5), torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(3)) * 3),
    ),
    "a row per index, right, int32": (
        lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True),
        (torch.arange(24.0).reshape(2, 3, 4) / 4, torch.arange(30.0).reshape(2, 3, 5) / 5),
    ),
    "bucketize, ties": (
        lambda s, v: torch.bucketize(v, s),
        (torch.tensor([-1.0, 0.0, 0.5, 2.0]), torch.arange(-2.0, 3.0, 0.5)),
    ),
    "integers": (
        lambda s, v: torch.searchsorted(s, v, side="right"),
        (torch.tensor([1, 3, 3, 7, 100_000]), torch.tensor([[0, 3, 4], [7, 99_999, 100_000]])),
    ),
}


@pytest.mark.parametrize("case", list(_ON_QNN))
def test_indices_run_wholly_on_the_htp_simulator(case: str) -> None:
    """searchsorted and bucketize run wholly on the HTP simulator (no CPU fallback) with eager's indices, ties
    included (values that float16 holds exactly), and integers beyond float16's range."""
    fn, args = _ON_QNN[case]
    backend = Capture(qnn_session, FAST)
    got = compile_and_run(fn, args, backend)  # type: ignore[arg-type]  # a function of two tensors
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
    ref = fn(*args)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.int64, torch.bool]),
    density=st.floats(0.0, 1.0),
    size=st.integers(1, 70),
    fill_value=st.integers(-3, 3),
    seed=st.integers(0, 2**16),
)
def test_nonzero_static_equals_eager_on_the_cpu_ep(
    shape: list[int], dtype: torch.dtype, density: float, size: int, fill_value: int, seed: int
) -> None:
    """``nonzero_static`` of any tensor, with fewer or more nonzero elements than ``size`` (-0.0 among the zeros):
    translated (no fallback), eager's coordinates in row-major order, the rows past the last one ``fill_value``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < density)
    x = torch.where(torch.rand(shape, generator=g) < 0.1, torch.tensor(-0.0), x).to(dtype)

    def fn(v: torch.Tensor) -> torch.Tensor:
        return torch.nonzero_static(v, size=size, fill_value=fill_value)

    backend = Capture(cpu_session, FAST)
    got = compile_and_run(fn, (x,), backend)  # type: ignore[arg-type]  # a function of one tensor
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    ref = fn(x)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


def test_static_top_expert_tokens_run_wholly_on_the_htp_simulator() -> None:
    """The tokens routed to each expert, gathered with ``nonzero_static`` (a static-shape MoE dispatch): wholly on
    QNN on the simulator, with eager's token positions and padding."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(12, 4, generator=g)

    def dispatch(scores: torch.Tensor) -> torch.Tensor:
        chosen = scores.argmax(-1)
        return torch.stack([torch.nonzero_static(chosen == e, size=6, fill_value=-1)[:, 0] for e in range(4)])

    backend = Capture(qnn_session, FAST)
    got = compile_and_run(dispatch, (logits,), backend)  # type: ignore[arg-type]  # a function of one tensor
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
    assert torch.equal(got, dispatch(logits))
