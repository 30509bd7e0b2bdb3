"""The translator's ``linspace`` and ``logspace`` whose start or end is a runtime tensor (``_ops_ranges``): the
points eager PyTorch computes on the CPU, of float or integer 0-d endpoints and Python numbers, for any step count;
and on the HTP simulator, wholly on QNN within float16's rounding."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export.errors import ExportError

FAST = qe.ExportOptions(exporter="fast")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it."""
    with torch.no_grad():
        yield


_ENDPOINTS = st.one_of(
    st.integers(-20, 20).map(lambda v: torch.tensor(v)),
    st.floats(-20, 20, width=32).map(lambda v: torch.tensor(v)),
)


def _call(
    log: bool, start: torch.Tensor | float, end: torch.Tensor | float, steps: int, base: float
) -> Callable[..., torch.Tensor]:
    """The op as a function of its tensor endpoints only (a Python-number endpoint is bound in)."""

    def fn(*tensors: torch.Tensor) -> torch.Tensor:
        it = iter(tensors)
        s = next(it) if isinstance(start, torch.Tensor) else start
        e = next(it) if isinstance(end, torch.Tensor) else end
        return torch.logspace(s, e, steps, base=base) if log else torch.linspace(s, e, steps)

    return fn


@settings(max_examples=80, deadline=None)
@given(
    log=st.booleans(),
    start=_ENDPOINTS,
    end=_ENDPOINTS,
    python_end=st.sampled_from([None, "start", "end"]),
    steps=st.integers(1, 60),
    base=st.sampled_from([10.0, 2.0, 1.1, 0.5, 1.0]),
)
def test_points_equal_eager_on_the_cpu_ep(
    log: bool,
    start: torch.Tensor,
    end: torch.Tensor,
    python_end: str | None,
    steps: int,
    base: float,
) -> None:
    """Any float or integer 0-d endpoints, one of them possibly a Python number, and any step count: translated (no
    fallback), with eager's shape and dtype and eager's points (float32 rounding apart), both ends included, for
    points within float16's range."""
    s: torch.Tensor | float = start.item() if python_end == "start" else start
    e: torch.Tensor | float = end.item() if python_end == "end" else end
    fn = _call(log, s, e, steps, base)
    tensors = tuple(v for v in (s, e) if isinstance(v, torch.Tensor))
    ref = fn(*tensors)
    # An exponential's input is clipped where its output would pass float16's range (exp_input_floor): such
    # outputs are HTP's to refuse (the backend's range check), not values to compare.
    assume(bool((ref.abs() < 60000).all()))
    backend = Capture(cpu_session, FAST)
    got = compile_and_run(fn, tensors, backend)  # type: ignore[arg-type]  # a function of its tensors
    assert all(x.exporter == "fast" and x.fast_path_declined is None for x in backend.exported)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, rtol=2e-5 if log else 1e-6, atol=1e-5)


def test_an_integer_output_and_a_negative_base_are_declined() -> None:
    """An integer dtype (eager truncates a double-precision point) and a base <= 0 are left to another exporter."""
    end = torch.tensor(7)
    for fn, reason in (
        (lambda e: torch.linspace(0, e, 5, dtype=torch.int64), "output dtype torch.int64"),
        (lambda e: torch.logspace(0, e, 5, base=-2.0), "base -2.0"),
    ):
        cap = only(capture(fn, end)[0])
        with pytest.raises(ExportError, match=reason):
            qe.export(cap.gm, cap.example_inputs, options=FAST)


_ON_QNN: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "linspace, 50 points": (lambda s, e: torch.linspace(s, e, 50), (torch.tensor(-2.0), torch.tensor(50))),
    "linspace, 2 points": (lambda s, e: torch.linspace(s, e, 2), (torch.tensor(4.3), torch.tensor(4))),
    "linspace, 1 point": (lambda e: torch.linspace(3, e, 1), (torch.tensor(-3),)),
    "logspace, 4 points": (lambda s, e: torch.logspace(s, e, 4), (torch.tensor(0), torch.tensor(4.3))),
    "logspace, 2 points": (lambda s, e: torch.logspace(s, e, 2, base=5.0), (torch.tensor(4.3), torch.tensor(4))),
    "logspace, 1 point": (lambda s: torch.logspace(s, 2, 1, base=3.0), (torch.tensor(2.5),)),
    "logspace, falling": (lambda e: torch.logspace(2, e, 33, base=1.1), (torch.tensor(-3),)),
}


@pytest.mark.parametrize("case", list(_ON_QNN))
def test_points_run_wholly_on_the_htp_simulator(case: str) -> None:
    """linspace and logspace with tensor endpoints run wholly on the HTP simulator (no CPU fallback), within
    float16's rounding of eager's points: half a percent of the largest for logspace, whose ``ln(base) * point``
    float16 rounds (with ``Pow`` in its place, 2 points gave an element of 0 on the simulator)."""
    fn, args = _ON_QNN[case]
    backend = Capture(qnn_session, FAST)
    got = compile_and_run(fn, args, backend)  # type: ignore[arg-type]  # a function of its tensors
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
    ref = fn(*args)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert float((got - ref).abs().max()) <= 6e-3 * float(ref.abs().max())
