"""Fourier transforms (torch.fft, torch.stft) carried as MatMuls with constant matrices on real pairs, and complex
graph outputs returned as their real pairs: the rewritten graph gives eager's values, the export's signature
rebuilds the complex tensor, and what the rewrite cannot prove stays in PyTorch with a reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import cpu_session, run_exported
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export._complex import COMPLEX_OUTPUTS, as_real_pairs, refusal
from qnnx_export._dft import MAX_DFT_LENGTH, DftStep, dft_matrix, frame_positions
from qnnx_testkit.strategies import seeds


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode for every test (grad-enabled graphs are refused by design)."""
    with torch.no_grad():
        yield


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal up to float32 rounding of a sum over the transform's length (PyTorch's FFT reassociates)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    g = torch.view_as_real(got.resolve_conj()) if got.is_complex() else got
    r = torch.view_as_real(ref.resolve_conj()) if ref.is_complex() else ref
    torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * max(1.0, float(r.abs().max())))


def _rewritten(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, Any]:
    """Capture ``fn``, rewrite it to real pairs; return (its outputs, with complex outputs rebuilt, eager's)."""
    torch._dynamo.reset()
    cap = only(capture(fn, *args)[0])
    assert cap.analysis.exportable, cap.analysis.problems
    gm, inputs = as_real_pairs(cap.gm, cap.example_inputs)
    outs = list(gm(*inputs))
    for k in gm.meta[COMPLEX_OUTPUTS]:
        outs[k] = torch.view_as_complex(outs[k].contiguous())
    return outs, fn(*args)


_ONE_D = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
_N_D = ["fft2", "fftn", "ifft2", "ifftn", "rfft2", "rfftn", "irfft2", "irfftn", "hfft2", "hfftn", "ihfft2", "ihfftn"]
_REAL_ONLY = {"rfft", "ihfft", "rfft2", "rfftn", "ihfft2", "ihfftn"}


@st.composite
def _transforms(draw: st.DrawFn) -> tuple[str, tuple[int, ...], dict[str, Any], bool, int]:
    """A transform, an input shape, its arguments (n or s, dim, norm), whether its input is complex, and a seed."""
    name = draw(st.sampled_from(_ONE_D + _N_D))
    rank = draw(st.integers(2 if name.endswith("2") else 1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    kwargs: dict[str, Any] = {"norm": draw(st.sampled_from([None, "backward", "ortho", "forward"]))}
    if name in _ONE_D:
        kwargs["dim"] = draw(st.integers(-rank, rank - 1))
        if draw(st.booleans()):
            kwargs["n"] = draw(st.integers(1, 8))
    else:
        count = 2 if name.endswith("2") else draw(st.integers(1, rank))
        dims = draw(st.permutations(range(rank)))[:count]
        if not name.endswith("2") or draw(st.booleans()):
            kwargs["dim"] = tuple(dims)
        if draw(st.booleans()):
            kwargs["s"] = tuple(draw(st.integers(1, 8)) for _ in range(count))
            if "dim" not in kwargs and name.endswith("2"):
                kwargs["dim"] = (-2, -1)
    complex_in = name not in _REAL_ONLY and draw(st.booleans())
    return name, shape, kwargs, complex_in, draw(seeds())


@settings(max_examples=120, deadline=None)
@given(_transforms())
def test_transforms_equal_eager(case: tuple[str, tuple[int, ...], dict[str, Any], bool, int]) -> None:
    """Every torch.fft transform, over ranks 1-3, every norm, cropped or padded lengths and any axes, of a real or
    a complex value, gives eager's values once rewritten to MatMuls on real pairs (its complex output rebuilt)."""
    name, shape, kwargs, complex_in, seed = case
    g = torch.Generator().manual_seed(seed)
    fn_ = getattr(torch.fft, name)
    x = torch.randn(*shape, 2, generator=g)
    try:
        ref = fn_(torch.view_as_complex(x) if complex_in else x[..., 0], **kwargs)
    except RuntimeError:
        return  # PyTorch refuses the arguments (an output length below 1...)
    if complex_in:

        def fn(x: torch.Tensor) -> torch.Tensor:
            return fn_(torch.view_as_complex(x), **kwargs)
    else:

        def fn(x: torch.Tensor) -> torch.Tensor:
            return fn_(x[..., 0], **kwargs)

    (got,), again = _rewritten(fn, x)
    _close(got, ref)
    _close(again, ref)


def test_dft_matrix_is_the_transform() -> None:
    """The constant matrix of a length-n rfft times a signal is PyTorch's rfft of it, in every norm mode."""
    x = torch.randn(3, 10, dtype=torch.float64)
    for norm in (None, "backward", "ortho", "forward"):
        matrix = dft_matrix(DftStep("rfft", 0, 12, norm), 10, complex_in=False).double()
        got = torch.view_as_complex((x @ matrix).reshape(3, 7, 2).contiguous())
        torch.testing.assert_close(got, torch.fft.rfft(x, n=12, norm=norm), rtol=1e-6, atol=1e-6)


def test_long_transform_is_refused_with_its_length() -> None:
    """A transform longer than MAX_DFT_LENGTH keeps the graph in PyTorch, the reason naming the length."""
    n = MAX_DFT_LENGTH + 1
    cap = only(capture(lambda x: torch.view_as_real(torch.fft.rfft(x)), torch.randn(2, n))[0])
    assert [p.kind for p in cap.analysis.problems] == ["unsupported_value"]
    assert str(n) in cap.analysis.problems[0].detail
    assert refusal(cap.gm, cap.example_inputs) is not None


def test_transform_of_the_middle_axis_with_a_long_block() -> None:
    """A transform whose trailing block is longer than one matrix allows is written axis by axis (Transposes of
    rank 3 around each product) and still gives eager's values."""
    x = torch.randn(3, 40, 60)
    (got,), ref = _rewritten(lambda x: torch.fft.fft2(x, norm="ortho"), x)
    _close(got, ref)
    (got,), ref = _rewritten(lambda x: torch.fft.irfft(torch.fft.fft(x, dim=1), dim=0, n=6), x)
    _close(got, ref)


@pytest.mark.parametrize(
    ("kwargs", "shape"),
    [
        ({"n_fft": 10}, (100,)),
        ({"n_fft": 16, "hop_length": 4, "win_length": 12, "normalized": True}, (2, 100)),
        ({"n_fft": 7, "center": False}, (10,)),
        ({"n_fft": 8, "pad_mode": "constant", "onesided": False}, (3, 50)),
        ({"n_fft": 8, "pad_mode": "replicate", "hop_length": 3}, (2, 20)),
        ({"n_fft": 8, "pad_mode": "circular", "win_length": 5}, (1, 17)),
    ],
    ids=["default", "window-normalized", "no-centre", "constant-twosided", "replicate", "circular-short-window"],
)
@pytest.mark.parametrize("window", [False, True], ids=["no-window", "hann"])
def test_stft_equals_eager(kwargs: dict[str, Any], shape: tuple[int, ...], window: bool) -> None:
    """torch.stft (return_complex=True) over pad modes, hops, short windows, one- and two-sided spectra equals
    eager once rewritten (frames as one Gather, the window a product, the spectrum one MatMul)."""
    args = dict(kwargs)
    if window:
        args["window"] = torch.hann_window(args.get("win_length", args["n_fft"]))

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.stft(x, return_complex=True, **args)

    (got,), ref = _rewritten(fn, torch.randn(*shape, generator=torch.Generator().manual_seed(4)))
    _close(got, ref)


def test_frame_positions_match_padding() -> None:
    """The frame positions with reflect padding folded in read the signal as F.pad's reflection does."""
    signal = torch.arange(9.0)
    padded = torch.nn.functional.pad(signal.view(1, 1, -1), (3, 3), mode="reflect").view(-1)
    positions = frame_positions(9, 6, 2, 3, "reflect")
    assert positions is not None
    frames = padded.unfold(0, 6, 2)
    assert torch.equal(signal[torch.tensor(positions)], frames)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.complex(x, x * 2),
        lambda x: torch.polar(x.abs(), x),
        lambda x: x.cfloat(),
        lambda x: x.to(torch.complex64) * (1 - 2j),
        lambda x: (torch.fft.rfft(x), x.sum()),
    ],
    ids=["complex", "polar", "cfloat", "to-complex", "rfft-and-real"],
)
def test_complex_output_comes_back_complex(fn: Callable[[torch.Tensor], Any]) -> None:
    """A graph that returns a complex64 value exports its real pair; the signature rebuilds the complex tensor, so
    ONNX Runtime's CPU EP gives eager's dtype and values."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    cap = only(capture(fn, x)[0])
    assert cap.analysis.exportable, cap.analysis.problems
    exported = qe.export(cap.gm, cap.example_inputs)
    assert "complex64" in [s.dtype for s in exported.signature.outputs]
    assert qe.GraphSignature.from_dict(exported.signature.to_dict()) == exported.signature
    got = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    ref = fn(x)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for g, r in zip(got, ref, strict=True):
        _close(g, r)


def test_complex128_output_is_refused() -> None:
    """A complex128 graph output stays in PyTorch (only complex64 comes back as a float32 pair)."""
    cap = only(capture(lambda x: torch.complex(x, x), torch.randn(3, dtype=torch.float64))[0])
    assert [p.kind for p in cap.analysis.problems] == ["unsupported_value"]
    assert "complex64 only" in cap.analysis.problems[0].detail


def test_view_as_complex_of_an_input_comes_back_complex() -> None:
    """view_as_complex of a graph input, returned: the model returns a copy of the pair, rebuilt as complex (the
    input itself, which the caller would get back as it is, is real)."""
    x = torch.randn(5, 2)
    cap = only(capture(torch.view_as_complex, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    assert [s.kind for s in exported.signature.outputs] == ["onnx"]
    (got,) = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    _close(got, torch.view_as_complex(x))
