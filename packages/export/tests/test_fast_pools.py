"""The translator's max pools written window element by window element (``_pool_windows``): PyTorch's indices
(``return_indices=True``), which ONNX's MaxPool numbers otherwise and QNN does not compute, and the maxima of the
pools HTP has no MaxPool for (three spatial dims, dilation above 1), batched or not; and the unpooling of such
indices (``max_unpool1d/2d/3d``), which an encoder-decoder takes in the same graph.

On the CPU EP they equal eager exactly for any window (padding, stride, dilation, ceil_mode, ties); on the HTP
simulator they run wholly on QNN, the maxima within float16's rounding and the indices those of eager PyTorch on the
float16-rounded input (HTP compares float16 values)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from export_capture import capture, only
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export.errors import ExportError

FAST = qe.ExportOptions(exporter="fast")
_POOLS: dict[int, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    1: F.max_pool1d,  # type: ignore[dict-item]  # with return_indices=True it returns both
    2: F.max_pool2d,  # type: ignore[dict-item]
    3: F.max_pool3d,  # type: ignore[dict-item]
}


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it."""
    with torch.no_grad():
        yield


@st.composite
def _windows(draw: st.DrawFn) -> dict[str, object]:
    """A max pool PyTorch accepts: 1-3 spatial dims, batched or not, any kernel, stride, dilation, padding up to half
    the kernel and ceil_mode, over an input at least one (dilated) window wide."""
    dims = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3), min_size=dims, max_size=dims))
    dilation = draw(st.lists(st.integers(1, 2), min_size=dims, max_size=dims))
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    reach = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]
    size = [draw(st.integers(max(1, r - 2 * p), r + 5)) for r, p in zip(reach, padding, strict=True)]
    batched = draw(st.booleans())
    lead = [draw(st.integers(1, 2)), draw(st.integers(1, 3))] if batched else [draw(st.integers(1, 3))]
    return {
        "shape": (*lead, *size),
        "dims": dims,
        "kernel_size": kernel,
        "stride": draw(st.lists(st.integers(1, 3), min_size=dims, max_size=dims)),
        "padding": padding,
        "dilation": dilation,
        "ceil_mode": draw(st.booleans()),
    }


def _pool_fn(window: dict[str, object]) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    pool = _POOLS[int(window["dims"])]  # type: ignore[call-overload]  # an int
    kwargs = {k: window[k] for k in ("kernel_size", "stride", "padding", "dilation", "ceil_mode")}
    return lambda x: pool(x, return_indices=True, **kwargs)


@settings(max_examples=60, deadline=None)
@given(window=_windows(), seed=st.integers(0, 2**16), ties=st.booleans())
def test_max_pool_with_indices_equals_eager_on_the_cpu_ep(window: dict[str, object], seed: int, ties: bool) -> None:
    """Any max pool with its indices is translated (no fallback) and equals eager exactly on the CPU EP: the maxima,
    and the indices (each window's first maximum, also among tied values), batched or not; the indices of a batched
    3-D pool (rank 5) come back through a host view. A dilated window wholly in the padding is declined instead."""
    shape = window["shape"]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))  # type: ignore[call-overload]  # a tuple
    if ties:  # few distinct values: windows with tied maxima, and all-negative windows next to the padding
        x = x.round() - 1
    fn = _pool_fn(window)
    try:
        ref = fn(x)
    except RuntimeError:  # the output would be empty, or a window would fall wholly in the padding
        assume(False)
    if bool(ref[0].isinf().any()):  # a dilated window without an input element (-inf in eager) is declined
        cap = only(capture(fn, x)[0])
        with pytest.raises(ExportError, match="wholly in the padding"):
            qe.export(cap.gm, cap.example_inputs, options=FAST)
        return
    backend = Capture(cpu_session, FAST)
    values, indices = compile_and_run(fn, (x,), backend)  # type: ignore[arg-type]  # a function of one tensor
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    assert torch.equal(values, ref[0])
    assert indices.dtype == torch.int64 and torch.equal(indices, ref[1])


_UNPOOLS: dict[int, Callable[..., torch.Tensor]] = {1: F.max_unpool1d, 2: F.max_unpool2d, 3: F.max_unpool3d}


@settings(max_examples=40, deadline=None)
@given(window=_windows(), seed=st.integers(0, 2**16))
def test_max_unpool_equals_eager_on_the_cpu_ep(window: dict[str, object], seed: int) -> None:
    """max_unpool1d/2d/3d of a pool's values and indices (runtime inputs of the graph, of rank 5 too) is translated
    and equals eager exactly on the CPU EP, into the pool's input size; positions that overlapping windows share
    hold one value in both."""
    x = torch.randn(window["shape"], generator=torch.Generator().manual_seed(seed))  # type: ignore[call-overload]  # a tuple
    try:
        values, indices = _pool_fn(window)(x)
    except RuntimeError:  # the output would be empty, or a window would fall wholly in the padding
        assume(False)
    assume(not bool(values.isinf().any()))
    dims = int(window["dims"])  # type: ignore[call-overload]  # an int
    size = list(x.shape[-dims:])

    def unpool(v: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return _UNPOOLS[dims](v, i, window["kernel_size"], window["stride"], window["padding"], output_size=size)

    try:
        ref = unpool(values * 2, indices)
    except (ValueError, RuntimeError):  # an output size the unpool's window cannot reach (it knows no dilation)
        assume(False)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(unpool, (values * 2, indices), backend)  # type: ignore[arg-type]  # a function of two tensors
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    assert torch.equal(out, ref)


def test_a_max_pool_without_its_indices_keeps_one_maxpool_node() -> None:
    """A 2-D pool without dilation whose indices are unused stays one ONNX MaxPool (no window elements)."""
    cap = only(capture(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[0], torch.randn(1, 2, 9, 9))[0])
    exported = qe.export(cap.gm, cap.example_inputs, options=FAST)
    ops = {n.op_type for n in exported.model.graph.node}
    assert "MaxPool" in ops and "Slice" not in ops and "Equal" not in ops


_ON_QNN: dict[str, tuple[Callable[[torch.Tensor], object], tuple[int, ...]]] = {
    "2d indices": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 11, 9)),
    "2d indices, dilated, ceil": (
        lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True, return_indices=True),
        (1, 2, 12, 13),
    ),
    "1d indices, unbatched": (lambda x: F.max_pool1d(x, 2, 1, 0, dilation=2, return_indices=True), (3, 11)),
    "3d indices, unbatched": (lambda x: F.max_pool3d(x, 2, 1, 1, ceil_mode=True, return_indices=True), (2, 5, 6, 7)),
    "3d values": (lambda x: F.max_pool3d(x, 3, 2, 1), (1, 2, 6, 6, 6)),
    "unpooled": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2) * 2, (1, 3, 6, 8)),
    "3d unpooled, unbatched": (lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2), (2, 4, 4, 6)),
    "3d indices, batched": (lambda x: F.max_pool3d(x, 2, 2, 1, return_indices=True), (2, 3, 4, 5, 6)),
    "3d unpooled, batched, indices returned": (
        lambda x: (lambda v, i: (F.max_unpool3d(v, i, 2, output_size=x.shape[-3:]), i))(
            *F.max_pool3d(x, 2, return_indices=True)
        ),
        (2, 2, 4, 4, 5),
    ),
}


@pytest.mark.parametrize("case", list(_ON_QNN))
def test_max_pools_run_wholly_on_the_htp_simulator(case: str) -> None:
    """Max pools with their indices, dilated ones and 3-D ones run wholly on the HTP simulator (no CPU fallback):
    the maxima within float16's rounding of eager's, the indices equal to eager's on the float16-rounded input."""
    fn, shape = _ON_QNN[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    backend = Capture(qnn_session, FAST)
    got = compile_and_run(fn, (x,), backend)  # type: ignore[arg-type]  # a function of one tensor
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
    got = got if isinstance(got, tuple) else (got,)
    ref = fn(x)
    ref = ref if isinstance(ref, tuple) else (ref,)
    rounded = fn(x.half().float())
    rounded = rounded if isinstance(rounded, tuple) else (rounded,)
    for g, r, r16 in zip(got, ref, rounded, strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype
        if r.dtype == torch.int64:
            assert torch.equal(g, r16)
        else:
            assert float((g - r).abs().max()) <= 1e-3 * float(r.abs().max())
